//! End to end: `iolab lab --profile tiny` over two models writes a valid results.json,
//! per-request logs and an index.html whose SVG figures parse; headless Chromium renders
//! the page and finds the figures drawn.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

mod common;
use common::run_ok;

const MODELS: [&str; 2] = ["threads", "epoll"];
const TESTS: usize = 4;
/// A real `iolab seed bench --json` output (crates/apps/lab/testdata/README.md says how it was
/// made): the report's BitTorrent seeder section.
const SEED_BENCH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/crates/apps/lab/testdata/seed-bench.json"
);
static DONE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The last test to pass removes the report (a failing one leaves it for inspection).
fn done() {
    if DONE.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == TESTS {
        let _ = std::fs::remove_dir_all(report());
    }
}

/// Runs the tiny lab once for all the tests of this file; returns the report directory.
fn report() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("iolab-lab-e2e-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        run_ok(
            Command::new(env!("CARGO_BIN_EXE_iolab"))
                .args([
                    "lab",
                    "--profile",
                    "tiny",
                    "--models",
                    &MODELS.join(","),
                    "--peers",
                    "none",
                    "--no-micro",
                    "--seed-bench",
                    SEED_BENCH,
                    "--out",
                ])
                .arg(&dir),
        );
        dir
    })
}

#[test]
fn results_json_has_every_point_with_the_required_fields() {
    use iolab_lab::results::{ConnMode, FileKind};
    let dir = report();
    let check = iolab_lab::validate::check_report(dir).expect("valid report");
    assert_eq!(check.models, MODELS);
    let r = iolab_lab::validate::load_results(dir).unwrap();
    assert_eq!(r.profile, "tiny");
    assert!(
        r.machine.get("kernel").is_some(),
        "machine metadata recorded"
    );
    assert!(r.settings.contains_key("net.core.somaxconn"));
    assert!(r.settings.contains_key("ulimit -n"));
    let levels = iolab_lab::lab::Plan::for_profile(iolab_lab::lab::Profile::Tiny).levels;
    for m in MODELS {
        for file in FileKind::ALL {
            for &c in &levels {
                let p = r
                    .point(m, file, ConnMode::Close, c)
                    .unwrap_or_else(|| panic!("no point {m} {file} c={c}"));
                assert_eq!(p.repeats.len(), 1);
                let rep = &p.repeats[0];
                assert!(rep.requests > 0);
                // Every request is accounted for: ok + errors (+ unfinished) = requests.
                let unfinished = rep.errors_by_kind.get("unfinished").copied().unwrap_or(0);
                assert_eq!(
                    rep.ok + p.metrics.errors + unfinished,
                    rep.requests,
                    "{m} {file} c={c}"
                );
                if rep.ok > 0 {
                    assert!(p.metrics.mean_ms > 0.0 && p.metrics.p99_ms >= p.metrics.p50_ms);
                    assert!(p.metrics.rps > 0.0);
                }
                assert!(p.metrics.achieved_concurrency <= c as f64 * 1.01 + 0.01);
            }
        }
        // Keep-alive: run by duration, twice back to back (tiny), with the spread.
        let ka = r
            .point(m, FileKind::Small, ConnMode::KeepAlive, 10)
            .expect("keep-alive point");
        assert_eq!(ka.repeats.len(), 2, "{m}: keep-alive runs");
        for x in &ka.repeats {
            assert!(
                x.elapsed_s >= 0.45,
                "{m}: keep-alive run of {} s",
                x.elapsed_s
            );
            assert!(x.metrics.rps > 0.0);
        }
        assert!(ka.spread.rps[0] <= ka.metrics.rps && ka.metrics.rps <= ka.spread.rps[1]);
        // Efficiency: server CPU per request at the offered rate, both modes, positive.
        let e = r.efficiency.as_ref().expect("efficiency block");
        for mode in ConnMode::REPORT_ORDER {
            let row = e
                .row(m, mode)
                .unwrap_or_else(|| panic!("no efficiency row {m} {mode}: {:?}", e.failures));
            assert_eq!(row.repeats.len(), 2);
            assert!(row.rate > 0.0);
            for x in &row.repeats {
                assert!(x.ok > 0, "{m} {mode}: nothing answered");
                assert!(x.cpu_s > 0.0, "{m} {mode}: no server CPU time read");
                // Plausible: between 1 µs and 10 ms of CPU per request.
                assert!(
                    x.us_per_request > 1.0 && x.us_per_request < 10_000.0,
                    "{m} {mode}: {} us per request",
                    x.us_per_request
                );
                // Open loop: the answered rate follows the offered one.
                assert!(
                    x.achieved_rps > 0.5 * row.rate,
                    "{m} {mode}: {} req/s answered of {} offered",
                    x.achieved_rps,
                    row.rate
                );
            }
            assert!(row.spread[0] <= row.us_per_request && row.us_per_request <= row.spread[1]);
            // And at the second rate, a tenth of the lowest peak (half is the main one).
            let low = e
                .row_at(m, mode, true)
                .unwrap_or_else(|| panic!("no low-rate row {m} {mode}: {:?}", e.failures));
            assert!(low.rate > 0.0 && low.rate < row.rate, "{low:?}");
            assert!(
                low.repeats.iter().all(|x| x.ok > 0 && x.cpu_s > 0.0),
                "{low:?}"
            );
        }
        // Figure 2's data at the top level.
        let top = *levels.last().unwrap();
        let p = r.point(m, FileKind::Small, ConnMode::Close, top).unwrap();
        let t = p.trace.as_ref().expect("trace at the top level");
        assert!(!t.scatter.is_empty());
        // Its per-request log exists, with a header and one line per request.
        let log = p.repeats[0].log.as_ref().expect("log at the top level");
        let csv = std::fs::read_to_string(dir.join(log)).unwrap();
        let mut lines = csv.lines();
        assert!(lines
            .next()
            .unwrap()
            .starts_with("scheduled_us,start_us,connected_us"));
        assert_eq!(lines.count() as u64, p.repeats[0].requests);
    }
    // Seed vs iolab: every seed server has a row; the measured analogue is filled in.
    let t = r.seed_vs_iolab.as_ref().expect("seed_vs_iolab block");
    assert_eq!(t.rows.len(), 9);
    assert!(
        t.our_conditions.contains("loopback"),
        "{}",
        t.our_conditions
    );
    let thread = t.rows.iter().find(|x| x.seed_server == "thread").unwrap();
    assert!(thread.measured && thread.ours_small_mean_ms.unwrap() > 0.0);
    assert_eq!(thread.seed_errors, 18608);
    assert!(!thread.why.is_empty());
    // No server is left running.
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(
        !ps.lines()
            .any(|l| l.contains("iolab serve") && l.contains(dir.to_str().unwrap())),
        "a server outlived the lab"
    );
    done();
}

