//! A TCP echo server in threaded style: one task per connection, buffers reused.
//!
//!     cargo run -p iolab-runtime --example echo -- [ADDR] [--self-test]
//!
//! ADDR defaults to 127.0.0.1:7007. With `--self-test` it also runs 10 client tasks that each
//! send and check 100 messages, prints the figures and exits (what CI runs).

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Instant;

use iolab_runtime::net::{TcpListener, TcpStream};
use iolab_runtime::{spawn, Runtime};

async fn serve(stream: TcpStream) -> std::io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let (r, b) = stream.read(buf).await;
        buf = b;
        let n = r?;
        if n == 0 {
            return Ok(());
        }
        // Send back exactly the n bytes read, then restore the buffer's full length.
        buf.truncate(n);
        let (r, b) = stream.write_all(buf).await;
        buf = b;
        r?;
        buf.resize(16 * 1024, 0);
    }
}

async fn client(addr: SocketAddr, id: usize, rounds: usize) -> std::io::Result<()> {
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let mut buf = vec![0u8; 64];
    for i in 0..rounds {
        let msg = format!("client {id:4} message {i:6}\n").into_bytes();
        let len = msg.len();
        let (r, _) = s.write_all(msg.clone()).await;
        r?;
        let mut got = Vec::with_capacity(len);
        while got.len() < len {
            buf.resize(len - got.len(), 0);
            let (r, b) = s.read(buf).await;
            buf = b;
            let n = r?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "server closed",
                ));
            }
            got.extend_from_slice(&buf[..n]);
        }
        if got != msg {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "echo mismatch",
            ));
        }
    }
    Ok(())
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("usage: echo [ADDR] [--self-test]\n  ADDR        listen address (default 127.0.0.1:7007)\n  --self-test run 10 checking clients against the server, then exit");
        return Ok(());
    }
    let self_test = args.iter().any(|a| a == "--self-test");
    let addr: SocketAddr = match args.iter().find(|a| !a.starts_with("--")) {
        Some(a) => a.parse().map_err(|e| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{a}: {e}"))
        })?,
        None if self_test => "127.0.0.1:0".parse().unwrap(),
        None => "127.0.0.1:7007".parse().unwrap(),
    };
    let rt = Runtime::new()?;
    rt.block_on(async move {
        let listener = Rc::new(TcpListener::bind(addr)?);
        let local = listener.local_addr()?;
        eprintln!(
            "echo: listening on {local} ({} driver)",
            iolab_runtime::current_driver()
        );
        let l2 = listener.clone();
        let server = spawn(async move {
            loop {
                let (stream, _) = match l2.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        eprintln!("echo: accept: {e}");
                        continue;
                    }
                };
                spawn(async move {
                    if let Err(e) = serve(stream).await {
                        eprintln!("echo: connection: {e}");
                    }
                });
            }
        });
        if !self_test {
            let _ = server.await;
            return Ok(());
        }
        let t0 = Instant::now();
        let clients: Vec<_> = (0..10).map(|id| spawn(client(local, id, 100))).collect();
        for c in clients {
            c.await.map_err(std::io::Error::from)??;
        }
        println!(
            "echo self-test: 10 clients x 100 round trips ok in {:?}",
            t0.elapsed()
        );
        server.abort();
        Ok(())
    })
}
