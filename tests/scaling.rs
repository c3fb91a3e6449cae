//! End to end: `iolab lab --scaling --profile tiny` measures requests/s against server
//! workers for the three models, both modes, and writes the figure, table and JSON block.

use std::process::Command;

#[test]
fn scaling_writes_the_table_the_figures_and_the_json_block() {
    let dir = std::env::temp_dir().join(format!("iolab-scaling-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_iolab"))
        .args([
            "lab",
            "--scaling",
            "--profile",
            "tiny",
            "--peers",
            "none",
            "--out",
        ])
        .arg(&dir)
        .output()
        .expect("running iolab lab --scaling");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "iolab lab --scaling failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("| uring-fixed"), "{stdout}");
    let r = iolab_lab::validate::load_results(&dir).unwrap();
    let s = r.scaling.as_ref().expect("a scaling block");
    assert!(!s.server_cpus.is_empty() && !s.client_cpus.is_empty());
    assert!(s.server_cpus.iter().all(|c| !s.client_cpus.contains(c)));
    assert_eq!(s.workers.last(), Some(&s.server_cpus.len()));
    for m in ["epoll", "uring-fixed", "runtime"] {
        for mode in iolab_lab::results::ConnMode::REPORT_ORDER {
            for &w in &s.workers {
                let row = s
                    .rows
                    .iter()
                    .find(|x| x.server == m && x.mode == mode && x.workers == w)
                    .unwrap_or_else(|| panic!("no row {m} {mode} w={w}: {:?}", s.failures));
                assert!(row.rps > 0.0, "{row:?}");
                assert!(row.rps_spread[0] <= row.rps && row.rps <= row.rps_spread[1]);
            }
        }
    }
    if s.server_cpus.len() == 1 {
        assert!(s.note.contains("one point per server"), "{}", s.note);
    }
    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    assert!(html.contains(r#"id="scaling""#));
    let marks = iolab_lab::validate::svg_marks(&html).expect("every SVG parses");
    assert_eq!(marks.svgs, 2, "one figure per mode");
    let _ = std::fs::remove_dir_all(&dir);
}
