//! Tables and figures in the JSON convention of `lib.rs`, and their plain-text printing.

use serde_json::{json, Value};

/// A table: printed to stdout and stored under `"tables"`.
#[derive(Debug, Clone)]
pub struct Table {
    pub title: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Value>>,
    pub note: Option<String>,
}

impl Table {
    pub fn new(title: impl Into<String>, columns: &[&str]) -> Table {
        Table {
            title: title.into(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows: Vec::new(),
            note: None,
        }
    }

    pub fn row(&mut self, cells: Vec<Value>) {
        self.rows.push(cells);
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Table {
        self.note = Some(note.into());
        self
    }

    pub fn to_json(&self) -> Value {
        let mut v = json!({ "title": self.title, "columns": self.columns, "rows": self.rows });
        if let Some(n) = &self.note {
            v["note"] = json!(n);
        }
        v
    }

    /// Renders the table as aligned text (numbers right-aligned).
    pub fn render(&self) -> String {
        let cells: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| r.iter().map(cell_text).collect())
            .collect();
        let ncols = self
            .columns
            .len()
            .max(cells.iter().map(Vec::len).max().unwrap_or(0));
        let mut width = vec![0usize; ncols];
        for (i, c) in self.columns.iter().enumerate() {
            width[i] = width[i].max(c.chars().count());
        }
        for r in &cells {
            for (i, c) in r.iter().enumerate() {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let mut out = format!("{}\n", self.title);
        let header: Vec<String> = (0..ncols)
            .map(|i| {
                pad(
                    self.columns.get(i).map(String::as_str).unwrap_or(""),
                    width[i],
                    false,
                )
            })
            .collect();
        out += &format!("  {}\n", header.join("  ").trim_end());
        out += &format!(
            "  {}\n",
            width
                .iter()
                .map(|w| "-".repeat(*w))
                .collect::<Vec<_>>()
                .join("  ")
        );
        for (r, raw) in cells.iter().zip(&self.rows) {
            let line: Vec<String> = (0..ncols)
                .map(|i| {
                    let numeric = raw.get(i).is_some_and(Value::is_number);
                    pad(
                        r.get(i).map(String::as_str).unwrap_or(""),
                        width[i],
                        numeric,
                    )
                })
                .collect();
            out += &format!("  {}\n", line.join("  ").trim_end());
        }
        if let Some(n) = &self.note {
            for l in n.lines() {
                out += &format!("  note: {l}\n");
            }
        }
        out
    }

    pub fn print(&self) {
        println!("{}", self.render());
    }
}

fn pad(s: &str, w: usize, right: bool) -> String {
    if right {
        format!("{s:>w$}")
    } else {
        format!("{s:<w$}")
    }
}

/// Text of one cell: integers as such, other numbers with at most 4 significant digits.
pub fn cell_text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.to_string()
            } else {
                fmt_num(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        other => other.to_string(),
    }
}

/// A float with at most 4 significant digits, no exponent for ordinary magnitudes.
pub fn fmt_num(x: f64) -> String {
    if !x.is_finite() {
        return x.to_string();
    }
    if x.abs() >= 1000.0 {
        return format!("{}", x.round() as i64);
    }
    let r = crate::stats::round_sig(x, 4);
    if r == r.trunc() {
        format!("{}", r.round() as i64)
    } else {
        let mag = r.abs().log10().floor() as i32;
        let decimals = (3 - mag).clamp(0, 9) as usize;
        format!("{r:.decimals$}")
    }
}

/// A number for JSON, rounded to 4 significant digits (null when not finite).
pub fn num(x: f64) -> Value {
    if x.is_finite() {
        json!(crate::stats::round_sig(x, 4))
    } else {
        Value::Null
    }
}

/// One series of a figure.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A figure in the JSON convention.
#[derive(Debug, Clone)]
pub struct Figure {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_x: bool,
    pub log_y: bool,
    pub series: Vec<Series>,
}

impl Figure {
    pub fn new(
        title: impl Into<String>,
        x_label: impl Into<String>,
        y_label: impl Into<String>,
    ) -> Figure {
        Figure {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            log_x: false,
            log_y: false,
            series: Vec::new(),
        }
    }

    /// Adds `(x, y)` to the series `name`, creating it on first use; non-finite y is skipped.
    pub fn point(&mut self, name: &str, x: f64, y: f64) {
        if !x.is_finite() || !y.is_finite() {
            return;
        }
        match self.series.iter_mut().find(|s| s.name == name) {
            Some(s) => s.points.push((x, y)),
            None => self.series.push(Series {
                name: name.to_string(),
                points: vec![(x, y)],
            }),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "title": self.title,
            "x_label": self.x_label,
            "y_label": self.y_label,
            "log_x": self.log_x,
            "log_y": self.log_y,
            "series": self.series.iter().map(|s| json!({
                "name": s.name,
                "points": s.points.iter().map(|(x, y)| json!([x, crate::stats::round_sig(*y, 4)])).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_aligned_with_note() {
        let mut t = Table::new("T", &["name", "ns"]);
        t.row(vec![json!("a"), json!(12)]);
        t.row(vec![json!("longer"), json!(12.34567)]);
        t.row(vec![json!("x"), Value::Null]);
        let t = t.with_note("why");
        let s = t.render();
        assert!(s.starts_with("T\n"));
        assert!(s.contains("  a          12\n"), "{s}");
        assert!(s.contains("  longer  12.35\n"), "{s}");
        assert!(s.contains("  x       -\n"), "{s}");
        assert!(s.contains("note: why"));
        let j = t.to_json();
        assert_eq!(j["columns"][1], "ns");
        assert_eq!(j["rows"].as_array().unwrap().len(), 3);
        assert_eq!(j["note"], "why");
    }

    #[test]
    fn number_formatting() {
        assert_eq!(fmt_num(1234567.8), "1234568");
        assert_eq!(fmt_num(0.012345), "0.01235");
        assert_eq!(fmt_num(42.0), "42");
        assert_eq!(num(f64::NAN), Value::Null);
    }

    #[test]
    fn figure_series() {
        let mut f = Figure::new("F", "x", "y");
        f.point("a", 1.0, 2.0);
        f.point("a", 10.0, 3.0);
        f.point("b", 1.0, f64::INFINITY);
        f.point("b", 1.0, 1.0);
        let j = f.to_json();
        assert_eq!(j["series"][0]["points"].as_array().unwrap().len(), 2);
        assert_eq!(j["series"][1]["name"], "b");
        assert_eq!(j["log_x"], false);
    }
}
