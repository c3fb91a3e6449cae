//! Per-request CPU cost of `Session` on a cached file, without any socket: what every server
//! model pays in iolab-http before its own I/O costs.
//!
//!     cargo run --release -p iolab-http --example session_cost [REQUESTS]
//!
//! Prints nanoseconds per request for one request per feed (keep-alive) and for 16
//! pipelined requests per feed. Figures only; nothing is asserted.

use std::time::Instant;

use iolab_http::{Limits, Session, Site};

fn main() -> std::io::Result<()> {
    let requests: u32 = match std::env::args().nth(1) {
        None => 200_000,
        Some(a) => a.parse().map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("REQUESTS must be a positive whole number, got {a:?}"),
            )
        })?,
    };
    let dir = std::env::temp_dir().join(format!("iolab-http-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("index.html"), vec![b'x'; 1024])?;
    let site = Site::new(&dir, Limits::default())?;
    let req: &[u8] = b"GET /index.html HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: wrk\r\n\r\n";
    let batch: Vec<u8> = req.repeat(16);

    for (label, input, per_feed) in [("1 per feed", req, 1u32), ("16 pipelined", &batch[..], 16)] {
        let mut s = Session::new(site.clone());
        let mut answered = 0u32;
        let start = Instant::now();
        for _ in 0..requests / per_feed {
            s.feed(input, |_| answered += 1);
            let n = s.pending_len();
            s.advance(n);
        }
        let elapsed = start.elapsed();
        println!(
            "{label:>13}: {:.0} ns/request ({answered} requests, 1 KiB cached file)",
            elapsed.as_nanos() as f64 / f64::from(answered.max(1))
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
