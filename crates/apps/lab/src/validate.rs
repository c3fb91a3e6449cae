//! Checks a written report: `results.json` has the required fields, every SVG in
//! `index.html` parses as XML and has something drawn. Used by the tests and
//! `iolab lab --check DIR`.

use std::path::Path;

use anyhow::{bail, Context};

use crate::results::{REQUIRED_POINT_FIELDS, SCHEMA};

/// The `<svg ...>...</svg>` fragments of an HTML page, in order (SVGs are not nested here).
pub fn extract_svgs(html: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(i) = rest.find("<svg") {
        let from = &rest[i..];
        match from.find("</svg>") {
            Some(j) => {
                out.push(&from[..j + 6]);
                rest = &from[j + 6..];
            }
            None => break,
        }
    }
    out
}

/// Reads `dir/results.json` back.
pub fn load_results(dir: &Path) -> anyhow::Result<crate::results::Results> {
    let p = dir.join("results.json");
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))
}

/// Counts of the drawn SVG marks in an HTML page or a DOM dump (each `<svg>` parsed as XML).
pub fn svg_marks(html: &str) -> anyhow::Result<ReportCheck> {
    let mut check = ReportCheck::default();
    for s in extract_svgs(html) {
        let doc = roxmltree::Document::parse(s).context("an SVG does not parse")?;
        check.svgs += 1;
        check.paths += doc.descendants().filter(|n| n.has_tag_name("path")).count();
        check.circles += doc
            .descendants()
            .filter(|n| n.has_tag_name("circle"))
            .count();
    }
    Ok(check)
}

/// What a valid report holds.
#[derive(Debug, Clone, Default)]
pub struct ReportCheck {
    pub points: usize,
    pub models: Vec<String>,
    pub svgs: usize,
    /// Drawn marks over all figures: paths, circles, rects with class "bar".
    pub paths: usize,
    pub circles: usize,
}

/// Validates `dir/results.json` and `dir/index.html`.
pub fn check_report(dir: &Path) -> anyhow::Result<ReportCheck> {
    let json_path = dir.join("results.json");
    let text = std::fs::read_to_string(&json_path)
        .with_context(|| format!("reading {}", json_path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", json_path.display()))?;
    if v.get("schema").and_then(|s| s.as_str()) != Some(SCHEMA) {
        bail!("{}: schema is not {SCHEMA:?}", json_path.display());
    }
    for k in ["machine", "settings", "targets", "points"] {
        if v.get(k).is_none() {
            bail!("{}: no {k:?}", json_path.display());
        }
    }
    let points = v["points"].as_array().context("points is not a list")?;
    let mut check = ReportCheck {
        points: points.len(),
        ..ReportCheck::default()
    };
    for (i, p) in points.iter().enumerate() {
        for k in ["model", "file", "mode", "concurrency", "spread", "repeats"] {
            if p.get(k).is_none() {
                bail!("point {i}: no {k:?}");
            }
        }
        for k in REQUIRED_POINT_FIELDS {
            match p.get(k) {
                Some(x) if x.is_number() => {}
                _ => bail!("point {i}: {k:?} missing or not a number"),
            }
        }
        let m = p["model"].as_str().unwrap_or("").to_string();
        if !check.models.contains(&m) {
            check.models.push(m);
        }
    }
    let html_path = dir.join("index.html");
    let html = std::fs::read_to_string(&html_path)
        .with_context(|| format!("reading {}", html_path.display()))?;
    let marks = svg_marks(&html).with_context(|| format!("checking {}", html_path.display()))?;
    check.svgs = marks.svgs;
    check.paths = marks.paths;
    check.circles = marks.circles;
    if check.svgs == 0 {
        bail!("{}: no SVG figure", html_path.display());
    }
    Ok(check)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extracts_svgs() {
        let h = "<p>x</p><svg a='1'><path/></svg><p/><svg><circle/></svg><svg>broken";
        let v = extract_svgs(h);
        assert_eq!(v, vec!["<svg a='1'><path/></svg>", "<svg><circle/></svg>"]);
    }

    #[test]
    fn checks_a_written_report_and_rejects_a_broken_one() {
        let dir = std::env::temp_dir().join(format!("iolab-lab-validate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut r = crate::report::tests::synthetic();
        r.schema = SCHEMA.into();
        std::fs::write(dir.join("results.json"), serde_json::to_string(&r).unwrap()).unwrap();
        std::fs::write(dir.join("index.html"), crate::report::render(&r)).unwrap();
        let c = check_report(&dir).unwrap();
        assert_eq!(c.models, vec!["a", "b"]);
        assert!(c.paths > 0 && c.circles > 0);
        // A point without one of the required names is rejected.
        let mut v: serde_json::Value = serde_json::to_value(&r).unwrap();
        v["points"][0]
            .as_object_mut()
            .unwrap()
            .remove("syn_retries");
        std::fs::write(dir.join("results.json"), v.to_string()).unwrap();
        let e = check_report(&dir).unwrap_err().to_string();
        assert!(e.contains("syn_retries"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
