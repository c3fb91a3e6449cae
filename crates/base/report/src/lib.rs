//! What the project's HTML reports share, so that lab, micro, disksim, tiers and seeder write
//! their pages one way:
//!
//! - [`esc`]: text into HTML or XML (content and attribute values);
//! - [`page`]: the page shell (doctype, charset, title, style, body), with [`BASE_STYLE`];
//! - [`svg`]: hand-written SVG figures (scales, ticks, axes, legends, line, scatter and bar
//!   charts) with no script and no library, so a report opens anywhere, offline;
//! - [`table`]: a table of rows, to HTML and to aligned text.
//!
//! It depends on nothing: it only builds strings.

pub mod svg;
pub mod table;

pub use table::{Align, Table};

/// Escapes text for HTML and XML, content and attribute values (quoted with `"` or `'`):
/// `& < > " '` become entities; control characters other than newline and tab, which XML
/// cannot carry, become spaces.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// The style most reports start from: a readable sans-serif page, tables with thin rules and
/// numbers right-aligned (the first column, a label, left), figures side by side.
pub const BASE_STYLE: &str = "body{font-family:sans-serif;margin:2em;max-width:1200px}\
table{border-collapse:collapse}td,th{padding:3px 6px;border-bottom:1px solid #ddd;text-align:right}\
th:first-child,td:first-child{text-align:left}figure{display:inline-block;margin:8px}\
figcaption{font-size:90%}pre{background:#f6f6f6;padding:6px;font-size:11px;overflow-x:auto}";

/// A complete HTML page: `<!doctype html>`, UTF-8, the `title` (escaped here), `style` (CSS,
/// as given) and `body` (HTML, as given), ending with a newline.
pub fn page(title: &str, style: &str, body: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\
<style>{style}</style></head><body>\n{body}</body></html>\n",
        esc(title)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_quotes_and_control_characters() {
        assert_eq!(
            esc(r#"<a href="x">Tom & 'Jerry'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;Tom &amp; &#39;Jerry&#39;&lt;/a&gt;"
        );
        assert_eq!(esc("a\u{1}b\nc\td µs"), "a b\nc\td µs");
        assert_eq!(esc(""), "");
    }

    #[test]
    fn a_page_is_well_formed_and_escapes_its_title() {
        let p = page("a < b", BASE_STYLE, "<p>hi</p>\n");
        assert!(p.starts_with("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"));
        assert!(p.contains("<title>a &lt; b</title>"));
        assert!(p.contains(&format!("<style>{BASE_STYLE}</style>")));
        assert!(p.ends_with("<body>\n<p>hi</p>\n</body></html>\n"));
        // The page parses as XML too (the figures' tests read reports that way).
        let xhtml = p
            .trim_start_matches("<!doctype html>")
            .replace("<meta charset=\"utf-8\">", "");
        roxmltree::Document::parse(&xhtml).unwrap();
    }
}
