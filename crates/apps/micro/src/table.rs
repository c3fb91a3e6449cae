//! Tables and figures in the JSON convention of `lib.rs`, their plain-text printing, and the
//! typed values the benchmarks' results are made of ([`Num`], [`Cell`], [`Report`]).

use serde::{Serialize, Serializer};

use crate::machine::Machine;

/// What every benchmark returns: the machine, its own named fields (flattened into the same
/// JSON object) and its tables and figures.
#[derive(Debug, Clone, Serialize)]
pub struct Report<F: Serialize> {
    pub machine: Machine,
    #[serde(flatten)]
    pub fields: F,
    pub tables: Vec<Table>,
    pub figures: Vec<Figure>,
}

/// A measured figure as JSON gives it: rounded to 4 significant digits, null when not
/// finite. The raw value stays in `.0` for figures and comparisons.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Num(pub f64);

impl Num {
    /// The value as JSON gives it: rounded to 4 significant digits, `None` when not finite.
    pub fn rounded(self) -> Option<f64> {
        self.0
            .is_finite()
            .then(|| crate::stats::round_sig(self.0, 4))
    }
}

impl Serialize for Num {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.rounded() {
            Some(x) => s.serialize_f64(x),
            None => s.serialize_none(),
        }
    }
}

/// One cell of a table: empty (`-`, JSON null), text, an integer, or a measured number
/// (JSON: rounded to 4 significant digits).
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Empty,
    Text(String),
    Int(i64),
    Num(f64),
}

impl Cell {
    /// A number cell, empty when `x` is not finite.
    pub fn num(x: f64) -> Cell {
        if x.is_finite() {
            Cell::Num(x)
        } else {
            Cell::Empty
        }
    }

    fn is_number(&self) -> bool {
        matches!(self, Cell::Int(_) | Cell::Num(_))
    }
}

impl Serialize for Cell {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Cell::Empty => s.serialize_none(),
            Cell::Text(t) => s.serialize_str(t),
            Cell::Int(i) => s.serialize_i64(*i),
            Cell::Num(x) => Num(*x).serialize(s),
        }
    }
}

impl From<&str> for Cell {
    fn from(s: &str) -> Cell {
        Cell::Text(s.to_string())
    }
}

impl From<String> for Cell {
    fn from(s: String) -> Cell {
        Cell::Text(s)
    }
}

impl From<&String> for Cell {
    fn from(s: &String) -> Cell {
        Cell::Text(s.clone())
    }
}

impl From<Num> for Cell {
    fn from(n: Num) -> Cell {
        Cell::num(n.0)
    }
}

impl<T: Into<Cell>> From<Option<T>> for Cell {
    fn from(v: Option<T>) -> Cell {
        v.map_or(Cell::Empty, Into::into)
    }
}

macro_rules! int_cells {
    ($($t:ty),*) => {$(
        impl From<$t> for Cell {
            fn from(i: $t) -> Cell {
                Cell::Int(i as i64)
            }
        }
    )*};
}
int_cells!(i32, i64, u16, u32, u64, usize);