/// Every object key path of `v` (`.points[].repeats[].ok`), with the keys of maps whose keys
/// are data (error kinds, failed benchmarks) collapsed to `*`.
fn key_paths(v: &serde_json::Value, path: &str, out: &mut std::collections::BTreeSet<String>) {
    const DATA_KEYED: [&str; 2] = ["errors_by_kind", "micro_failures"];
    match v {
        serde_json::Value::Object(m) => {
            let collapse = DATA_KEYED.iter().any(|k| path.ends_with(&format!(".{k}")));
            for (k, x) in m {
                let p = format!("{path}.{}", if collapse { "*" } else { k.as_str() });
                out.insert(p.clone());
                key_paths(x, &p, out);
            }
        }
        serde_json::Value::Array(a) => {
            for x in a {
                key_paths(x, &format!("{path}[]"), out);
            }
        }
        _ => {}
    }
}

/// results.json is read by people's scripts: its keys are a contract. tests/data/lab-tiny-keys.txt
/// holds the key paths this same run gave before the code was restructured (issue 42); a
/// renamed, lost or new key fails here (error kinds appear only when a run has errors).
#[test]
fn results_json_keeps_its_keys() {
    let text = std::fs::read_to_string(report().join("results.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut got = std::collections::BTreeSet::new();
    key_paths(&v, "", &mut got);
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/lab-tiny-keys.txt");
    let want: std::collections::BTreeSet<String> = std::fs::read_to_string(golden)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    // An efficiency run's error kinds are written only when it had errors (issue 45).
    let optional = |p: &String| {
        p.contains(".errors_by_kind.*") || p == ".efficiency.rows[].repeats[].errors_by_kind"
    };
    let lost: Vec<_> = want.difference(&got).filter(|p| !optional(p)).collect();
    let new: Vec<_> = got.difference(&want).filter(|p| !optional(p)).collect();
    assert!(
        lost.is_empty() && new.is_empty(),
        "results.json keys changed; lost: {lost:?}; new: {new:?}"
    );
    done();
}

#[test]
fn index_html_figures_parse() {
    let dir = report();
    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    let marks = iolab_lab::validate::svg_marks(&html).expect("every SVG parses");
    // Figures 1 and 3 (curves), 1b (CPU per request), 2 and 4 (one panel per model),
    // keep-alive, the seeder's two (--seed-bench). No micro section here (--no-micro).
    assert_eq!(marks.svgs, 2 + 1 + 2 * MODELS.len() + 1 + 2, "SVG count");
    // Small enough to open (a quick run over every server stays under 1 MB too: see the
    // report's unit tests).
    assert!(html.len() < 1_000_000, "index.html is {} bytes", html.len());
    assert!(marks.paths >= 2, "curves drawn");
    assert!(marks.circles > 20, "markers and scatter drawn");
    for s in [
        "Figure 1",
        "Figure 2",
        "Errors at concurrency",
        "Keep-alive throughput",
        "Figure 1b",
        "CPU µs per request",
        "Seed 000 next to iolab",
        "why ours differs",
        "Machine and settings",
        "BitTorrent seeder: Hekate and libtorrent",
        "Upload rate against peers",
        "hekate-pread (cold)",
        "libtorrent-hps (cold)",
        "libtorrent-default (warm)",
    ] {
        assert!(html.contains(s), "index.html lacks {s:?}");
    }
    done();
}

#[test]
fn chromium_renders_the_figures() {
    let dir = report();
    let page = dir.join("index.html");
    // The DOM after load: Chromium parsed every figure as SVG with its marks.
    let Some(dom) = iolab_sys::testing::chromium_renders(&page) else {
        return;
    };
    let chromium = iolab_sys::testing::chromium().expect("found just now");
    let marks = iolab_lab::validate::svg_marks(&dom).expect("SVGs in the rendered DOM parse");
    let source = iolab_lab::validate::svg_marks(&std::fs::read_to_string(&page).unwrap()).unwrap();
    assert_eq!(marks.svgs, source.svgs, "every figure reached the DOM");
    assert_eq!(marks.circles, source.circles);
    assert!(marks.paths > 0);

    // A screenshot of the report holds far more ink than one of a blank page the same size.
    let scratch = iolab_sys::testing::tempdir("lab-shots").unwrap();
    let shots = scratch.path();
    let blank = shots.join("blank.html");
    std::fs::write(&blank, "<!DOCTYPE html><html><body></body></html>").unwrap();
    let size = |page: &Path, name: &str| {
        let png = shots.join(name);
        iolab_sys::testing::headless_chromium(
            &chromium,
            &[
                &format!("--screenshot={}", png.display()),
                "--window-size=1300,2400",
            ],
            page,
        );
        std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0)
    };
    let blank_size = size(&blank, "blank.png");
    let report_size = size(&page, "report.png");
    assert!(blank_size > 0, "no screenshot written");
    assert!(
        report_size > 10 * blank_size,
        "the report renders almost blank: {report_size} vs blank {blank_size} bytes"
    );
    done();
}

/// `iolab serve` processes whose command line mentions `needle`.
fn servers_with(needle: &str) -> Vec<String> {
    common::processes(|l| l.contains(" serve ") && l.contains(needle))
}

#[test]
fn ctrl_c_stops_every_server() {
    let scratch = iolab_sys::testing::tempdir("lab-sigint").unwrap();
    let dir = scratch.path();
    let mut lab = Command::new(env!("CARGO_BIN_EXE_iolab"))
        .args([
            "lab",
            "--profile",
            "tiny",
            "--models",
            "threads,epoll",
            "--peers",
            "none",
            "--no-micro",
            "--repeat",
            "50",
            "--out",
        ])
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let needle = dir.to_str().unwrap().to_string();
    let t0 = std::time::Instant::now();
    while servers_with(&needle).is_empty() {
        assert!(t0.elapsed().as_secs() < 60, "no server started within 60 s");
        assert!(
            lab.try_wait().unwrap().is_none(),
            "the lab ended before a server started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let kill = Command::new("kill")
        .args(["-INT", &lab.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = lab.wait().unwrap();
    assert_eq!(status.code(), Some(130), "exit status after SIGINT");
    // The handler waits for its children; give the kernel a moment to reap them.
    let t1 = std::time::Instant::now();
    while !servers_with(&needle).is_empty() && t1.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        servers_with(&needle).is_empty(),
        "servers left behind: {:?}",
        servers_with(&needle)
    );
}

#[test]
fn the_micro_section_renders_a_real_benchmark() {
    let scratch = iolab_sys::testing::tempdir("lab-micro").unwrap();
    let dir = scratch.path();
    run_ok(
        Command::new(env!("CARGO_BIN_EXE_iolab"))
            .args([
                "lab",
                "--profile",
                "tiny",
                "--models",
                "epoll",
                "--peers",
                "none",
                "--micro",
                "limits",
                "--out",
            ])
            .arg(dir),
    );
    let r = iolab_lab::validate::load_results(dir).unwrap();
    assert!(
        r.micro_failures.is_empty(),
        "micro failed: {:?}",
        r.micro_failures
    );
    let limits = r.micro.get("limits").expect("limits JSON in results.json");
    let tables = limits["tables"].as_array().expect("tables");
    assert!(!tables.is_empty());
    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    assert!(html.contains("<h3>limits</h3>"));
    // Every table title of the benchmark reaches the page.
    for t in tables {
        let title = t["title"].as_str().unwrap();
        assert!(
            html.contains(&iolab_lab::svg::esc(title)),
            "table {title:?} missing"
        );
    }
    iolab_lab::validate::check_report(dir).unwrap();
}
