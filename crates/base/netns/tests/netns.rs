//! Real namespaces, veths and qdiscs: made, used, shaped and removed, also when the owner is
//! SIGKILLed (stale cleanup) or SIGTERMed (the signal handler). Needs root and iproute2;
//! without them each test says why and skips (under CI=true that is a failure).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use iolab_netns::{link_names, namespace_names, Net, Shape};

const TAG: &str = "tst";

fn usable() -> bool {
    match iolab_netns::preflight() {
        Ok(()) => true,
        Err(e) => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("netns tests need root and iproute2 under CI: {e:#}");
            }
            eprintln!("SKIPPED: {e:#} (Debian package iproute2, run as root)");
            false
        }
    }
}

/// A namespace joined to ours by a veth pair with addresses: (guard, ns, our end, their
/// end, our address, their address).
fn pair() -> (
    Net,
    iolab_netns::Namespace,
    iolab_netns::Iface,
    iolab_netns::Iface,
    Ipv4Addr,
    Ipv4Addr,
) {
    let mut net = Net::new(TAG).unwrap();
    let ns = net.namespace().unwrap();
    let (a, b) = net.veth(None, Some(&ns)).unwrap();
    let [x, y, z] = iolab_netns::free_subnet().unwrap();
    let ours = Ipv4Addr::new(x, y, z, 1);
    let theirs = Ipv4Addr::new(x, y, z, 2);
    a.add_addr(&format!("{ours}/24")).unwrap();
    b.add_addr(&format!("{theirs}/24")).unwrap();
    a.up().unwrap();
    b.up().unwrap();
    (net, ns, a, b, ours, theirs)
}

#[test]
fn create_shape_use_remove() {
    if !usable() {
        return;
    }
    let (net, ns, a, b, _ours, theirs) = pair();
    assert!(namespace_names().unwrap().contains(&ns.name().to_string()));
    assert!(link_names(None).unwrap().contains(&a.name));
    assert!(link_names(Some(ns.name())).unwrap().contains(&b.name));

    // Shape their end (what they send to us) to 10 Mbit/s and read it back.
    b.shape(&Shape::rate(10_000_000)).unwrap();
    let q = b.qdiscs().unwrap();
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(q[0].kind, "tbf");
    assert_eq!(q[0].parent, "root");
    assert_eq!(q[0].rate_bps, Some(10_000_000));
    assert!(b.qdisc_text().unwrap().contains("tbf"));
    // Shaping again replaces the qdisc instead of failing.
    b.shape(&Shape::rate(20_000_000)).unwrap();
    b.shape(&Shape::rate(10_000_000)).unwrap();

    // 2 MB from inside the namespace at 10 Mbit/s takes at least 1.6 s (less the bucket):
    // the shaping is real. (Only a lower bound: a busy machine can only make it slower.)
    let l = ns.tcp_listener(SocketAddr::from((theirs, 0))).unwrap();
    let port = l.local_addr().unwrap().port();
    const N: usize = 2_000_000;
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.write_all(&vec![7u8; N]).unwrap();
    });
    let t = Instant::now();
    let mut c = TcpStream::connect(SocketAddr::from((theirs, port))).unwrap();
    let mut got = Vec::new();
    c.read_to_end(&mut got).unwrap();
    let took = t.elapsed();
    server.join().unwrap();
    assert_eq!(got.len(), N);
    assert!(
        took >= Duration::from_millis(1200),
        "2 MB at 10 Mbit/s took only {took:?}: not shaped"
    );

    // A program run inside sees the namespace's links, not ours.
    let out = ns.run("ip", &["-o", "link", "show"]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&b.name), "{text}");
    assert!(!text.contains(&a.name), "{text}");

    let names = net.names();
    assert_eq!(names.len(), 2);
    net.remove().unwrap();
    assert!(!namespace_names().unwrap().contains(&ns.name().to_string()));
    assert!(!ns.exists());
    assert!(!link_names(None).unwrap().contains(&a.name));
}

#[test]
fn drop_removes_everything() {
    if !usable() {
        return;
    }
    let (ns, a) = {
        let (_net, ns, a, b, _, _) = pair();
        b.shape(&Shape::rate(50_000_000)).unwrap();
        a.shape(&Shape::rate(50_000_000)).unwrap();
        assert!(ns.exists() && a.exists());
        (ns, a)
    };
    assert!(!ns.exists());
    assert!(!a.exists());
    assert!(!link_names(None).unwrap().contains(&a.name));
}

