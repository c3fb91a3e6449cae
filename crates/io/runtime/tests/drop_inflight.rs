//! Dropping futures whose operations are in flight, then making the kernel complete them (the
//! peer writes): no crash, no use-after-free, no leak. Also run under AddressSanitizer
//! (scripts/runtime-sanitize).

use std::future::Future;
use std::pin::pin;
use std::rc::Rc;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use iolab_runtime::net::{TcpListener, TcpStream};
use iolab_runtime::{live_ops, sleep, spawn, yield_now, JoinHandle, Runtime};

async fn pair(listener: &TcpListener) -> (TcpStream, TcpStream) {
    let c = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (s, _) = listener.accept().await.unwrap();
    (c, s)
}

/// Four reads of `server` parked in the kernel, owned by tasks that are then aborted: the
/// handles are awaited by the caller, which drops the futures and orphans the reads.
async fn aborted_reads(server: &Rc<TcpStream>) -> Vec<JoinHandle<Option<usize>>> {
    let mut hs = Vec::new();
    for _ in 0..4 {
        let s = server.clone();
        hs.push(spawn(async move { s.read(vec![0u8; 4096]).await.0.ok() }));
    }
    yield_now().await;
    for h in &hs {
        h.abort();
    }
    hs
}

async fn settle() {
    let t = Instant::now();
    while live_ops() > 0 && t.elapsed() < Duration::from_secs(5) {
        sleep(Duration::from_millis(1)).await;
    }
}

async fn read_n(s: &TcpStream, n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < n {
        let (r, b) = s.read(vec![0u8; n - out.len()]).await;
        let k = r.unwrap();
        assert!(k > 0, "unexpected end of stream");
        out.extend_from_slice(&b[..k]);
    }
    out
}

#[test]
fn dropped_reads_then_peer_writes() {
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        for round in 0..200 {
            let (client, server) = pair(&listener).await;
            let server = Rc::new(server);
            // Several reads parked in the kernel, owned by tasks that get aborted...
            for h in aborted_reads(&server).await {
                let _ = h.await; // the futures are dropped: their reads are orphaned
            }
            // ...and one started and dropped before it was even submitted.
            {
                let mut f = pin!(server.read(vec![0u8; 4096]));
                let mut cx = Context::from_waker(Waker::noop());
                assert!(f.as_mut().poll(&mut cx).is_pending());
            }
            // Then the peer writes into the socket.
            let msg = format!("round {round} data").into_bytes();
            let (r, _) = client.write_all(msg.clone()).await;
            r.unwrap();
            settle().await;
            assert_eq!(live_ops(), 0, "round {round}: records leaked");
            // The dropped reads were cancelled before the data came: a fresh read gets it all.
            let got =
                iolab_runtime::timeout(Duration::from_secs(5), read_n(&server, msg.len())).await;
            assert_eq!(
                got.expect("data lost to a dropped read"),
                msg,
                "round {round}"
            );
        }
    });
}

#[test]
fn dropped_reads_racing_the_peer() {
    // The peer writes while the cancellations are on their way: a read may complete first
    // and its data is then lost with the dropped future (completion I/O, seed 000 §2.1), but
    // the record must still free its buffer exactly once and nothing may leak.
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        for _ in 0..200 {
            let (client, server) = pair(&listener).await;
            let server = Rc::new(server);
            let hs = aborted_reads(&server).await;
            let (r, _) = client.write_all(vec![9u8; 3000]).await;
            r.unwrap();
            for h in hs {
                let _ = h.await;
            }
            drop(client);
            settle().await;
            assert_eq!(live_ops(), 0, "records leaked");
        }
    });
}

#[test]
fn dropped_writes_and_accepts() {
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let listener = Rc::new(TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap());
        let (client, server) = pair(&listener).await;
        // Fill the socket so writes block, then drop them in flight.
        let big = vec![0xabu8; 8 << 20];
        let s = Rc::new(server);
        let s2 = s.clone();
        let w = spawn(async move { s2.write_all(big).await.0 });
        sleep(Duration::from_millis(5)).await;
        w.abort();
        let _ = w.await;
        // The peer reads: the kernel finishes or cancels the send; the record frees the buffer.
        let mut drained = 0usize;
        loop {
            match iolab_runtime::timeout(Duration::from_millis(50), client.read(vec![0u8; 65536]))
                .await
            {
                Ok((Ok(n), _)) if n > 0 => drained += n,
                _ => break,
            }
        }
        assert!(drained > 0);
        // An accept dropped in flight, then a client connects: the connection must not leak
        // into a dead record (it is closed, or never accepted).
        let l2 = listener.clone();
        let a = spawn(async move { l2.accept().await.map(|_| ()) });
        yield_now().await;
        a.abort();
        let _ = a.await;
        let c = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        settle().await;
        assert_eq!(live_ops(), 0);
        // The listener still accepts.
        let (_s, peer) = listener.accept().await.unwrap();
        assert_eq!(peer, c.local_addr().unwrap());
    });
}

#[test]
fn runtime_dropped_with_reads_in_flight_then_peer_writes() {
    let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut peers = Vec::new();
    for _ in 0..10 {
        let rt = Runtime::new().unwrap();
        let client = rt.block_on(async {
            let client = TcpStream::connect(addr).await.unwrap();
            let (server, _) = listener.accept().await.unwrap();
            let server = Rc::new(server);
            for _ in 0..8 {
                let s = server.clone();
                spawn(async move {
                    let _ = s.read(vec![0u8; 1 << 16]).await;
                });
            }
            yield_now().await;
            client
        });
        drop(rt);
        // Nothing of the runtime is left; the kernel must not write into freed buffers.
        let std_client = std::net::TcpStream::from(std::os::fd::OwnedFd::from(client));
        std_client.set_nonblocking(false).unwrap();
        let _ = std::io::Write::write_all(&mut &std_client, &[1u8; 1 << 16]);
        peers.push(std_client);
    }
    std::thread::sleep(Duration::from_millis(20));
}
