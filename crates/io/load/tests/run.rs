//! `iolab_load::run` against real sockets: a std test server in this process.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{Mode, TestServer, BODY};
use iolab_load::{run, ErrorKind, LoadConfig};

fn config(url: &str, connections: usize, requests: u64) -> LoadConfig {
    let mut c = LoadConfig::for_url(url).unwrap();
    c.connections = connections;
    c.requests = Some(requests);
    c.timeout = Duration::from_secs(5);
    c.threads = 2;
    c
}

/// Bytes of one response of the Ok server.
fn ok_response_len(close: bool) -> u64 {
    let conn = if close { "close" } else { "keep-alive" };
    (format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: {conn}\r\n\r\n",
        BODY.len()
    )
    .len()
        + BODY.len()) as u64
}

#[test]
fn closed_loop_makes_exactly_n_requests_on_new_connections() {
    let server = TestServer::start(Mode::Ok);
    let c = config(&server.url("/page"), 8, 301);
    let r = run(&c).unwrap();
    assert_eq!(r.requests, 301);
    assert_eq!(r.ok, 301, "{:?}", r.errors);
    assert_eq!(r.error_count, 0);
    assert_eq!(r.records.len(), 301);
    assert_eq!(
        server.requests.load(std::sync::atomic::Ordering::Relaxed),
        301
    );
    assert_eq!(
        server
            .connections
            .load(std::sync::atomic::Ordering::Relaxed),
        301
    );
    assert_eq!(r.connects, 301);
    assert!(
        server
            .max_concurrent
            .load(std::sync::atomic::Ordering::Relaxed)
            <= 8
    );
    // Records: sorted by scheduled start, times in causal order, whole responses.
    let mut conn_ids = HashSet::new();
    for w in r.records.windows(2) {
        assert!(w[0].scheduled_us <= w[1].scheduled_us);
    }
    for rec in &r.records {
        assert!(rec.scheduled_us <= rec.start_us);
        let conn = rec.connected_us.unwrap();
        let first = rec.first_byte_us.unwrap();
        assert!(rec.start_us <= conn && conn <= first && first <= rec.end_us);
        assert_eq!(rec.status, Some(200));
        assert_eq!(rec.bytes, ok_response_len(true));
        assert!(
            conn_ids.insert(rec.conn_id),
            "connection reused without keep-alive"
        );
    }
    assert_eq!(r.bytes, 301 * ok_response_len(true));
    // Latency statistics are consistent.
    assert!(r.mean_ms > 0.0 && r.p50_ms > 0.0 && r.max_ms >= r.p99_ms && r.p99_ms >= r.p50_ms);
    let timeline_total: u64 = r.timeline.iter().map(|s| s.requests).sum();
    assert_eq!(timeline_total, 301);
}

#[test]
fn keepalive_reuses_one_connection_per_client() {
    let server = TestServer::start(Mode::Ok);
    let mut c = config(&server.url("/"), 4, 400);
    c.keepalive = true;
    let r = run(&c).unwrap();
    assert_eq!(r.ok, 400, "{:?}", r.errors);
    assert_eq!(
        server
            .connections
            .load(std::sync::atomic::Ordering::Relaxed),
        4
    );
    assert_eq!(r.connects, 4);
    let ids: HashSet<u64> = r.records.iter().map(|x| x.conn_id).collect();
    assert_eq!(ids.len(), 4);
    assert!(r.records.iter().all(|x| x.bytes == ok_response_len(false)));
}

