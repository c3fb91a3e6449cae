//! What the ODB and DISC benches' reports share: the spread of repeated figures, the goal
//! lines, the host's steal line, the machine, the nginx configurations, the JSON writer and
//! the Chromium check of a page.

use anyhow::{bail, Context};
use serde::Serialize;

/// (median, min, max) of a figure over the runs, each NaN (JSON null) when there is none.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// No run measured it.
    pub const NONE: Spread = Spread {
        median: f64::NAN,
        min: f64::NAN,
        max: f64::NAN,
    };

    /// The spread of the finite values of `v`.
    pub fn of(v: &[f64]) -> Spread {
        let f: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        Spread {
            median: iolab_sys::percentile::median(&f).unwrap_or(f64::NAN),
            min: f.iter().copied().reduce(f64::min).unwrap_or(f64::NAN),
            max: f.iter().copied().reduce(f64::max).unwrap_or(f64::NAN),
        }
    }
}

/// One nginx tier's configuration as the bench ran it.
#[derive(Clone, Debug, Serialize)]
pub struct NginxConfig {
    pub tier: String,
    pub config: String,
}

impl NginxConfig {
    /// The printed configurations of a stack (`Stack::configs`).
    pub fn list(configs: &[(String, String)]) -> Vec<NginxConfig> {
        configs
            .iter()
            .map(|(tier, config)| NginxConfig {
                tier: tier.clone(),
                config: config.clone(),
            })
            .collect()
    }
}

/// The configurations as HTML, one heading and block per tier; `prefix` goes before each
/// tier's name.
pub(crate) fn nginx_configs_html(configs: &[NginxConfig], prefix: &str) -> String {
    configs
        .iter()
        .map(|c| {
            format!(
                "<h4>{prefix}{}</h4><pre>{}</pre>",
                esc(&c.tier),
                esc(&c.config)
            )
        })
        .collect()
}

pub(crate) use iolab_report::esc;

/// The machine a bench ran on.
#[derive(Clone, Debug, Serialize)]
pub struct Host {
    pub cpu: String,
    pub cpus: usize,
    pub kernel: String,
    pub nginx: String,
}

impl Host {
    pub fn probe() -> Host {
        let nginx = std::process::Command::new("nginx")
            .arg("-v")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
            .unwrap_or_default();
        Host {
            cpu: iolab_sys::host::cpu_model().unwrap_or_default(),
            cpus: iolab_sys::host::cpus(),
            kernel: iolab_sys::host::kernel_release().unwrap_or_else(|| "unknown".into()),
            nginx,
        }
    }
}

/// `v` as JSON with its keys sorted, as the benches' files have always been written (they
/// were `serde_json::Value`s, whose maps sort).
pub fn json_sorted<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v).map_or_else(|e| format!("{{\"error\":\"{e}\"}}"), |v| v.to_string())
}

/// As [`json_sorted`], pretty-printed: what the benches write to their `--json` files.
pub fn json_file_text<T: Serialize>(v: &T) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(&serde_json::to_value(v)?)? + "\n")
}

/// One goal's line: its measured value at each size it names (`unit` after each) and
/// whether all of them meet `ok`; a goal none of whose sizes was measured says so.
pub(crate) fn goal_line(
    name: &str,
    vals: Vec<(u64, f64)>,
    unit: &str,
    ok: &dyn Fn(f64) -> bool,
) -> String {
    if vals.is_empty() {
        return format!("  {name}: no size measured\n");
    }
    let met = vals.iter().all(|&(_, x)| ok(x));
    // Two decimals, or three where rounding to two would read as the other verdict
    // (0.504 printed "0.50x — NOT met" against a goal of 0.50).
    let list: Vec<String> = vals
        .iter()
        .map(|&(size, x)| {
            if ok((x * 100.0).round() / 100.0) == ok(x) {
                format!("{size} B {x:.2}{unit}")
            } else {
                format!("{size} B {x:.3}{unit}")
            }
        })
        .collect();
    format!(
        "  {name}: {} — {}\n",
        list.join(", "),
        if met { "met" } else { "NOT met" }
    )
}

