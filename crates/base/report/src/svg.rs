//! Hand-written SVG charts for the report: scales, ticks, axes, legends.
//!
//! No JavaScript and no chart library: the report must open anywhere, offline, and its
//! figures must survive being parsed back as XML (the tests do that).

use std::fmt::Write as _;

/// Colours chosen to stay distinguishable side by side (Tableau 10 plus two darker ones).
pub const PALETTE: [&str; 12] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#000000", "#6b6ecf",
];

/// Colour for series `i`; past the palette, colours repeat and [`dashed`] tells them apart.
pub fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// Whether series `i` is drawn dashed (second round of the palette).
pub fn dashed(i: usize) -> bool {
    (i / PALETTE.len()) % 2 == 1
}

pub use crate::esc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleKind {
    Linear,
    Log,
}

/// Maps a data interval onto a pixel interval, linearly or logarithmically (base 10).
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    pub kind: ScaleKind,
    pub d0: f64,
    pub d1: f64,
    pub r0: f64,
    pub r1: f64,
}

/// The smallest positive value a log scale accepts; anything below is clamped to it.
const LOG_FLOOR: f64 = 1e-9;

impl Scale {
    /// A scale over `[lo, hi]` widened to round numbers (powers of ten on a log scale).
    /// Degenerate or non-finite domains become a sensible unit interval.
    pub fn nice(kind: ScaleKind, lo: f64, hi: f64, r0: f64, r1: f64) -> Scale {
        let (mut lo, mut hi) = (lo, hi);
        if !lo.is_finite() || !hi.is_finite() {
            lo = if kind == ScaleKind::Log { 1.0 } else { 0.0 };
            hi = 10.0;
        }
        if lo > hi {
            std::mem::swap(&mut lo, &mut hi);
        }
        match kind {
            ScaleKind::Linear => {
                if hi - lo < 1e-12 {
                    hi = lo + if lo.abs() > 1e-12 { lo.abs() } else { 1.0 };
                }
                let step = nice_step(hi - lo, 5);
                let d0 = (lo / step).floor() * step;
                let d1 = (hi / step).ceil() * step;
                Scale {
                    kind,
                    d0,
                    d1,
                    r0,
                    r1,
                }
            }
            ScaleKind::Log => {
                let lo = lo.max(LOG_FLOOR);
                let hi = hi.max(lo);
                let mut e0 = lo.log10().floor();
                let mut e1 = hi.log10().ceil();
                if e1 <= e0 {
                    e1 = e0 + 1.0;
                }
                if !e0.is_finite() {
                    e0 = 0.0;
                }
                Scale {
                    kind,
                    d0: 10f64.powf(e0),
                    d1: 10f64.powf(e1),
                    r0,
                    r1,
                }
            }
        }
    }

    /// Pixel position of `v` (clamped into the domain, so stray values stay on the chart).
    pub fn map(&self, v: f64) -> f64 {
        let t = match self.kind {
            ScaleKind::Linear => {
                let v = if v.is_finite() {
                    v.clamp(self.d0, self.d1)
                } else {
                    self.d0
                };
                (v - self.d0) / (self.d1 - self.d0)
            }
            ScaleKind::Log => {
                let v = if v.is_finite() {
                    v.clamp(self.d0, self.d1)
                } else {
                    self.d0
                };
                (v.log10() - self.d0.log10()) / (self.d1.log10() - self.d0.log10())
            }
        };
        self.r0 + t * (self.r1 - self.r0)
    }

