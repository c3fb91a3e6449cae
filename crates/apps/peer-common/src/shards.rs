//! The thread-per-core start shared by the monoio and glommio peers: the site, the CPUs
//! of the process's set, one SO_REUSEPORT listener per thread, the signal thread, each
//! thread's report that its runtime could start, and the join. What runs on a thread is
//! the peer's own (its runtime, its accept loop).

use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use iolab_http::Site;
use iolab_servers::spec::PeerBasics;

/// What the thread-per-core peers are told to serve (the fields their specs share), and
/// what their threads are called.
pub struct Plan<'a> {
    pub basics: &'a PeerBasics,
    /// Thread names are this, a dash and the thread's index ("monoio-0").
    pub thread_prefix: &'a str,
    /// What a thread is, in errors: "a runtime thread", "an executor thread".
    pub thread_noun: &'a str,
}

/// What one thread needs: its listener, its CPU, the shared site and idle deadline.
pub struct Shard {
    pub listener: std::net::TcpListener,
    pub cpu: usize,
    pub site: Arc<Site>,
    pub idle: Option<Duration>,
}

/// Threads started and ready (each has reported its runtime up).
pub struct Started {
    pub addr: SocketAddr,
    pub threads: usize,
    /// The CPU of each thread, in thread order.
    pub cpus: Vec<usize>,
    pub idle: Option<Duration>,
    thread_noun: String,
    handles: Vec<JoinHandle<Result<()>>>,
}

/// Starts one thread per listener running `serve`, which reports on its sender whether its
/// runtime could start before serving; returns once every thread has reported, with the
/// first refusal as the error (so that it is this process's error, not a silent dead
/// thread).
pub fn start<F>(plan: Plan<'_>, serve: F) -> Result<Started>
where
    F: Fn(Shard, mpsc::Sender<Result<()>>) -> Result<()> + Clone + Send + 'static,
{
    let site = Site::new(&plan.basics.root, iolab_http::Limits::default())
        .with_context(|| format!("cannot serve {}", plan.basics.root.display()))?;
    let cpus = iolab_sys::cpu::allowed_cpus().context("reading the process's CPU set")?;
    let threads = if plan.basics.workers > 0 {
        plan.basics.workers
    } else {
        cpus.len().max(1)
    };
    let listeners =
        iolab_servers::net::listen_group(plan.basics.addr, plan.basics.backlog, threads, false)?;
    let addr = listeners[0].local_addr()?;
    let idle = crate::idle_deadline(plan.basics.idle_timeout);
    stop_on_signal()?;
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
            idle,
        };
        let ready = ready_tx.clone();
        let serve = serve.clone();
        handles.push(
            std::thread::Builder::new()
                .name(format!("{}-{i}", plan.thread_prefix))
                .spawn(move || serve(shard, ready))
                .with_context(|| format!("starting {}", plan.thread_noun))?,
        );
    }
    drop(ready_tx);
    for r in ready_rx.iter().take(threads) {
        r?;
    }
    Ok(Started {
        addr,
        threads,
        cpus: used,
        idle,
        thread_noun: plan.thread_noun.to_string(),
        handles,
    })
}

impl Started {
    /// The threads' CPUs as the start lines print them ("0,1").
    pub fn cpu_list(&self) -> String {
        let v: Vec<String> = self.cpus.iter().map(|c| c.to_string()).collect();
        v.join(",")
    }

    /// The listeners as the start lines print them; `per` is what has one ("thread").
    pub fn listeners_text(&self, per: &str) -> String {
        if self.threads > 1 {
            format!("one SO_REUSEPORT listener per {per}")
        } else {
            "one listener".to_string()
        }
    }

    /// Waits for every thread (they serve until the process ends); a thread's error or
    /// panic is the process's.
    pub fn join(self) -> Result<()> {
        for h in self.handles {
            match h.join() {
                Ok(r) => r?,
                Err(_) => bail!("{} panicked", self.thread_noun),
            }
        }
        Ok(())
    }
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
