//! Issue 43 §1: in the direct topology the client's namespace is wired to the BE's (link E,
//! DP's way to the client), and Linux takes packets for a local address on any interface:
//! a client that routes the BE's and DP's addresses via link E reached both. Before the
//! fix it got the BE's shortcut answer (an `X-Disc` head for a payload DP then handed to
//! anyone) and DP's control port. Now both close such connections unread, counted.

use std::process::Command;

use iolab_disc::chain::{write_payloads, Chain, ChainConfig};
use iolab_disc::control::Refusal;
use iolab_disc::proxy::DiscMode;

mod common;

/// `ip netns exec NS ARGS...`: its output.
fn in_ns(ns: &str, args: &[&str]) -> std::process::Output {
    Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .expect("running ip netns exec")
}

#[test]
fn the_client_cannot_reach_the_be_or_dp_through_link_e() {
    if !common::bpf_ready("the link E reachability test", "namespaces, eBPF") {
        return;
    }
    let dir = iolab_sys::testing::tempdir("disc-reach").unwrap();
    let root = dir.path().join("www");
    write_payloads(&root, &[65536]).unwrap();
    let c = Chain::start(&ChainConfig::new(root, DiscMode::Direct)).expect("the chain");
    let store = c.store.clone().unwrap();
    let e = c.be_link_e.expect("direct mode has link E").to_string();
    // The client's own routes to the BE's and DP's addresses, via the BE's end of link E.
    for target in [c.be.ip(), c.dp.ip()] {
        let out = in_ns(
            &c.client_ns,
            &["ip", "route", "add", &format!("{target}/32"), "via", &e],
        );
        assert!(out.status.success(), "{out:?}");
    }
    let curl = |url: String, extra: &[&str]| {
        let mut args = vec!["curl", "-sS", "-i", "--noproxy", "*", "--max-time", "5"];
        args.extend_from_slice(extra);
        args.push(&url);
        in_ns(&c.client_ns, &args)
    };
    // A request offering the shortcut, straight to the BE.
    let be = curl(
        format!("http://{}/f65536.bin", c.be),
        &["-H", "X-Disc-Path: nb=1;bypass=1"],
    );
    let head = String::from_utf8_lossy(&be.stdout).to_string();
    assert!(!head.to_ascii_lowercase().contains("x-disc"), "{head}");
    assert!(!be.status.success(), "the BE answered the client: {head}");
    // DP's control port: closed before a greeting.
    let dp = curl(format!("http://{}/", c.dp), &["--http0.9"]);
    assert!(
        dp.stdout.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&dp.stdout)
    );
    assert!(store.refused(Refusal::Upstream) >= 1);
    assert!(store.refused(Refusal::Peer) >= 1);
    assert_eq!(store.counts().0, 0, "no payload kept for the client");
    // The chain itself still serves the client, by the shortcut.
    let via = curl(format!("http://{}/f65536.bin", c.fe), &["-o", "/dev/null"]);
    assert!(via.status.success(), "{via:?}");
    assert_eq!(store.counts(), (1, 1));
    c.stop().unwrap();
}