#[test]
fn netem_delay_and_rate() {
    if !usable() {
        return;
    }
    let (_net, _ns, a, _b, _, _) = pair();
    let s = Shape::rate(100_000_000).with_delay(Duration::from_millis(5));
    if !iolab_netns::netem_available() {
        let e = a.shape(&s).unwrap_err().to_string();
        assert!(e.contains("netem"), "{e}");
        eprintln!(
            "SKIPPED: this kernel ({}) has no sch_netem; delay shaping refused with a clear error",
            iolab_netns::kernel_release()
        );
        return;
    }
    a.shape(&s).unwrap();
    let q = a.qdiscs().unwrap();
    assert!(q
        .iter()
        .any(|q| q.kind == "tbf" && q.rate_bps == Some(100_000_000)));
    assert!(q
        .iter()
        .any(|q| q.kind == "netem" && q.delay_us == Some(5000)));
}

#[test]
fn bad_tags_are_refused() {
    assert!(Net::new("toolong").is_err());
    assert!(Net::new("").is_err());
    assert!(iolab_netns::cleanup_stale("A-b").is_err());
}

/// Not a test on its own: the child process of the two tests below (run with --ignored
/// and IOLAB_NETNS_HOLD set) makes a namespace and a veth, prints their names, and waits.
#[test]
#[ignore = "the child process of the SIGKILL and SIGTERM tests"]
fn hold_helper() {
    assert!(
        std::env::var_os("IOLAB_NETNS_HOLD").is_some(),
        "only run as the helper of the SIGKILL / SIGTERM tests"
    );
    let (net, ns, a, b, _, _) = pair();
    b.shape(&Shape::rate(100_000_000)).unwrap();
    println!("NAMES {} {}", ns.name(), a.name);
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(60));
    drop(net);
}

/// Starts the helper; returns it with the namespace and veth it made.
fn spawn_holder() -> (std::process::Child, String, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "hold_helper",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("IOLAB_NETNS_HOLD", "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = loop {
        let l = lines.next().expect("helper ended early").unwrap();
        // libtest prints "test hold_helper ... " on the same line first.
        if let Some((_, rest)) = l.split_once("NAMES ") {
            break rest.to_string();
        }
    };
    let mut it = line.split_whitespace();
    let ns = it.next().unwrap().to_string();
    let veth = it.next().unwrap().to_string();
    assert!(namespace_names().unwrap().contains(&ns));
    assert!(link_names(None).unwrap().contains(&veth));
    (child, ns, veth)
}

#[test]
fn stale_resources_of_a_killed_owner_are_removed() {
    if !usable() {
        return;
    }
    // A live owner's resources with the same tag must survive the cleanup.
    let (live, live_ns, live_a, _, _, _) = pair();
    let (mut child, ns, veth) = spawn_holder();
    child.kill().unwrap(); // SIGKILL: no handler runs
    child.wait().unwrap();
    assert!(namespace_names().unwrap().contains(&ns), "left behind");
    let removed = iolab_netns::cleanup_stale(TAG).unwrap();
    // (Another test process running the same cleanup at once may have been first.)
    assert!(removed.contains(&ns) || !namespace_names().unwrap().contains(&ns));
    assert!(removed.contains(&veth) || !link_names(None).unwrap().contains(&veth));
    assert!(!namespace_names().unwrap().contains(&ns));
    assert!(!link_names(None).unwrap().contains(&veth));
    assert!(live_ns.exists(), "a live owner's namespace was removed");
    assert!(live_a.exists(), "a live owner's veth was removed");
    // Another tag's cleanup never sees ours.
    assert!(iolab_netns::cleanup_stale("zz").unwrap().is_empty());
    live.remove().unwrap();
}

#[test]
fn sigterm_removes_everything_and_exits_143() {
    if !usable() {
        return;
    }
    let (child, ns, veth) = spawn_holder();
    // Our own child, not waited for yet: its pid is still its own.
    iolab_sys::process::signal(child.id(), libc::SIGTERM).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(143), "{:?}", out.status);
    assert!(!namespace_names().unwrap().contains(&ns));
    assert!(!link_names(None).unwrap().contains(&veth));
}