/// A table: printed to stdout and stored under `"tables"`.
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    pub title: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
    #[serde(skip_serializing_if = "Option::is_none")]
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

    pub fn row(&mut self, cells: Vec<Cell>) {
        self.rows.push(cells);
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Table {
        self.note = Some(note.into());
        self
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
                    let numeric = raw.get(i).is_some_and(Cell::is_number);
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
pub fn cell_text(c: &Cell) -> String {
    match c {
        Cell::Empty => "-".into(),
        Cell::Text(s) => s.clone(),
        Cell::Int(i) => i.to_string(),
        Cell::Num(x) => fmt_num(crate::stats::round_sig(*x, 4)),
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

/// A figure in the JSON convention: the report's line chart, whose JSON the lab reads back.
pub type Figure = iolab_report::svg::LineChart;

/// How the micro benchmarks add a point: y rounded to 4 significant digits, so the JSON
/// says no more than was measured.
pub trait RoundedPoints {
    fn point_rounded(&mut self, name: &str, x: f64, y: f64);
}

impl RoundedPoints for Figure {
    fn point_rounded(&mut self, name: &str, x: f64, y: f64) {
        if y.is_finite() {
            self.point(name, x, crate::stats::round_sig(y, 4));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn json_of(v: impl Serialize) -> Value {
        serde_json::to_value(v).unwrap()
    }

    #[test]
    fn renders_aligned_with_note() {
        let mut t = Table::new("T", &["name", "ns"]);
        t.row(vec!["a".into(), 12.into()]);
        t.row(vec!["longer".into(), Cell::Num(12.34567)]);
        t.row(vec!["x".into(), Cell::Empty]);
        let t = t.with_note("why");
        let s = t.render();
        assert!(s.starts_with("T\n"));
        assert!(s.contains("  a          12\n"), "{s}");
        assert!(s.contains("  longer  12.35\n"), "{s}");
        assert!(s.contains("  x       -\n"), "{s}");
        assert!(s.contains("note: why"));
        let j = json_of(&t);
        assert_eq!(j["columns"][1], "ns");
        assert_eq!(j["rows"].as_array().unwrap().len(), 3);
        assert_eq!(j["note"], "why");
        assert_eq!(j["rows"][0], json!(["a", 12]));
        assert_eq!(j["rows"][1], json!(["longer", 12.35]));
        assert_eq!(j["rows"][2], json!(["x", null]));
        let untitled = json_of(Table::new("U", &["a"]));
        assert!(untitled.get("note").is_none(), "{untitled}");
    }

    #[test]
    fn number_formatting() {
        assert_eq!(fmt_num(1234567.8), "1234568");
        assert_eq!(fmt_num(0.012345), "0.01235");
        assert_eq!(fmt_num(42.0), "42");
        assert_eq!(json_of(Num(f64::NAN)), Value::Null);
        assert_eq!(json_of(Cell::num(f64::INFINITY)), Value::Null);
        // A measured figure stays a JSON float even when whole; a count stays an integer.
        assert_eq!(serde_json::to_string(&Num(42.0)).unwrap(), "42.0");
        assert_eq!(serde_json::to_string(&Num(1234567.8)).unwrap(), "1235000.0");
        assert_eq!(serde_json::to_string(&Cell::from(42usize)).unwrap(), "42");
        assert_eq!(json_of(Cell::from(None::<Num>)), Value::Null);
    }

    #[test]
    fn figure_series() {
        let mut f = Figure::new("F", "x", "y");
        f.point_rounded("a", 1.0, 2.0);
        f.point_rounded("a", 10.0, 3.0);
        f.point_rounded("b", 1.0, f64::INFINITY);
        f.point_rounded("b", 1.0, 1.0);
        let j = json_of(&f);
        assert_eq!(j["series"][0]["points"].as_array().unwrap().len(), 2);
        assert_eq!(j["series"][1]["name"], "b");
        assert_eq!(j["log_x"], false);
        f.point_rounded("b", 3.0, 123.456);
        assert_eq!(json_of(&f)["series"][1]["points"][1], json!([3.0, 123.5]));
    }

    #[test]
    fn report_flattens_its_fields_between_machine_and_tables() {
        #[derive(Serialize)]
        struct Fields {
            answer: u32,
        }
        let r = Report {
            machine: Machine::collect(),
            fields: Fields { answer: 42 },
            tables: vec![Table::new("T", &["a"])],
            figures: vec![],
        };
        let j = json_of(&r);
        assert_eq!(j["answer"], 42);
        assert!(j["machine"]["kernel"].is_string());
        assert_eq!(j["tables"][0]["title"], "T");
        assert_eq!(j["figures"], json!([]));
    }
}
