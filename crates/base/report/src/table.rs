//! A table of rows written two ways from one value: HTML for a report page, aligned text
//! for a terminal or a closing note. A writer fills it once and prints whichever it needs,
//! so the two never disagree on columns.

use crate::esc;

/// How a column's cells line up: text on the left, numbers on the right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A header and rows of text cells.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    header: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column names: the first column (a label) left-aligned, the others
    /// (figures) right-aligned; [`Table::align`] changes that.
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Table {
        let header: Vec<String> = header.into_iter().map(Into::into).collect();
        let align = (0..header.len())
            .map(|i| if i == 0 { Align::Left } else { Align::Right })
            .collect();
        Table {
            header,
            align,
            rows: Vec::new(),
        }
    }

    /// Sets how column `col` lines up (a column past the header is ignored).
    pub fn align(mut self, col: usize, align: Align) -> Table {
        if let Some(a) = self.align.get_mut(col) {
            *a = align;
        }
        self
    }

    /// Adds a row. A short row is padded with empty cells; cells past the header are kept
    /// in neither output (a caller's mistake shows as a missing figure, not a shifted one).
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let mut row: Vec<String> = cells
            .into_iter()
            .map(Into::into)
            .take(self.header.len())
            .collect();
        row.resize(self.header.len(), String::new());
        self.rows.push(row);
    }

    pub fn rows(&self) -> &[Vec<String>] {
        &self.rows
    }

    /// `<table>`, a header row and one row per line, every cell escaped; numbers
    /// right-aligned by the page's style (see [`crate::BASE_STYLE`]).
    pub fn to_html(&self) -> String {
        let mut out = String::from("<table><tr>");
        for h in &self.header {
            out.push_str(&format!("<th>{}</th>", esc(h)));
        }
        out.push_str("</tr>\n");
        for row in &self.rows {
            out.push_str("<tr>");
            for c in row {
                out.push_str(&format!("<td>{}</td>", esc(c)));
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</table>\n");
        out
    }

    /// Aligned text: the header, then the rows, columns padded to their widest cell (in
    /// characters) and separated by `sep`; no trailing spaces; a newline after each line.
    pub fn to_text_with(&self, sep: &str) -> String {
        let width = |i: usize| {
            std::iter::once(&self.header[i])
                .chain(self.rows.iter().map(|r| &r[i]))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..self.header.len()).map(width).collect();
        let mut out = String::new();
        for line in std::iter::once(&self.header).chain(&self.rows) {
            let cells: Vec<String> = line
                .iter()
                .enumerate()
                .map(|(i, c)| match self.align[i] {
                    Align::Left => format!("{c:<w$}", w = widths[i]),
                    Align::Right => format!("{c:>w$}", w = widths[i]),
                })
                .collect();
            out.push_str(cells.join(sep).trim_end());
            out.push('\n');
        }
        out
    }

    /// [`Table::to_text_with`] with two spaces between columns.
    pub fn to_text(&self) -> String {
        self.to_text_with("  ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Table {
        let mut t = Table::new(["server", "req/s", "p99 ms"]);
        t.row(["epoll", "120000", "1.25"]);
        t.row(["io_uring <fixed>", "98000"]);
        t
    }

    #[test]
    fn text_lines_up_labels_left_and_figures_right() {
        assert_eq!(
            sample().to_text(),
            "server             req/s  p99 ms\n\
             epoll             120000    1.25\n\
             io_uring <fixed>   98000\n"
        );
        let t = sample().align(2, Align::Left).align(9, Align::Left);
        assert_eq!(
            t.to_text_with(" | ").lines().nth(1),
            Some("epoll            | 120000 | 1.25")
        );
    }

    #[test]
    fn html_escapes_cells_and_pads_short_rows() {
        let html = sample().to_html();
        assert!(html.starts_with("<table><tr><th>server</th><th>req/s</th><th>p99 ms</th></tr>\n"));
        assert!(html.contains("<tr><td>io_uring &lt;fixed&gt;</td><td>98000</td><td></td></tr>\n"));
        assert!(html.ends_with("</table>\n"));
        let mut t = Table::new(["a"]);
        t.row(["1", "dropped"]);
        assert_eq!(t.rows(), &[vec!["1".to_string()]]);
    }
}
