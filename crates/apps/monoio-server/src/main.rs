//! iolab-monoio-server: the monoio peer the lab runs beside iolab's models and tokio.
//!
//! Configured as monoio's own documentation and benchmark servers configure it: the
//! io_uring driver (no epoll fallback), one runtime per thread, each thread bound to one
//! CPU with its own SO_REUSEPORT listener on the shared address (the kernel spreads
//! connections over them), rings of 32,768 entries (`--entries`; the configuration guide:
//! larger rings "reduce the number of submits" at high request rates), the timer driver on
//! (the idle deadline).
//!
//! HTTP is iolab's: each connection drives an `iolab_http::Session` (read → feed → writev
//! pending → advance), as the tokio peer's `iolab` engine does, so that every byte on the
//! wire is the models' and the peer pays only monoio's cost. Writes hand the session's
//! chunks to the kernel as one `writev` of the chunks themselves (no copy).
//!
//! SIGINT or SIGTERM exits 0 (connections in progress are dropped).

mod writev;

use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use clap::Parser;
use iolab_http::{Session, Site};
use iolab_peer_common::session_io::{self, SessionIo};
use iolab_peer_common::shards::{self, Plan, Shard};
use iolab_servers::spec::MonoioSpec;
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use monoio::net::{TcpListener, TcpStream};
use monoio::{IoUringDriver, RuntimeBuilder};

use crate::writev::Chunks;

/// Bytes one read may bring in (as the models' default read buffer).
const READ_BUF: usize = iolab_servers::READ_BUF;

#[path = "../../peer-common/cli/basic_flags.rs"]
mod basic_flags;

/// Serve a directory over HTTP with monoio (the lab's monoio peer).

#[derive(Debug, Parser)]
#[command(
    name = "iolab-monoio-server",
    version,
    after_help = "Configuration: monoio's io_uring driver only; one runtime per thread, each \
                  thread bound to one CPU of the process's set, each with its own SO_REUSEPORT \
                  listener; --entries submission queue entries per ring (monoio's guide and \
                  benchmark: 32768); timer driver enabled; iolab's HTTP session per connection, \
                  responses written with one writev of the session's chunks. The start line \
                  repeats this with the values in force."
)]
struct Args {
    #[command(flatten)]
    basics: basic_flags::BasicFlags,
    /// Submission queue entries of each thread's io_uring (monoio raises values below 256)
    #[arg(long, default_value_t = MonoioSpec::RECOMMENDED_ENTRIES)]
    entries: u32,
}

impl Args {
    /// The spec the lab launches this peer with; an idle timeout must be seconds >= 0.
    fn to_spec(&self) -> Result<MonoioSpec> {
        Ok(MonoioSpec {
            entries: self.entries,
            ..MonoioSpec::with(self.basics.to_basics()?)
        })
    }
}

fn main() {
    basic_flags::main_with("iolab-monoio-server", Args::to_spec, run);
}

fn run(spec: MonoioSpec) -> Result<()> {
    let plan = Plan {
        basics: &spec.peer,
        thread_prefix: "monoio",
        thread_noun: "a runtime thread",
    };
    let entries = spec.entries;
    // Each thread reports whether its ring could be built before anything is announced, so
    // that an io_uring refusal is this process's error, not a silent dead thread.
    let started = shards::start(plan, move |shard, ready| serve_shard(shard, entries, ready))?;
    println!(
        "serving {} on {} with monoio ({} threads on CPUs {}, io_uring driver, \
         {}-entry rings, {}, backlog {}, idle timeout {})",
        spec.peer.root.display(),
        started.addr,
        started.threads,
        started.cpu_list(),
        spec.entries.max(256),
        started.listeners_text("thread"),
        spec.peer.backlog,
        iolab_peer_common::idle_text(started.idle),
    );
    started.join()
}

/// One thread: bound to its CPU, its own ring, its own accept loop.
fn serve_shard(shard: Shard, entries: u32, ready: mpsc::Sender<Result<()>>) -> Result<()> {
    let built = iolab_sys::cpu::pin_current_thread(shard.cpu)
        .with_context(|| format!("binding a runtime thread to CPU {}", shard.cpu))
        .and_then(|()| {
            RuntimeBuilder::<IoUringDriver>::new()
                .with_entries(entries)
                .enable_timer()
                .build()
                .map_err(|e| ring_refused(e, entries))
        });
    let mut rt = match built {
        Ok(rt) => {
            let _ = ready.send(Ok(()));
            rt
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return Ok(());
        }
    };
    rt.block_on(async move {
        let listener = TcpListener::from_std(shard.listener).context("monoio listener")?;
        accept_loop(listener, shard.site, shard.idle).await
    })
}

