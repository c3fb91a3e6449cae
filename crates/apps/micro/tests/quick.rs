//! Every microbenchmark of this crate in `--quick` mode, through the entry point `iolab micro`
//! calls (`run_named`): it must give well-formed JSON that follows the convention of `lib.rs`, with plausible values.
//! The benchmarks are run one at a time (they pin CPUs and measure time).

use std::sync::Mutex;

use serde_json::Value;

static SERIAL: Mutex<()> = Mutex::new(());

fn run_quick(name: &str) -> Value {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let v = iolab_micro::run_named(name, &iolab_micro::Opts { quick: true })
        .unwrap_or_else(|e| panic!("micro {name} --quick failed: {e:#}"));
    // As `iolab micro --json` writes it, and read back.
    let text = serde_json::to_string_pretty(&v).unwrap();
    let v: Value = serde_json::from_str(&text).expect("well-formed JSON");
    check_convention(name, &v);
    v
}

/// The JSON convention: machine, tables (rows as wide as the columns), figures (finite points).
fn check_convention(name: &str, v: &Value) {
    assert!(
        v["machine"]["kernel"]
            .as_str()
            .is_some_and(|k| !k.is_empty()),
        "{name}: machine"
    );
    let tables = v["tables"]
        .as_array()
        .unwrap_or_else(|| panic!("{name}: tables"));
    assert!(!tables.is_empty(), "{name}: no table");
    for t in tables {
        assert!(
            t["title"].as_str().is_some_and(|s| !s.is_empty()),
            "{name}: table title"
        );
        let cols = t["columns"].as_array().expect("columns").len();
        let rows = t["rows"].as_array().expect("rows");
        assert!(!rows.is_empty(), "{name}: empty table {}", t["title"]);
        for r in rows {
            assert_eq!(
                r.as_array().expect("row").len(),
                cols,
                "{name}: row width in {}",
                t["title"]
            );
        }
    }
    for f in v["figures"]
        .as_array()
        .unwrap_or_else(|| panic!("{name}: figures"))
    {
        for key in ["title", "x_label", "y_label"] {
            assert!(f[key].is_string(), "{name}: figure {key}");
        }
        assert!(
            f["log_x"].is_boolean() && f["log_y"].is_boolean(),
            "{name}: figure axes"
        );
        for s in f["series"].as_array().expect("series") {
            assert!(s["name"].is_string());
            for p in s["points"].as_array().expect("points") {
                let xy: Vec<f64> = p
                    .as_array()
                    .expect("point")
                    .iter()
                    .filter_map(Value::as_f64)
                    .collect();
                assert_eq!(xy.len(), 2, "{name}: point {p}");
                assert!(xy.iter().all(|x| x.is_finite()), "{name}: point {p}");
                if f["log_x"] == true {
                    assert!(xy[0] > 0.0, "{name}: log x point {p}");
                }
                if f["log_y"] == true {
                    assert!(xy[1] > 0.0, "{name}: log y point {p}");
                }
            }
        }
    }
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

#[test]
fn ctxswitch_quick() {
    let v = run_quick("ctxswitch");
    let cases = v["cases"].as_array().expect("cases");
    assert_eq!(
        cases.len(),
        24,
        "futex|pipe x thread|process x 3 placements x normal|FIFO"
    );
    let ok: Vec<&Value> = cases.iter().filter(|c| c["status"] == "ok").collect();
    assert!(ok
        .iter()
        .any(|c| c["mechanism"] == "futex" && c["between"] == "thread" && c["policy"] == "normal"));
    for c in &ok {
        let ns = f(&c["ns_per_switch"]);
        assert!(
            (50.0..1_000_000.0).contains(&ns),
            "ns per switch {ns} in {c}"
        );
        let inv = f(&c["involuntary_pct"]);
        assert!((0.0..=100.0).contains(&inv), "{c}");
        assert!(c["round_trips"].as_u64().unwrap() > 0);
    }
    for c in cases.iter().filter(|c| c["status"] != "ok") {
        let s = c["status"].as_str().unwrap();
        assert!(s == "not permitted" || s.starts_with("n/a"), "{c}");
    }
    let sys = f(&v["syscall_ns"]);
    assert!((5.0..100_000.0).contains(&sys), "syscall {sys} ns");
    let th = f(&v["thread_create_join_ns"]);
    assert!(
        (1_000.0..100_000_000.0).contains(&th),
        "thread create+join {th} ns"
    );
}

#[test]
fn queue_quick() {
    let v = run_quick("queue");
    let points = v["points"].as_array().expect("points");
    let depths = v["depths"].as_array().expect("depths").len();
    assert!(depths >= 3);
    assert_eq!(points.len(), depths * 9, "9 queue variants per depth");
    for p in points {
        if p["variant"].as_str().unwrap().starts_with("io_uring") && p["status"] != "ok" {
            // A kernel without io_uring (or MSG_RING) reports why instead of a figure.
            assert!(p["status"].as_str().is_some_and(|s| !s.is_empty()));
            continue;
        }
        assert_eq!(p["status"], "ok", "{p}");
        let ns = f(&p["ns_per_pair"]);
        assert!(ns > 0.0 && ns < 10_000_000.0, "{p}");
        assert!(p["pairs"].as_u64().unwrap() > 0);
    }
    // A plain deque is cheaper than a round trip through the kernel.
    let at = |name: &str| {
        points
            .iter()
            .find(|p| p["variant"] == name && p["depth"] == 1)
            .map(|p| f(&p["ns_per_pair"]))
    };
    let dq = at("VecDeque (single thread)").unwrap();
    if let Some(ring) = at("io_uring NOP, 1+1").filter(|x| x.is_finite()) {
        assert!(ring > dq, "io_uring {ring} ns vs VecDeque {dq} ns");
    }
    assert!(v["main_result"].as_str().is_some_and(|s| !s.is_empty()));
}

#[test]
fn syscalls_quick() {
    let v = run_quick("syscalls");
    let points = v["points"].as_array().expect("points");
    let windows = v["windows"].as_array().unwrap().len();
    assert_eq!(points.len(), 9 * windows);
    for p in points
        .iter()
        .filter(|p| !p["variant"].as_str().unwrap().contains("io_uring"))
    {
        assert_eq!(p["status"], "ok", "{p}");
    }
    for p in points.iter().filter(|p| p["status"] == "ok") {
        let r = f(&p["ops_per_s"]);
        assert!(r > 100.0 && r < 1e9, "{p}");
        let ratio = f(&p["ratio"]);
        assert!(ratio > 0.0 && ratio < 100.0, "{p}");
    }
    let base = points
        .iter()
        .find(|p| p["variant"] == "read/write (baseline)")
        .unwrap();
    assert_eq!(f(&base["ratio"]), 1.0);
}

#[test]
fn echo_quick() {
    let v = run_quick("echo");
    let points = v["points"].as_array().expect("points");
    for model in [
        "threads",
        "select",
        "poll",
        "epoll",
        "io_uring",
        "iolab-runtime",
    ] {
        let first = points
            .iter()
            .find(|p| p["model"] == model)
            .unwrap_or_else(|| panic!("{model}"));
        if model == "io_uring"
            && first["status"]
                .as_str()
                .is_some_and(|s| s.contains("io_uring setup"))
        {
            continue;
        }
        assert_eq!(first["held"], first["clients"], "{first}");
        assert!(f(&first["msgs_per_s"]) > 0.0, "{first}");
        let p99 = f(&first["p99_us"]);
        assert!(p99 > 0.0 && p99 < 60_000_000.0, "{first}");
        let cpu = f(&first["server_cpu_pct"]);
        assert!((0.0..=150.0).contains(&cpu), "{first}");
        assert!(v["max_held"][model].as_u64().unwrap() >= 10);
    }
    assert!(v["runtime_status"].is_string());
}

#[test]
fn limits_quick() {
    let v = run_quick("limits");
    assert_eq!(v["fd_setsize"], 1024);
    assert_eq!(v["select"]["highest_fd_in_fd_set"], 1023);
    let tw = v["time_wait"].as_array().expect("two TIME_WAIT runs");
    assert_eq!(tw.len(), 2);
    for run in tw {
        assert_eq!(run["time_wait_sockets"], run["requests"], "{run}");
        assert_eq!(
            run["rebind_without_reuseaddr"], "fails: EADDRINUSE",
            "{run}"
        );
    }
    assert_eq!(tw[1]["rebind_with_reuseaddr"], "bound");
    let p = &v["ports"];
    let range = p["range"].as_array().unwrap();
    let width = range[1].as_u64().unwrap() - range[0].as_u64().unwrap() + 1;
    assert_eq!(p["per_destination"].as_u64(), Some(width));
    if let Some(held) = p["held_before_eaddrnotavail"].as_u64() {
        assert!(held > 0 && held <= 32, "{p}");
        assert!(p["per_request_ok"].as_u64().unwrap() >= held.min(1), "{p}");
    }
}