    /// Tick values inside the domain: multiples of 1, 2 or 5 × 10^k on a linear scale;
    /// powers of ten on a log scale (with 2 and 5 between them when it spans few decades).
    pub fn ticks(&self) -> Vec<f64> {
        match self.kind {
            ScaleKind::Linear => {
                let step = nice_step(self.d1 - self.d0, 5);
                let first = (self.d0 / step).ceil() as i64;
                let last = (self.d1 / step).floor() as i64;
                (first..=last).map(|i| i as f64 * step).collect()
            }
            ScaleKind::Log => {
                let e0 = self.d0.log10().round() as i32;
                let e1 = self.d1.log10().round() as i32;
                let mut out = Vec::new();
                let few = e1 - e0 <= 2;
                for e in e0..=e1 {
                    let p = 10f64.powi(e);
                    out.push(p);
                    if few && e < e1 {
                        out.push(2.0 * p);
                        out.push(5.0 * p);
                    }
                }
                out
            }
        }
    }
}

/// A round step (1, 2 or 5 × 10^k) that cuts `span` into about `count` intervals.
pub fn nice_step(span: f64, count: usize) -> f64 {
    if !(span.is_finite() && span > 0.0) {
        return 1.0;
    }
    let raw = span / count.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

/// A short label for a tick value: 1500 -> "1.5k", 2000000 -> "2M", 0.25 -> "0.25".
pub fn fmt_tick(v: f64) -> String {
    if !v.is_finite() {
        return String::from("?");
    }
    let a = v.abs();
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if a >= 1e9 {
        trim(format!("{:.1}", v / 1e9)) + "G"
    } else if a >= 1e6 {
        trim(format!("{:.1}", v / 1e6)) + "M"
    } else if a >= 1e4 {
        trim(format!("{:.1}", v / 1e3)) + "k"
    } else if a >= 1.0 || a == 0.0 {
        trim(format!("{:.2}", v))
    } else {
        // Enough significant digits for 0.001, 0.02, 0.5.
        let digits = (-a.log10().floor()) as usize + 1;
        trim(format!("{:.*}", digits.min(9), v))
    }
}

/// `s` cut to `max` characters with an ellipsis (legends have a fixed width).
pub fn ellipsize(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        s.chars().take(max.saturating_sub(1)).collect::<String>() + "…"
    }
}

/// One curve of a line chart.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart with markers: Figure 1, the micro figures. Its JSON form is the one the
/// micro benchmarks write and the lab reads back.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_x: bool,
    pub log_y: bool,
    pub series: Vec<Series>,
}

impl LineChart {
    /// An empty chart on linear axes.
    pub fn new(
        title: impl Into<String>,
        x_label: impl Into<String>,
        y_label: impl Into<String>,
    ) -> LineChart {
        LineChart {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            log_x: false,
            log_y: false,
            series: Vec::new(),
        }
    }

    /// Adds `(x, y)` to the series `name`, creating it on first use; a point with a
    /// non-finite coordinate is skipped (it has no place on the chart).
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
}

const W: f64 = 900.0;
const H: f64 = 420.0;
const ML: f64 = 70.0;
const MR: f64 = 270.0;
const MT: f64 = 36.0;
const MB: f64 = 52.0;

fn kind(log: bool) -> ScaleKind {
    if log {
        ScaleKind::Log
    } else {
        ScaleKind::Linear
    }
}

/// Extent of finite values (positive ones only on a log scale).
fn extent(vals: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    for v in vals {
        if v.is_finite() && (!log || v > 0.0) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
    }
    if lo > hi {
        (if log { 1.0 } else { 0.0 }, 10.0)
    } else {
        (lo, hi)
    }
}