/// The figure `at` reads from each of a bench's size rows (`size` says its size), for the
/// sizes `keep` names.
pub(crate) fn goal_values<R>(
    rows: &[R],
    size: impl Fn(&R) -> usize,
    keep: &dyn Fn(u64) -> bool,
    at: impl Fn(&R) -> f64,
) -> Vec<(u64, f64)> {
    rows.iter()
        .map(|x| (size(x) as u64, at(x)))
        .filter(|&(size, _)| keep(size))
        .collect()
}

/// One line on the host's steal during a bench's runs, per configuration (`runs`: label
/// and the steal of each of its runs).
pub(crate) fn steal_line(runs: &[(&str, Vec<f64>)]) -> String {
    let all: Vec<f64> = runs.iter().flat_map(|(_, v)| v.iter().copied()).collect();
    if all.is_empty() {
        return "host steal on the tiers' CPU: not measured (/proc/stat unreadable)\n".into();
    }
    let st = Spread::of(&all);
    let per: Vec<String> = runs
        .iter()
        .map(|(c, v)| format!("{c} {:.1}%", Spread::of(v).median))
        .collect();
    format!(
        "host steal on the tiers' CPU during the runs (/proc/stat): median {:.1}% ({:.1}-{:.1}%); {}\n",
        st.median,
        st.min,
        st.max,
        per.join(", ")
    )
}

/// Renders `html` in headless Chromium to a PNG next to it; an error if it does not render.
pub fn check_in_chromium(html: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    let bin =
        crate::stack::which("chromium").context("chromium not found (Debian package chromium)")?;
    let png = html.with_extension("png");
    let _ = std::fs::remove_file(&png);
    let out = std::process::Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1200,900",
        ])
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", html.canonicalize()?.display()))
        .output()
        .context("running chromium")?;
    let ok = std::fs::metadata(&png)
        .map(|m| m.len() > 1000)
        .unwrap_or(false);
    if !ok {
        bail!(
            "chromium did not render {}: {}",
            html.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(png)
}

/// The start of a figure of `w` × `h` with its x axis `pad` above the bottom; `label` names
/// it for screen readers.
pub(crate) fn svg_open(w: f64, h: f64, pad: f64, label: &str) -> String {
    format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' role='img' aria-label='{}'><line x1='{pad}' y1='{}' x2='{}' y2='{}' stroke='#333'/>",
        esc(label),
        h - pad,
        w - 10.0,
        h - pad
    )
}

/// Writes the result as JSON (keys sorted) and the page as HTML.
pub fn write_files<T: Serialize>(
    v: &T,
    page: &str,
    json_path: &std::path::Path,
    html_path: &std::path::Path,
) -> anyhow::Result<()> {
    std::fs::write(json_path, json_file_text(v)?)
        .with_context(|| format!("writing {}", json_path.display()))?;
    std::fs::write(html_path, page).with_context(|| format!("writing {}", html_path.display()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The line of `goals` that starts (indentation aside) with `start`.
    pub(crate) fn goal_named(goals: &str, start: &str) -> String {
        goals
            .lines()
            .find(|l| l.trim_start().starts_with(start))
            .unwrap_or_else(|| panic!("no goal {start:?} in {goals}"))
            .to_string()
    }

    /// A value that rounds onto the goal's bound gets a third decimal, so that what is
    /// printed agrees with the verdict.
    #[test]
    fn a_value_rounding_onto_the_bound_shows_a_third_decimal() {
        let under = |x: f64| x <= 0.5;
        let l = goal_line("CPU", vec![(65536, 0.5042), (1048576, 0.16)], "x", &under);
        assert_eq!(l, "  CPU: 65536 B 0.504x, 1048576 B 0.16x — NOT met\n");
        let l = goal_line("CPU", vec![(65536, 0.4962)], "x", &under);
        assert_eq!(l, "  CPU: 65536 B 0.50x — met\n");
        let l = goal_line("req/s", vec![(65536, 0.4951)], "x", &|x| x >= 0.5);
        assert_eq!(l, "  req/s: 65536 B 0.495x — NOT met\n");
    }

    #[test]
    fn a_spread_ignores_what_was_not_measured() {
        let s = Spread::of(&[3.0, f64::NAN, 1.0, 2.0, f64::INFINITY]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        let none = Spread::of(&[f64::NAN]);
        assert!(none.median.is_nan() && none.min.is_nan() && none.max.is_nan());
        assert_eq!(
            json_sorted(&none),
            r#"{"max":null,"median":null,"min":null}"#,
            "NaN is written as null, as before"
        );
    }
}
