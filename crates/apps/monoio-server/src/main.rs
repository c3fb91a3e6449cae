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

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use iolab_http::{Session, Site};
use iolab_servers::spec::MonoioSpec;
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use monoio::net::{TcpListener, TcpStream};
use monoio::{IoUringDriver, RuntimeBuilder};

use crate::writev::Chunks;

/// Bytes one read may bring in (as the models' default read buffer).
const READ_BUF: usize = iolab_servers::READ_BUF;

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
    /// Directory to serve; `/` maps to it, a directory to its index.html. Nothing outside it
    /// is ever served (same rules as `iolab serve`: iolab_http::Site)
    #[arg(long)]
    root: PathBuf,
    /// Address to listen on (port 0 picks a free port; the chosen address is printed)
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: SocketAddr,
    /// Threads, each its own monoio runtime bound to one CPU (0 = one per allowed CPU)
    #[arg(long, default_value_t = 0)]
    workers: usize,
    /// Length of each listener's queue of connections not yet accepted (listen(2) backlog)
    #[arg(long, default_value_t = 1024)]
    backlog: u32,
    /// Seconds a connection may wait for a read or a write before it is closed; 0 = never
    #[arg(long, default_value_t = 60.0)]
    idle_timeout: f64,
    /// Submission queue entries of each thread's io_uring (monoio raises values below 256)
    #[arg(long, default_value_t = MonoioSpec::RECOMMENDED_ENTRIES)]
    entries: u32,
}

impl Args {
    /// The spec the lab launches this peer with; an idle timeout must be seconds >= 0.
    fn to_spec(&self) -> Result<MonoioSpec> {
        if !self.idle_timeout.is_finite() || self.idle_timeout < 0.0 {
            bail!(
                "--idle-timeout must be a number of seconds >= 0, not {}",
                self.idle_timeout
            );
        }
        Ok(MonoioSpec {
            root: self.root.clone(),
            addr: self.addr,
            workers: self.workers,
            backlog: self.backlog,
            idle_timeout: Duration::from_secs_f64(self.idle_timeout),
            entries: self.entries,
        })
    }
}

fn main() {
    let args = Args::parse();
    if let Err(e) = args.to_spec().and_then(run) {
        eprintln!("iolab-monoio-server: {e:#}");
        std::process::exit(1);
    }
}

/// What one thread needs: its listener, its CPU, the shared site and settings.
struct Shard {
    listener: std::net::TcpListener,
    cpu: usize,
    site: Arc<Site>,
    entries: u32,
    idle: Option<Duration>,
}

fn run(spec: MonoioSpec) -> Result<()> {
    let site = Site::new(&spec.root, iolab_http::Limits::default())
        .with_context(|| format!("cannot serve {}", spec.root.display()))?;
    let cpus = iolab_sys::cpu::allowed_cpus().context("reading the process's CPU set")?;
    let threads = if spec.workers > 0 {
        spec.workers
    } else {
        cpus.len().max(1)
    };
    let listeners = iolab_servers::net::listen_group(spec.addr, spec.backlog, threads, false)?;
    let addr = listeners[0].local_addr()?;
    let idle = (!spec.idle_timeout.is_zero()).then_some(spec.idle_timeout);
    stop_on_signal()?;
    // Each thread reports whether its ring could be built before anything is announced, so
    // that an io_uring refusal is this process's error, not a silent dead thread.
    let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
    let mut used = Vec::new();
    let mut handles = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let cpu = cpus.get(i % cpus.len().max(1)).copied().unwrap_or(0);
        used.push(cpu);
        let shard = Shard {
            listener,
            cpu,
            site: Arc::clone(&site),
            entries: spec.entries,
            idle,
        };
        let ready = ready_tx.clone();
        handles.push(
            std::thread::Builder::new()
                .name(format!("monoio-{i}"))
                .spawn(move || serve_shard(shard, ready))
                .context("starting a runtime thread")?,
        );
    }
    drop(ready_tx);
    for r in ready_rx.iter().take(threads) {
        r?;
    }
    println!(
        "serving {} on {addr} with monoio ({threads} threads on CPUs {}, io_uring driver, \
         {}-entry rings, {}, backlog {}, idle timeout {})",
        spec.root.display(),
        list(&used),
        spec.entries.max(256),
        if threads > 1 {
            "one SO_REUSEPORT listener per thread"
        } else {
            "one listener"
        },
        spec.backlog,
        idle.map_or("none".to_string(), |d| format!("{} s", d.as_secs_f64())),
    );
    for h in handles {
        match h.join() {
            Ok(r) => r?,
            Err(_) => bail!("a runtime thread panicked"),
        }
    }
    Ok(())
}