/// Draws an axis line with ticks, tick labels and grid lines.
fn axis(
    out: &mut String,
    s: &Scale,
    horizontal: bool,
    at: f64,
    grid_to: f64,
    label: &str,
    right: bool,
) {
    let (x0, y0, x1, y1) = if horizontal {
        (s.r0, at, s.r1, at)
    } else {
        (at, s.r0, at, s.r1)
    };
    let _ = write!(
        out,
        r##"<line class="axis" x1="{x0:.1}" y1="{y0:.1}" x2="{x1:.1}" y2="{y1:.1}" stroke="#333" stroke-width="1"/>"##
    );
    for t in s.ticks() {
        let p = s.map(t);
        let lab = esc(&fmt_tick(t));
        if horizontal {
            let _ = write!(
                out,
                r##"<line x1="{p:.1}" y1="{at:.1}" x2="{p:.1}" y2="{g:.1}" stroke="#e4e4e4" stroke-width="1"/><line x1="{p:.1}" y1="{at:.1}" x2="{p:.1}" y2="{t2:.1}" stroke="#333"/><text x="{p:.1}" y="{ty:.1}" font-size="11" text-anchor="middle">{lab}</text>"##,
                g = grid_to,
                t2 = at + 5.0,
                ty = at + 18.0
            );
        } else {
            let (tx, anchor, t2) = if right {
                (at + 8.0, "start", at + 5.0)
            } else {
                (at - 8.0, "end", at - 5.0)
            };
            if !right {
                let _ = write!(
                    out,
                    r##"<line x1="{at:.1}" y1="{p:.1}" x2="{grid_to:.1}" y2="{p:.1}" stroke="#e4e4e4" stroke-width="1"/>"##
                );
            }
            let _ = write!(
                out,
                r##"<line x1="{at:.1}" y1="{p:.1}" x2="{t2:.1}" y2="{p:.1}" stroke="#333"/><text x="{tx:.1}" y="{ty:.1}" font-size="11" text-anchor="{anchor}">{lab}</text>"##,
                ty = p + 4.0
            );
        }
    }
    let label = esc(label);
    if horizontal {
        let _ = write!(
            out,
            r##"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">{label}</text>"##,
            (s.r0 + s.r1) / 2.0,
            at + 38.0
        );
    } else {
        let x = if right { at + 46.0 } else { at - 52.0 };
        let y = (s.r0 + s.r1) / 2.0;
        let _ = write!(
            out,
            r##"<text x="{x:.1}" y="{y:.1}" font-size="12" text-anchor="middle" transform="rotate(-90 {x:.1} {y:.1})">{label}</text>"##
        );
    }
}

fn open_svg(out: &mut String, w: f64, h: f64, title: &str) {
    let t = esc(title);
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" class="figure" width="{w:.0}" height="{h:.0}" viewBox="0 0 {w:.0} {h:.0}" font-family="sans-serif" role="img" aria-label="{t}"><rect x="0" y="0" width="{w:.0}" height="{h:.0}" fill="#fff"/><text x="{:.1}" y="20" font-size="14" font-weight="bold" text-anchor="middle">{t}</text>"##,
        w / 2.0
    );
}

/// A path through `pts` (already in pixels).
fn polyline(pts: &[(f64, f64)]) -> String {
    let mut d = String::new();
    for (i, (x, y)) in pts.iter().enumerate() {
        let _ = write!(d, "{}{x:.1},{y:.1}", if i == 0 { "M" } else { " L" });
    }
    d
}