/// Why the ring could not be set up, with what to change when it is its memory: the
/// kernel counts a ring's memory against RLIMIT_MEMLOCK for a user without CAP_IPC_LOCK
/// (measured here, kernel 6.18, as nobody: 32,768 entries fail at 512 KiB and start at
/// 8 MiB).
fn ring_refused(e: std::io::Error, entries: u32) -> anyhow::Error {
    let what = format!("monoio's io_uring driver ({entries} entries) could not start: {e}");
    if e.raw_os_error() != Some(libc::ENOMEM) {
        return anyhow::anyhow!(what);
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    let known = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } == 0;
    let limit = match known {
        true if lim.rlim_cur == libc::RLIM_INFINITY => "unlimited".to_string(),
        true => format!("{} KiB", lim.rlim_cur / 1024),
        false => "unknown".to_string(),
    };
    anyhow::anyhow!(
        "{what} (the ring's memory counts against the locked-memory limit, now {limit}: \
         raise `ulimit -l` or lower --entries)"
    )
}

async fn accept_loop(listener: TcpListener, site: Arc<Site>, idle: Option<Duration>) -> Result<()> {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) if iolab_servers::net::transient_accept_error(&e) => continue,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                // Out of descriptors: the connection waits in the backlog.
                monoio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Err(e) => return Err(e).context("accept failed"),
        };
        // As the models: a response leaves in one write, Nagle would only delay it.
        let _ = stream.set_nodelay(true);
        monoio::spawn(serve(stream, Arc::clone(&site), idle));
    }
}

/// Awaits `f`, or gives up (None) after `idle` if there is one. A dropped read or write is
/// cancelled by monoio (async-cancel), its buffer kept until the kernel lets go of it.
async fn within<T>(idle: Option<Duration>, f: impl std::future::Future<Output = T>) -> Option<T> {
    match idle {
        Some(d) => monoio::time::timeout(d, f).await.ok(),
        None => Some(f.await),
    }
}

/// One connection: the models' loop on a monoio socket.
async fn serve(stream: TcpStream, site: Arc<Site>, idle: Option<Duration>) {
    let mut io = MonoioSessionIo {
        stream,
        buf: Some(Vec::with_capacity(READ_BUF)),
        chunks: Some(Chunks::default()),
        idle,
    };
    session_io::drive(Session::new(site), &mut io).await;
}

/// A monoio socket for the session loop. monoio takes a read's or a write's buffer by
/// value and gives it back with the result; a buffer is `None` only after an idle
/// deadline, when the connection ends.
struct MonoioSessionIo {
    stream: TcpStream,
    buf: Option<Vec<u8>>,
    chunks: Option<Chunks>,
    idle: Option<Duration>,
}

impl SessionIo for MonoioSessionIo {
    async fn read(&mut self) -> Option<&[u8]> {
        let mut buf = self.buf.take()?;
        buf.clear();
        // idle: dropping the stream closes it
        let (r, b) = within(self.idle, self.stream.read(buf)).await?;
        let buf = self.buf.insert(b);
        match r {
            Ok(n) if n > 0 => Some(&buf[..n]),
            _ => None, // peer closed or error
        }
    }

    async fn write(&mut self, pending: &VecDeque<Bytes>, _len: usize) -> Option<usize> {
        let mut chunks = self.chunks.take()?;
        chunks.fill(pending);
        let (r, c) = within(self.idle, self.stream.writev(chunks)).await?;
        self.chunks = Some(c);
        match r {
            Ok(w) if w > 0 => Some(w),
            _ => None,
        }
    }

    async fn close(&mut self) {
        let _ = self.stream.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    fn to_spec(args: Vec<OsString>) -> Result<MonoioSpec> {
        basic_flags::parse_spec(args, Args::to_spec)
    }

    /// The shared flags' contract (`check_command_line`), and this peer's own flag through
    /// the command line.
    #[test]
    fn a_spec_survives_the_command_line() {
        iolab_peer_common::testing::check_command_line(
            to_spec,
            MonoioSpec::with,
            MonoioSpec::to_args,
        );
        let spec = MonoioSpec {
            entries: 512,
            ..MonoioSpec::new("/w".into(), "127.0.0.1:8099".parse().unwrap())
        };
        assert_eq!(to_spec(spec.to_args()).unwrap(), spec);
    }

    /// A ring refused for its memory says which limit to raise; other refusals are passed on.
    #[test]
    fn a_ring_refused_for_memory_names_the_locked_memory_limit() {
        let e = ring_refused(std::io::Error::from_raw_os_error(libc::ENOMEM), 32768).to_string();
        assert!(
            e.contains("32768 entries") && e.contains("ulimit -l"),
            "{e}"
        );
        let e = ring_refused(std::io::Error::from_raw_os_error(libc::ENOSYS), 256).to_string();
        assert!(e.contains("256 entries") && !e.contains("ulimit"), "{e}");
    }
}