fn list(cpus: &[usize]) -> String {
    let v: Vec<String> = cpus.iter().map(|c| c.to_string()).collect();
    v.join(",")
}

/// SIGINT or SIGTERM ends the process with status 0 from a thread of its own: the runtime
/// threads block in io_uring_enter and have no signal to poll.
fn stop_on_signal() -> Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).context("signal handlers")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if signals.forever().next().is_some() {
                std::process::exit(0);
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}

/// One thread: bound to its CPU, its own ring, its own accept loop.
fn serve_shard(shard: Shard, ready: mpsc::Sender<Result<()>>) -> Result<()> {
    let built = iolab_sys::cpu::pin_current_thread(shard.cpu)
        .with_context(|| format!("binding a runtime thread to CPU {}", shard.cpu))
        .and_then(|()| {
            RuntimeBuilder::<IoUringDriver>::new()
                .with_entries(shard.entries)
                .enable_timer()
                .build()
                .map_err(|e| ring_refused(e, shard.entries))
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
async fn serve(mut stream: TcpStream, site: Arc<Site>, idle: Option<Duration>) {
    let mut session = Session::new(site);
    let mut buf: Vec<u8> = Vec::with_capacity(READ_BUF);
    let mut chunks = Chunks::default();
    loop {
        buf.clear();
        let (r, b) = match within(idle, stream.read(buf)).await {
            Some(rb) => rb,
            None => return, // idle: dropping the stream closes it
        };
        buf = b;
        match r {
            Ok(n) if n > 0 => session.feed(&buf[..n], |_| {}),
            _ => return, // peer closed or error
        }
        while session.has_pending() {
            chunks.fill(session.pending());
            let (r, c) = match within(idle, stream.writev(chunks)).await {
                Some(rc) => rc,
                None => return,
            };
            chunks = c;
            match r {
                Ok(w) if w > 0 => session.advance(w),
                _ => return,
            }
            session.resume(|_| {});
        }
        if session.should_close() {
            let _ = stream.shutdown().await;
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    fn parse(args: Vec<OsString>) -> Args {
        Args::try_parse_from(std::iter::once(OsString::from("iolab-monoio-server")).chain(args))
            .unwrap_or_else(|e| panic!("the peer refuses the spec's arguments: {e}"))
    }

    /// What the lab launches is what the peer runs: spec -> arguments -> clap -> spec.
    #[test]
    fn a_spec_survives_the_command_line() {
        let mut every = MonoioSpec::new("dir with space".into(), "[::1]:9000".parse().unwrap());
        every.workers = 3;
        every.backlog = 200;
        every.idle_timeout = Duration::from_millis(1500);
        every.entries = 512;
        let mut never_idle = MonoioSpec::new("/w".into(), "127.0.0.1:8099".parse().unwrap());
        never_idle.idle_timeout = Duration::ZERO;
        for spec in [
            MonoioSpec::new("/w".into(), "127.0.0.1:8099".parse().unwrap()),
            every,
            never_idle,
        ] {
            assert_eq!(parse(spec.to_args()).to_spec().unwrap(), spec);
        }
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

    /// `MonoioSpec::new` says what the peer does when a flag is left out; a negative idle
    /// timeout is refused.
    #[test]
    fn the_spec_defaults_are_the_command_line_defaults() {
        let args = ["--root", "/w", "--addr", "127.0.0.1:8099"].map(OsString::from);
        assert_eq!(
            parse(args.to_vec()).to_spec().unwrap(),
            MonoioSpec::new("/w".into(), "127.0.0.1:8099".parse().unwrap())
        );
        let args = ["--root", "/w", "--idle-timeout=-1"].map(OsString::from);
        let e = parse(args.to_vec()).to_spec().unwrap_err().to_string();
        assert!(e.contains("--idle-timeout must be"), "{e}");
    }
}