/// Renders a line chart; series with no points still get a legend entry ("no data").
pub fn line_chart(c: &LineChart) -> String {
    let mut out = String::new();
    open_svg(&mut out, W, H, &c.title);
    let all = || c.series.iter().flat_map(|s| s.points.iter());
    let (x_lo, x_hi) = extent(all().map(|p| p.0), c.log_x);
    let (y_lo, y_hi) = extent(all().map(|p| p.1), c.log_y);
    let y_lo = if c.log_y { y_lo } else { y_lo.min(0.0) };
    let xs = Scale::nice(kind(c.log_x), x_lo, x_hi, ML, W - MR);
    let ys = Scale::nice(kind(c.log_y), y_lo, y_hi, H - MB, MT);
    axis(&mut out, &ys, false, ML, W - MR, &c.y_label, false);
    axis(&mut out, &xs, true, H - MB, MT, &c.x_label, false);
    for (i, s) in c.series.iter().enumerate() {
        let col = color(i);
        let px: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| {
                p.0.is_finite()
                    && p.1.is_finite()
                    && (!c.log_x || p.0 > 0.0)
                    && (!c.log_y || p.1 > 0.0)
            })
            .map(|p| (xs.map(p.0), ys.map(p.1)))
            .collect();
        let dash = if dashed(i) {
            r#" stroke-dasharray="6 3""#
        } else {
            ""
        };
        let name = esc(&s.name);
        let short = esc(&ellipsize(&s.name, 38));
        let _ = write!(out, r#"<g class="series" data-name="{name}">"#);
        if px.len() > 1 {
            let _ = write!(
                out,
                r#"<path d="{}" fill="none" stroke="{col}" stroke-width="2"{dash}/>"#,
                polyline(&px)
            );
        }
        for (x, y) in &px {
            let _ = write!(
                out,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{col}"/>"#
            );
        }
        out.push_str("</g>");
        // Legend entry.
        let ly = MT + 8.0 + i as f64 * 18.0;
        let lx = W - MR + 16.0;
        let note = if s.points.is_empty() {
            " (no data)"
        } else {
            ""
        };
        let _ = write!(
            out,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{col}" stroke-width="2"{dash}/><circle cx="{:.1}" cy="{ly:.1}" r="3" fill="{col}"/><text x="{:.1}" y="{:.1}" font-size="11">{short}{note}<title>{name}</title></text>"#,
            lx + 22.0,
            lx + 11.0,
            lx + 28.0,
            ly + 4.0
        );
    }
    out.push_str("</svg>");
    out
}

/// One panel of Figure 2: each request's completion time against the time it ended, with
/// the server's concurrency over time on a second (right) axis.
#[derive(Debug, Clone, Default)]
pub struct ScatterPanel {
    pub title: String,
    /// (end time s, response time ms, class): 0 = ok, 1 = SYN-retried, 2 = error.
    pub points: Vec<(f64, f64, u8)>,
    /// (time s, connections): the concurrency curve on the right axis.
    pub line: Vec<(f64, f64)>,
    pub line_label: String,
    /// A second curve on the right axis, drawn lighter (the client's requests in flight).
    pub line2: Vec<(f64, f64)>,
    /// A horizontal reference on the right axis (the requested concurrency).
    pub requested: Option<f64>,
}

pub const PANEL_W: f64 = 420.0;
pub const PANEL_H: f64 = 250.0;

/// Class colours of the scatter: ok, SYN-retried, error.
pub const CLASS_COLORS: [&str; 3] = ["#1f77b4", "#ff7f0e", "#d62728"];