#[test]
fn chunked_responses_are_complete() {
    let server = TestServer::start(Mode::Chunked);
    let mut c = config(&server.url("/"), 2, 50);
    c.keepalive = true;
    let r = run(&c).unwrap();
    assert_eq!(r.ok, 50, "{:?}", r.errors);
    assert_eq!(
        server
            .connections
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

#[test]
fn duration_run_counts_in_flight_requests_as_unfinished() {
    // Each response takes 200 ms; a 500 ms run ends with every client mid-request.
    let server = TestServer::start(Mode::Slow(200));
    let mut c = config(&server.url("/"), 3, 1);
    c.requests = None;
    c.duration = Some(Duration::from_millis(500));
    c.keepalive = true;
    let r = run(&c).unwrap();
    assert_eq!(r.unfinished, 3, "{:?}", r.errors);
    assert_eq!(r.errors_of(ErrorKind::Unfinished), 3);
    assert_eq!(r.error_count, 3);
    assert_eq!(r.requests, r.ok + 3);
    assert!(r.ok >= 3, "{}", r.ok);
    assert!((r.elapsed_s - 0.5).abs() < 1e-9, "{}", r.elapsed_s);
    let unfinished: Vec<_> = r
        .records
        .iter()
        .filter(|x| x.error == Some(ErrorKind::Unfinished))
        .collect();
    assert_eq!(unfinished.len(), 3);
    assert!(unfinished.iter().all(|x| x.first_byte_us.is_none()));
}

#[test]
fn open_loop_schedule_is_spaced_one_over_rate() {
    let server = TestServer::start(Mode::Ok);
    let mut c = config(&server.url("/"), 4, 200);
    c.rate = Some(1000.0);
    c.keepalive = true;
    let r = run(&c).unwrap();
    assert_eq!(r.requests, 200);
    assert_eq!(r.ok, 200, "{:?}", r.errors);
    for (i, rec) in r.records.iter().enumerate() {
        assert_eq!(rec.scheduled_us, i as u64 * 1000, "request {i}");
        assert!(rec.start_us >= rec.scheduled_us);
    }
    // The run lasts at least until the last scheduled request (199 ms).
    assert!(r.elapsed_s >= 0.199, "{}", r.elapsed_s);
}

#[test]
fn open_loop_counts_waiting_for_a_connection_in_the_latency() {
    // 2 connections to a server that takes 50 ms per request can serve 40 requests/s;
    // at 200 requests/s, requests queue up for a connection. An open-loop generator must
    // count that wait (no coordinated omission): the 40th request, due at 195 ms, cannot
    // end before 20 x 50 ms = 1 s, so it waited about 800 ms.
    let server = TestServer::start(Mode::Slow(50));
    let mut c = config(&server.url("/"), 2, 40);
    c.rate = Some(200.0);
    c.keepalive = true;
    let r = run(&c).unwrap();
    assert_eq!(r.ok, 40, "{:?}", r.errors);
    assert!(
        server
            .max_concurrent
            .load(std::sync::atomic::Ordering::Relaxed)
            <= 2
    );
    let last = r.records.last().unwrap();
    assert_eq!(last.scheduled_us, 195_000);
    assert!(last.end_us - last.scheduled_us >= 700_000, "{last:?}");
    assert!(r.max_ms >= 700.0, "{}", r.max_ms);
    assert!(r.schedule_lag_ms > 100.0, "{}", r.schedule_lag_ms);
    assert!(r.saturated && !r.warnings.is_empty());
}

#[test]
fn refused_on_a_closed_port() {
    let port = iolab_sys::testing::free_port().unwrap();
    let r = run(&config(&format!("http://127.0.0.1:{port}/"), 2, 10)).unwrap();
    assert_eq!(r.requests, 10);
    assert_eq!(r.ok, 0);
    assert_eq!(r.errors_of(ErrorKind::Refused), 10, "{:?}", r.errors);
    assert!(r.records.iter().all(|x| x.connected_us.is_none()));
    assert_eq!(r.connects, 0);
}

#[test]
fn reset_by_the_server() {
    let server = TestServer::start(Mode::Reset);
    let r = run(&config(&server.url("/"), 2, 6)).unwrap();
    assert_eq!(r.errors_of(ErrorKind::Reset), 6, "{:?}", r.errors);
}

#[test]
fn timeout_when_the_server_never_answers() {
    let server = TestServer::start(Mode::Silent);
    let mut c = config(&server.url("/"), 2, 2);
    c.timeout = Duration::from_millis(200);
    let r = run(&c).unwrap();
    assert_eq!(r.errors_of(ErrorKind::Timeout), 2, "{:?}", r.errors);
    for rec in &r.records {
        let waited = rec.end_us - rec.start_us;
        assert!((200_000..2_000_000).contains(&waited), "{rec:?}");
    }
}

#[test]
fn non_2xx_is_an_error_with_its_status() {
    let server = TestServer::start(Mode::NotFound);
    let r = run(&config(&server.url("/missing"), 2, 8)).unwrap();
    assert_eq!(r.errors_of(ErrorKind::Non2xx), 8, "{:?}", r.errors);
    assert!(r.records.iter().all(|x| x.status == Some(404)));
    assert_eq!(r.ok, 0);
    assert_eq!(r.rps, 0.0);
}

#[test]
fn short_and_malformed_responses() {
    let server = TestServer::start(Mode::Short);
    let r = run(&config(&server.url("/"), 2, 5)).unwrap();
    assert_eq!(r.errors_of(ErrorKind::ShortResponse), 5, "{:?}", r.errors);
    assert!(r.records.iter().all(|x| x.status == Some(200)));

    let server = TestServer::start(Mode::Garbage);
    let r = run(&config(&server.url("/"), 2, 5)).unwrap();
    assert_eq!(r.errors_of(ErrorKind::Malformed), 5, "{:?}", r.errors);
}

#[test]
fn source_addresses_spread_connections() {
    let server = TestServer::start(Mode::Ok);
    let mut c = config(&server.url("/"), 4, 40);
    c.source_addrs = vec!["127.0.0.2".parse().unwrap(), "127.0.0.3".parse().unwrap()];
    let r = run(&c).unwrap();
    assert_eq!(r.ok, 40, "{:?}", r.errors);
}

#[test]
fn a_source_address_that_is_not_local_fails_cleanly() {
    let server = TestServer::start(Mode::Ok);
    let mut c = config(&server.url("/"), 1, 3);
    c.source_addrs = vec!["192.0.2.1".parse().unwrap()];
    let r = run(&c).unwrap();
    assert_eq!(r.ok, 0);
    // bind() says EADDRNOTAVAIL: the same errno as an exhausted port range.
    assert_eq!(r.errors_of(ErrorKind::PortExhaustion), 3, "{:?}", r.errors);
}

#[test]
fn a_dropped_syn_is_flagged_as_a_retransmit_artefact() {
    // Backlog 1 and no accept for 400 ms: two handshakes fit in the accept queue, the
    // other SYNs are dropped and resent by the kernel 1 s later, when the server accepts.
    // (A server thread late to accept under load drops the resent SYNs too: see below.)
    dropped_syns_are_flagged(Duration::from_millis(400));
}

#[test]
fn twice_dropped_syns_are_flagged_as_retransmit_artefacts() {
    // No accept for 1.5 s: the SYNs resent at 1 s are dropped again, and the connects
    // complete after the second resend: at 2 s where the kernel resends at linear
    // intervals first (net.ipv4.tcp_syn_linear_timeouts), at 3 s where it doubles at once.
    let slowest_us = dropped_syns_are_flagged(Duration::from_millis(1500));
    assert!(
        slowest_us >= 1_900_000,
        "no SYN was dropped twice: {slowest_us} us"
    );
}

/// Five connections to a listener with backlog 1 that accepts nothing for `accept_delay`:
/// every connect that took a SYN retransmit is counted as one, and the run says so. Returns
/// the longest connect time (µs).
fn dropped_syns_are_flagged(accept_delay: Duration) -> u64 {
    let server = TestServer::start_tiny_backlog(Mode::Ok, accept_delay);
    let c = config(&server.url("/"), 5, 5);
    let r = run(&c).unwrap();
    assert_eq!(r.ok, 5, "{:?}", r.errors);
    let connect_us: Vec<u64> = r
        .records
        .iter()
        .map(|x| x.connected_us.unwrap() - x.start_us)
        .collect();
    let slow: Vec<_> = connect_us.iter().filter(|&&us| us >= 900_000).collect();
    assert!(!slow.is_empty(), "no SYN was dropped: {:?}", r.records);
    assert_eq!(r.syn_retries, slow.len() as u64, "{:?}", r.records);
    assert!(
        r.warnings.iter().any(|w| w.contains("SYN")),
        "{:?}",
        r.warnings
    );
    connect_us.into_iter().max().unwrap_or(0)
}

#[test]
fn open_loop_requests_never_started_are_unfinished() {
    // One connection to a server that never answers, 1000 requests/s for 300 ms: the first
    // request holds the connection and the 299 others wait for it; all 300 are reported,
    // whether records are kept or only counted.
    for keep_records in [true, false] {
        let server = TestServer::start(Mode::Silent);
        let mut c = config(&server.url("/"), 1, 1);
        c.threads = 1;
        c.requests = None;
        c.duration = Some(Duration::from_millis(300));
        c.rate = Some(1000.0);
        c.keep_records = keep_records;
        let r = run(&c).unwrap();
        assert_eq!(
            r.requests, 300,
            "keep_records {keep_records}: {:?}",
            r.errors
        );
        assert_eq!(r.unfinished, 300);
        let in_timeline: u64 = r.timeline.iter().map(|s| s.errors).sum();
        assert_eq!(in_timeline, 300);
        if keep_records {
            assert_eq!(r.records.len(), 300);
            assert_eq!(r.records.iter().filter(|x| x.conn_id == 0).count(), 299);
            assert_eq!(r.records[299].scheduled_us, 299_000);
        }
    }
}

#[test]
fn ipv6_loopback_when_available() {
    let Ok(listener) = std::net::TcpListener::bind("[::1]:0") else {
        eprintln!("no IPv6 loopback here: skipped");
        return;
    };
    let server = TestServer::from_listener(listener, Mode::Ok);
    let url = format!("http://[::1]:{}/v6", server.addr.port());
    let r = run(&config(&url, 2, 20)).unwrap();
    assert_eq!(r.ok, 20, "{:?}", r.errors);
    assert_eq!(r.url, format!("http://[::1]:{}/v6", server.addr.port()));
}
