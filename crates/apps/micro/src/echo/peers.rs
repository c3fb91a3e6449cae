//! The echo server of `iolab micro echo` on the runtimes users would pick instead of ours:
//! tokio (a current-thread runtime: the server has one CPU), monoio (its io_uring driver,
//! rings of 32,768 entries as its configuration guide and benchmarks set) and glommio (a
//! `LocalExecutor` with its default settings). Same code shape as the other models: one
//! task per connection, read up to `BUF` bytes, write them back; the accept loop wakes at
//! least every 50 ms to notice the stop flag, and returning from it drops every connection.

use std::net::TcpListener;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use crate::echo::{Ctl, BUF};

/// How often an accept loop looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(50);
/// monoio's recommended ring size for high request rates (its configuration guide).
const MONOIO_ENTRIES: u32 = 32768;

/// Out of descriptors or memory while accepting: the connection is lost, as in the seed.
fn refused(ctl: &Ctl) {
    ctl.refused.fetch_add(1, Ordering::Relaxed);
}

pub fn serve_tokio(l: TcpListener, ctl: Arc<Ctl>) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    l.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a tokio current-thread runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(l)?;
        while !ctl.stopped() {
            match tokio::time::timeout(STOP_POLL, listener.accept()).await {
                Err(_) => {}
                Ok(Err(_)) => {
                    refused(&ctl);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Ok(Ok((mut s, _))) => {
                    tokio::spawn(async move {
                        let _ = s.set_nodelay(true);
                        let mut buf = vec![0u8; BUF];
                        loop {
                            let n = match s.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if s.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        }
        anyhow::Ok(())
    })
}

pub fn serve_monoio(l: TcpListener, ctl: Arc<Ctl>) -> anyhow::Result<()> {
    use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
    let mut rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .with_entries(MONOIO_ENTRIES)
        .enable_timer()
        .build()
        .context("monoio's io_uring driver could not start")?;
    rt.block_on(async move {
        let listener = monoio::net::TcpListener::from_std(l)?;
        while !ctl.stopped() {
            match monoio::time::timeout(STOP_POLL, listener.accept()).await {
                Err(_) => {}
                Ok(Err(_)) => {
                    refused(&ctl);
                    monoio::time::sleep(Duration::from_millis(10)).await;
                }
                Ok(Ok((mut s, _))) => {
                    monoio::spawn(async move {
                        let _ = s.set_nodelay(true);
                        let mut buf: Vec<u8> = Vec::with_capacity(BUF);
                        let mut out: Vec<u8> = Vec::with_capacity(BUF);
                        loop {
                            buf.clear();
                            let (r, b) = s.read(buf).await;
                            buf = b;
                            let n = match r {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            // Owned buffers: what was read goes out in a second one, as the
                            // iolab-runtime model does.
                            out.clear();
                            out.extend_from_slice(&buf[..n]);
                            let (r, o) = s.write_all(out).await;
                            out = o;
                            if r.is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        }
        anyhow::Ok(())
    })
}

pub fn serve_glommio(l: TcpListener, ctl: Arc<Ctl>) -> anyhow::Result<()> {
    use futures_lite::{AsyncReadExt, AsyncWriteExt};
    use std::os::fd::{FromRawFd, IntoRawFd};
    // The thread is already pinned to the server CPU: glommio leaves it where it is.
    let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .map_err(|e| anyhow::anyhow!("glommio's executor could not start: {e}"))?;
    ex.run(async move {
        // SAFETY: the descriptor is a listening socket whose ownership `into_raw_fd` gives
        // up here; glommio's listener owns and closes it from now on.
        let listener = unsafe { glommio::net::TcpListener::from_raw_fd(l.into_raw_fd()) };
        while !ctl.stopped() {
            let accept = listener.accept();
            let timer = glommio::timer::sleep(STOP_POLL);
            let next = futures_lite::future::or(async { Some(accept.await) }, async {
                timer.await;
                None
            })
            .await;
            match next {
                None => {}
                Some(Err(_)) => {
                    refused(&ctl);
                    glommio::timer::sleep(Duration::from_millis(10)).await;
                }
                Some(Ok(mut s)) => {
                    glommio::spawn_local(async move {
                        let _ = s.set_nodelay(true);
                        let mut buf = vec![0u8; BUF];
                        loop {
                            let n = match s.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if s.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    })
                    .detach();
                }
            }
        }
        anyhow::Ok(())
    })
}