pub fn scatter_panel(p: &ScatterPanel) -> String {
    let (w, h) = (PANEL_W, PANEL_H);
    let (ml, mr, mt, mb) = (70.0, 60.0, 30.0, 44.0);
    let mut out = String::new();
    open_svg(&mut out, w, h, &p.title);
    let (_, t_hi) = extent(
        p.points
            .iter()
            .map(|q| q.0)
            .chain(p.line.iter().map(|q| q.0)),
        false,
    );
    let (_, y_hi) = extent(p.points.iter().map(|q| q.1), false);
    let (_, c_hi) = extent(
        p.line
            .iter()
            .chain(&p.line2)
            .map(|q| q.1)
            .chain(p.requested),
        false,
    );
    let xs = Scale::nice(ScaleKind::Linear, 0.0, t_hi, ml, w - mr);
    let ys = Scale::nice(ScaleKind::Linear, 0.0, y_hi, h - mb, mt);
    let cs = Scale::nice(ScaleKind::Linear, 0.0, c_hi, h - mb, mt);
    axis(
        &mut out,
        &ys,
        false,
        ml,
        w - mr,
        "response time (ms)",
        false,
    );
    axis(&mut out, &cs, false, w - mr, w - mr, &p.line_label, true);
    axis(
        &mut out,
        &xs,
        true,
        h - mb,
        mt,
        "time since start (s)",
        false,
    );
    if let Some(r) = p.requested {
        let y = cs.map(r);
        let _ = write!(
            out,
            r##"<line class="requested" x1="{ml:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#2ca02c" stroke-dasharray="4 3"/>"##,
            w - mr
        );
    }
    // One group per class carries the colour, so each dot is only its position: the page
    // of a run over every server stays small. Ok dots first, the rarer classes on top.
    out.push_str(r#"<g class="scatter" fill-opacity="0.55">"#);
    for (k, col) in CLASS_COLORS.iter().enumerate() {
        let mut dots = p
            .points
            .iter()
            .filter(|q| usize::from(q.2.min(2)) == k)
            .peekable();
        if dots.peek().is_none() {
            continue;
        }
        let _ = write!(out, r#"<g fill="{col}">"#);
        for &(t, y, _) in dots {
            let _ = write!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="1.4"/>"#,
                xs.map(t),
                ys.map(y)
            );
        }
        out.push_str("</g>");
    }
    out.push_str("</g>");
    if p.line2.len() > 1 {
        let px: Vec<(f64, f64)> = p
            .line2
            .iter()
            .map(|&(t, c)| (xs.map(t), cs.map(c)))
            .collect();
        let _ = write!(
            out,
            r##"<path class="client" d="{}" fill="none" stroke="#999" stroke-width="1.2" stroke-dasharray="5 2"/>"##,
            polyline(&px)
        );
    }
    if p.line.len() > 1 {
        let px: Vec<(f64, f64)> = p
            .line
            .iter()
            .map(|&(t, c)| (xs.map(t), cs.map(c)))
            .collect();
        let _ = write!(
            out,
            r##"<path class="concurrency" d="{}" fill="none" stroke="#222" stroke-width="1.3"/>"##,
            polyline(&px)
        );
    }
    if p.points.is_empty() {
        let _ = write!(
            out,
            r##"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle" fill="#888">no requests recorded</text>"##,
            w / 2.0,
            h / 2.0
        );
    }
    out.push_str("</svg>");
    out
}

/// Grouped bars: one group per category, one bar per series (the keep-alive chart).
#[derive(Debug, Clone)]
pub struct BarChart {
    pub title: String,
    pub y_label: String,
    pub categories: Vec<String>,
    /// (series name, one value per category; None = not measured).
    pub series: Vec<(String, Vec<Option<f64>>)>,
}

pub fn bar_chart(c: &BarChart) -> String {
    let n = c.categories.len().max(1) as f64;
    let w = (ML + MR + n * 62.0).max(W);
    let h = H + 40.0;
    let mb = MB + 40.0;
    let mut out = String::new();
    open_svg(&mut out, w, h, &c.title);
    let (_, hi) = extent(
        c.series.iter().flat_map(|s| s.1.iter().flatten().copied()),
        false,
    );
    let ys = Scale::nice(ScaleKind::Linear, 0.0, hi, h - mb, MT);
    axis(&mut out, &ys, false, ML, w - MR, &c.y_label, false);
    let _ = write!(
        out,
        r##"<line x1="{ML:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#333"/>"##,
        w - MR,
        y = h - mb
    );
    let group_w = (w - ML - MR) / n;
    let k = c.series.len().max(1) as f64;
    let bar_w = (group_w * 0.8 / k).min(40.0);
    for (ci, cat) in c.categories.iter().enumerate() {
        let gx = ML + ci as f64 * group_w + group_w * 0.1;
        for (si, (_, vals)) in c.series.iter().enumerate() {
            if let Some(Some(v)) = vals.get(ci) {
                let x = gx + si as f64 * bar_w;
                let y = ys.map(*v);
                let _ = write!(
                    out,
                    r#"<rect class="bar" x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                    (bar_w - 1.0).max(1.0),
                    (h - mb - y).max(0.0),
                    color(si),
                    esc(cat),
                    esc(&fmt_tick(*v))
                );
            }
        }
        let lx = gx + group_w * 0.4;
        let ly = h - mb + 12.0;
        let _ = write!(
            out,
            r#"<text x="{lx:.1}" y="{ly:.1}" font-size="11" text-anchor="end" transform="rotate(-35 {lx:.1} {ly:.1})">{}</text>"#,
            esc(cat)
        );
    }
    for (si, (name, _)) in c.series.iter().enumerate() {
        let ly = MT + 8.0 + si as f64 * 18.0;
        let lx = w - MR + 16.0;
        let _ = write!(
            out,
            r#"<rect x="{lx:.1}" y="{:.1}" width="14" height="10" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"#,
            ly - 5.0,
            color(si),
            lx + 20.0,
            ly + 4.0,
            esc(name)
        );
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_scale_maps_ends_and_middle() {
        let s = Scale::nice(ScaleKind::Linear, 0.0, 100.0, 10.0, 110.0);
        assert_eq!((s.d0, s.d1), (0.0, 100.0));
        assert!((s.map(0.0) - 10.0).abs() < 1e-9);
        assert!((s.map(50.0) - 60.0).abs() < 1e-9);
        assert!((s.map(100.0) - 110.0).abs() < 1e-9);
        // Out of domain values are clamped onto the axis.
        assert!((s.map(1e9) - 110.0).abs() < 1e-9);
        assert!((s.map(f64::NAN) - 10.0).abs() < 1e-9);
    }

    #[test]
    fn linear_nice_domain_and_ticks() {
        let s = Scale::nice(ScaleKind::Linear, 3.0, 87.0, 0.0, 1.0);
        assert_eq!((s.d0, s.d1), (0.0, 100.0));
        assert_eq!(s.ticks(), vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        let s = Scale::nice(ScaleKind::Linear, 0.0, 0.37, 0.0, 1.0);
        assert!((s.d1 - 0.4).abs() < 1e-12);
        assert_eq!(s.ticks().len(), 5);
    }

    #[test]
    fn degenerate_domains_do_not_divide_by_zero() {
        let s = Scale::nice(ScaleKind::Linear, 5.0, 5.0, 0.0, 100.0);
        assert!(s.d1 > s.d0);
        assert!(s.map(5.0).is_finite());
        let s = Scale::nice(ScaleKind::Log, 0.0, 0.0, 0.0, 100.0);
        assert!(s.d0 > 0.0 && s.d1 > s.d0);
        assert!(s.map(0.0).is_finite());
        let s = Scale::nice(ScaleKind::Linear, f64::NAN, f64::INFINITY, 0.0, 1.0);
        assert!(s.d1 > s.d0);
    }

    #[test]
    fn log_scale_is_even_per_decade() {
        let s = Scale::nice(ScaleKind::Log, 1.0, 1000.0, 0.0, 300.0);
        assert_eq!((s.d0, s.d1), (1.0, 1000.0));
        assert!((s.map(10.0) - 100.0).abs() < 1e-9);
        assert!((s.map(100.0) - 200.0).abs() < 1e-9);
        assert_eq!(s.ticks(), vec![1.0, 10.0, 100.0, 1000.0]);
        // Rounded out to whole decades.
        let s = Scale::nice(ScaleKind::Log, 3.0, 420.0, 0.0, 1.0);
        assert_eq!((s.d0, s.d1), (1.0, 1000.0));
        // Few decades: 2 and 5 ticks in between.
        let s = Scale::nice(ScaleKind::Log, 0.2, 8.0, 0.0, 1.0);
        assert_eq!((s.d0, s.d1), (0.1, 10.0));
        let t = s.ticks();
        assert!(t.contains(&0.2) && t.contains(&5.0) && t.contains(&10.0));
    }

    #[test]
    fn inverted_range_for_y_axes() {
        let s = Scale::nice(ScaleKind::Linear, 0.0, 10.0, 200.0, 0.0);
        assert!((s.map(0.0) - 200.0).abs() < 1e-9);
        assert!((s.map(10.0) - 0.0).abs() < 1e-9);
    }

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(100.0, 5), 20.0);
        assert_eq!(nice_step(1.0, 5), 0.2);
        assert_eq!(nice_step(7.0, 5), 2.0);
        assert_eq!(nice_step(0.0, 5), 1.0);
        assert_eq!(nice_step(f64::NAN, 5), 1.0);
    }

    #[test]
    fn tick_labels() {
        assert_eq!(fmt_tick(0.0), "0");
        assert_eq!(fmt_tick(1.0), "1");
        assert_eq!(fmt_tick(2.5), "2.5");
        assert_eq!(fmt_tick(1000.0), "1000");
        assert_eq!(fmt_tick(20000.0), "20k");
        assert_eq!(fmt_tick(1_500_000.0), "1.5M");
        assert_eq!(fmt_tick(0.02), "0.02");
        assert_eq!(fmt_tick(0.001), "0.001");
        assert_eq!(fmt_tick(f64::NAN), "?");
    }

    #[test]
    fn ellipsis() {
        assert_eq!(ellipsize("short", 10), "short");
        assert_eq!(
            ellipsize("io_uring MSG_RING self, batch 32", 10),
            "io_uring …"
        );
        assert_eq!(ellipsize("ééééé", 3), "éé…");
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(esc(r#"a<b & "c""#), "a&lt;b &amp; &quot;c&quot;");
    }

    #[test]
    fn line_chart_draws_a_path_per_series() {
        let c = LineChart {
            title: "t <1>".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            log_x: true,
            log_y: true,
            series: vec![
                Series {
                    name: "a".into(),
                    points: vec![(1.0, 1.0), (10.0, 5.0), (100.0, 50.0)],
                },
                Series {
                    name: "b".into(),
                    points: vec![(1.0, 2.0), (10.0, 0.0)],
                },
                Series {
                    name: "c".into(),
                    points: vec![],
                },
            ],
        };
        let svg = line_chart(&c);
        let doc = roxmltree::Document::parse(&svg).expect("well-formed");
        let paths = doc.descendants().filter(|n| n.has_tag_name("path")).count();
        // "b" loses its zero on a log axis, leaving one point: no path, one marker.
        assert_eq!(paths, 1);
        let circles = doc
            .descendants()
            .filter(|n| n.has_tag_name("circle"))
            .count();
        assert_eq!(
            circles,
            3 + 1 + 3,
            "markers plus one legend marker per series"
        );
        assert!(svg.contains("no data"));
    }

    #[test]
    fn scatter_and_bars_parse() {
        let p = ScatterPanel {
            title: "epoll".into(),
            points: vec![(0.1, 2.0, 0), (1.2, 1005.0, 1), (1.3, 3.0, 2)],
            line: vec![(0.0, 0.0), (0.5, 900.0), (1.0, 1000.0)],
            line_label: "server connections".into(),
            line2: vec![(0.0, 0.0), (1.0, 990.0)],
            requested: Some(1000.0),
        };
        let doc_s = scatter_panel(&p);
        let doc = roxmltree::Document::parse(&doc_s).unwrap();
        assert_eq!(
            doc.descendants()
                .filter(|n| n.has_tag_name("circle"))
                .count(),
            3
        );
        assert!(doc
            .descendants()
            .any(|n| n.attribute("class") == Some("concurrency")));
        let b = BarChart {
            title: "ka".into(),
            y_label: "req/s".into(),
            categories: vec!["a".into(), "b".into()],
            series: vec![("c=50".into(), vec![Some(10.0), None])],
        };
        let s = bar_chart(&b);
        let doc = roxmltree::Document::parse(&s).unwrap();
        assert_eq!(
            doc.descendants()
                .filter(|n| n.attribute("class") == Some("bar"))
                .count(),
            1
        );
    }
}
