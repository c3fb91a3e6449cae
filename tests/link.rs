//! End to end: `iolab lab --seed-conditions --profile tiny` puts the server behind a real
//! 100 Mbit/s link: the namespace and the tbf qdisc exist while it runs and are gone after
//! it, after a SIGTERM mid-run (exit 143), and after a SIGKILL (the next run removes them).
//! Needs root and iproute2; without them the tests skip with one line (a failure under CI).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn usable() -> bool {
    match iolab_netns::preflight() {
        Ok(()) => true,
        Err(e) => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("the link tests need root and iproute2 under CI: {e:#}");
            }
            eprintln!("SKIPPED: {e:#} (Debian package iproute2, run as root)");
            false
        }
    }
}

fn start_lab(out: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_iolab"))
        .args([
            "lab",
            "--profile",
            "tiny",
            "--seed-conditions",
            "--models",
            "epoll",
            "--peers",
            "none",
            "--out",
        ])
        .arg(out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting iolab lab")
}

/// The namespaces and root-namespace veth ends owned by process `pid`.
fn owned_by(pid: u32) -> (Vec<String>, Vec<String>) {
    let ns = iolab_netns::namespace_names()
        .unwrap()
        .into_iter()
        .filter(|n| iolab_netns::names::namespace_owner("lab", n) == Some(pid))
        .collect();
    let links = iolab_netns::link_names(None)
        .unwrap()
        .into_iter()
        .filter(|n| iolab_netns::names::veth_owner("lab", n) == Some(pid))
        .collect();
    (ns, links)
}

fn tc_show(dev: &str) -> String {
    let out = Command::new("tc")
        .args(["qdisc", "show", "dev", dev])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until `pid` owns a namespace and a veth carrying a 100 Mbit/s tbf.
fn wait_for_link(child: &mut Child) -> (String, String) {
    let pid = child.id();
    let t0 = Instant::now();
    loop {
        let (ns, links) = owned_by(pid);
        if let (Some(n), Some(l)) = (ns.first(), links.first()) {
            let q = tc_show(l);
            if q.contains("tbf") && q.contains("rate 100Mbit") {
                return (n.clone(), l.clone());
            }
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("iolab lab ended ({st}) before its link was seen");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no namespace with a 100 Mbit/s tbf after 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn assert_gone(pid: u32, ns: &str, veth: &str) {
    let (n, l) = owned_by(pid);
    assert!(n.is_empty() && l.is_empty(), "left behind: {n:?} {l:?}");
    assert!(!iolab_netns::namespace_exists(ns));
    assert!(!iolab_netns::link_names(None)
        .unwrap()
        .contains(&veth.to_string()));
}

fn no_server_left(out: &std::path::Path) {
    std::thread::sleep(Duration::from_millis(300));
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(
        !ps.lines()
            .any(|l| l.contains("iolab serve") && l.contains(out.to_str().unwrap())),
        "a server outlived the lab"
    );
}

#[test]
fn seed_conditions_make_the_link_and_remove_it() {
    if !usable() {
        return;
    }
    // First a run killed outright: its namespace and veth stay behind...
    let killed_scratch = iolab_sys::testing::tempdir("link-killed").unwrap();
    let killed_out = killed_scratch.path();
    let mut killed = start_lab(killed_out);
    let (kns, kveth) = wait_for_link(&mut killed);
    killed.kill().unwrap();
    killed.wait().unwrap();
    assert!(iolab_netns::namespace_exists(&kns), "SIGKILL cannot clean");

    // ...and the next run removes them at its start, then builds its own link.
    let scratch = iolab_sys::testing::tempdir("link-seed").unwrap();
    let out = scratch.path();
    let mut lab = start_lab(out);
    let pid = lab.id();
    let (ns, veth) = wait_for_link(&mut lab);
    assert_gone(killed.id(), &kns, &kveth);
    let o = lab.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "iolab lab failed: {stderr}");
    assert!(stderr.contains("measured"), "{stderr}");
    assert_gone(pid, &ns, &veth);
    no_server_left(out);

    // Recorded with the results: rate, qdisc read back, backlog, measured throughput.
    let r = iolab_lab::validate::load_results(out).unwrap();
    let link = r.link.as_ref().expect("a link block in results.json");
    assert_eq!(link.rate_bps, 100_000_000);
    assert_eq!(link.backlog, 200);
    assert!(link.seed_conditions);
    assert!(link.qdisc_server_end.contains("tbf"), "{link:?}");
    assert!(link.qdisc_client_end.contains("tbf"), "{link:?}");
    assert_eq!(link.client_addrs.len(), 8);
    // tbf caps what the link carries: the bulk transfer cannot beat the rate by more than
    // the bucket, and a 100 Mbit/s link that carried under half of it would be no link.
    for bps in [link.measured_down_bps, link.measured_up_bps] {
        assert!((50e6..=110e6).contains(&bps), "measured {bps} bit/s");
    }
    assert_eq!(
        link.namespace_sysctls
            .get("net.core.somaxconn")
            .map(|s| s.is_empty()),
        Some(false)
    );
    // The seed's method: a new connection per request only.
    assert!(!r.points.is_empty());
    assert!(r
        .points
        .iter()
        .all(|p| p.mode == iolab_lab::results::ConnMode::Close));
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains(r#"id="link""#));
}

#[test]
fn sigterm_mid_run_removes_the_link() {
    if !usable() {
        return;
    }
    let scratch = iolab_sys::testing::tempdir("link-term").unwrap();
    let out = scratch.path();
    let mut lab = start_lab(out);
    let pid = lab.id();
    let (ns, veth) = wait_for_link(&mut lab);
    // Let a server start inside the namespace.
    std::thread::sleep(Duration::from_secs(2));
    // Our own child, not yet waited for: the pid is still its own.
    iolab_sys::process::signal(pid, libc::SIGTERM).unwrap();
    let o = lab.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(143),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_gone(pid, &ns, &veth);
    no_server_left(out);
}
