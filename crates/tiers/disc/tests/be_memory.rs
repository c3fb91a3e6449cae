//! Issue 43 §2: the BE read every shortcut payload whole (`direct::answer`'s `read_whole`)
//! before the store's cap was checked: one GET of a 768 MiB file took its RSS from 73 to
//! 794 MB. Now a payload is the open file, read in pieces of `payload::CHUNK` as it is sent,
//! and one over the cap takes the normal path (streamed in 64 KiB pieces).
//!
//! A BE with an 8 MiB store and a 1 MiB cache, a 64 MiB sparse file (over the cap) and a
//! 1.5 MiB one (four fit under it; outside the cache: a file payload DP relays), four clients at once
//! fetching both: the process's peak RSS (VmHWM) grows by less than [`BOUND`]. This test is
//! alone in its binary, so VmHWM is the BE's (and the clients', which read 64 KiB at a time).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use iolab_disc::control::{ControlKey, Signer};

/// The most the peak RSS may grow: four clients' shortcut payloads and streams in flight.
const BOUND: u64 = 24 << 20;
const BIG: u64 = 64 << 20;
const MID: u64 = 1536 << 10;

fn vm_hwm() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status");
    kb << 10
}

/// A GET offering the shortcut; the head, and the body's length read (64 KiB at a time).
fn get(be: SocketAddr, path: &str) -> (String, u64) {
    let mut s = TcpStream::connect(be).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: be\r\nConnection: close\r\nX-Disc-Path: nb=1;bypass=1\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::with_capacity(64 << 10, s);
    let mut head = String::new();
    loop {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        head.push_str(&l);
        if l == "\r\n" || l.is_empty() {
            break;
        }
    }
    let mut buf = vec![0u8; 64 << 10];
    let mut n = 0u64;
    loop {
        match r.read(&mut buf).unwrap() {
            0 => break,
            k => n += k as u64,
        }
    }
    (head, n)
}

/// The payload named by an `X-Disc` head, fetched from DP: its length.
fn fetch(dp: SocketAddr, key: &ControlKey, head: &str) -> u64 {
    let id: u64 = head
        .lines()
        .find_map(|l| l.strip_prefix("X-Disc: id="))
        .and_then(|v| v.split(';').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no X-Disc in {head}"));
    let s = TcpStream::connect(dp).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut r = BufReader::with_capacity(64 << 10, s.try_clone().unwrap());
    let mut greeting = String::new();
    r.read_line(&mut greeting).unwrap();
    let nonce = iolab_disc::control::parse_greeting(greeting.trim_end()).unwrap();
    let line = Signer::new(key.clone(), nonce).line(&format!("FETCH {id}"));
    (&s).write_all(line.as_bytes()).unwrap();
    let mut ok = String::new();
    r.read_line(&mut ok).unwrap();
    let mut answers = iolab_disc::control::Verifier::answers(key.clone(), nonce);
    let ok = iolab_disc::control::check_answer(&mut answers, ok.trim_end()).unwrap();
    let size: u64 = ok.strip_prefix("OK ").unwrap().parse().unwrap();
    let mut buf = vec![0u8; 64 << 10];
    let mut n = 0;
    while n < size {
        n += r.read(&mut buf).unwrap() as u64;
    }
    drop(s);
    n
}

#[test]
fn the_be_never_holds_a_whole_file() {
    let dir = iolab_sys::testing::tempdir("disc-be-memory").unwrap();
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::File::create(root.join("big.bin"))
        .unwrap()
        .set_len(BIG)
        .unwrap();
    std::fs::write(root.join("mid.bin"), vec![3u8; MID as usize]).unwrap();
    let site = iolab_http::Site::with_cache(
        &root,
        iolab_http::Limits::default(),
        iolab_http::CacheConfig {
            max_cached_file: 1 << 20,
            ..Default::default()
        },
    )
    .unwrap();
    let store = iolab_disc::dp::Store::with_limits(iolab_disc::dp::JOB_TTL, 8 << 20);
    let key = ControlKey::random().unwrap();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dl = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (be, dp) = (l.local_addr().unwrap(), dl.local_addr().unwrap());
    let local = vec![std::net::Ipv4Addr::LOCALHOST.into()];
    let disc = iolab_disc::be::BeDisc {
        store: store.clone(),
        advertise: dp,
        policy: iolab_disc::proto::Policy {
            threshold: iolab_disc::proto::DEFAULT_THRESHOLD,
        },
        send: iolab_disc::dp::SendPath::Raw,
        ack_tap: false,
        access: Arc::new(iolab_disc::dp::Access {
            key: key.clone(),
            peers: local.clone(),
        }),
        upstreams: local,
    };
    let stop = iolab_disc::stop::Stop::new().unwrap();
    let s = stop.clone();
    let server = std::thread::spawn(move || {
        iolab_disc::be::run(l, Some(dl), site, Some(disc), Default::default(), s)
    });
    // Once up, the baseline.
    let (h, n) = get(be, "/mid.bin");
    assert_eq!(n, 0, "{h}");
    assert_eq!(fetch(dp, &key, &h), MID);
    let before = vm_hwm();
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let key = key.clone();
            std::thread::spawn(move || {
                let (h, n) = get(be, "/big.bin");
                assert!(h.starts_with("HTTP/1.1 200"), "{h}");
                assert!(!h.contains("X-Disc"), "over the cap: the normal path: {h}");
                assert_eq!(n, BIG);
                let (h, n) = get(be, "/mid.bin");
                assert!(h.contains("X-Disc: id="), "{h}");
                assert_eq!((n, fetch(dp, &key, &h)), (0, MID));
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let grew = vm_hwm().saturating_sub(before);
    stop.trigger();
    server.join().unwrap().unwrap();
    eprintln!("VmHWM grew by {:.1} MiB", grew as f64 / (1 << 20) as f64);
    assert!(grew < BOUND, "VmHWM grew by {grew} bytes");
    assert_eq!(store.usage(), (0, 0));
}
