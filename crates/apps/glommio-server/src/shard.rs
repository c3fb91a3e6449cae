//! One executor thread of the glommio peer: its executor made as the profile says, its
//! accept loop, and the models' HTTP loop on each connection.

use std::os::fd::{FromRawFd, IntoRawFd};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};
use glommio::{GlommioError, Latency, LocalExecutorBuilder, Placement, Shares, TaskQueueHandle};
use iolab_http::{Session, Site};
use iolab_servers::spec::GlommioProfile;

/// Bytes one read may bring in (as the models' default read buffer).
const READ_BUF: usize = iolab_servers::READ_BUF;
/// Pending chunks up to this many bytes in all are gathered into one send.
const GATHER_MAX: usize = 64 * 1024;
/// The latency profile's `Latency::Matters` period.
const LATENCY_PERIOD: Duration = Duration::from_millis(1);
/// The throughput profile's ring depth and preemption period.
const THROUGHPUT_RING_DEPTH: usize = 1024;
const THROUGHPUT_PREEMPT: Duration = Duration::from_millis(500);

/// What the profile sets, as the start line prints it.
pub fn settings(p: GlommioProfile) -> String {
    match p {
        GlommioProfile::Default => {
            "LocalExecutorBuilder defaults (ring depth 128, preempt timer 100 ms, 10 MiB I/O \
             memory), default task queue"
                .into()
        }
        GlommioProfile::Latency => format!(
            "builder defaults, connections in a Latency::Matters({} ms) task queue",
            LATENCY_PERIOD.as_millis()
        ),
        GlommioProfile::Throughput => format!(
            "ring depth {THROUGHPUT_RING_DEPTH}, preempt timer {} ms, connections in a \
             Latency::NotImportant task queue",
            THROUGHPUT_PREEMPT.as_millis()
        ),
    }
}

/// What one thread needs: its listener, its CPU, the shared site and settings.
pub struct Shard {
    pub listener: std::net::TcpListener,
    pub cpu: usize,
    pub site: Arc<Site>,
    pub profile: GlommioProfile,
    pub idle: Option<Duration>,
}

impl Shard {
    fn builder(&self) -> LocalExecutorBuilder {
        let b = LocalExecutorBuilder::new(Placement::Fixed(self.cpu)).name("iolab-glommio");
        match self.profile {
            GlommioProfile::Default | GlommioProfile::Latency => b,
            GlommioProfile::Throughput => b
                .ring_depth(THROUGHPUT_RING_DEPTH)
                .preempt_timer(THROUGHPUT_PREEMPT),
        }
    }

    /// Makes this thread's executor (reporting the outcome on `ready`) and serves until the
    /// process ends.
    pub fn serve(self, ready: mpsc::Sender<Result<()>>) -> Result<()> {
        let ex = match self.builder().make() {
            Ok(ex) => {
                let _ = ready.send(Ok(()));
                ex
            }
            Err(e) => {
                let _ = ready.send(Err(anyhow::anyhow!(
                    "glommio's executor could not start on CPU {}: {e}",
                    self.cpu
                )));
                return Ok(());
            }
        };
        let Shard {
            listener,
            site,
            profile,
            idle,
            ..
        } = self;
        ex.run(async move {
            let queue = task_queue(profile)?;
            // SAFETY: the descriptor comes from a listening std socket whose ownership
            // `into_raw_fd` gives up here; glommio's listener owns and closes it from now on.
            let listener = unsafe { TcpListener::from_raw_fd(listener.into_raw_fd()) };
            accept_loop(listener, site, idle, queue).await
        })
    }
}

/// The task queue connections run in: none of their own for the default profile.
fn task_queue(profile: GlommioProfile) -> Result<Option<TaskQueueHandle>> {
    let latency = match profile {
        GlommioProfile::Default => return Ok(None),
        GlommioProfile::Latency => Latency::Matters(LATENCY_PERIOD),
        GlommioProfile::Throughput => Latency::NotImportant,
    };
    let q = glommio::executor().create_task_queue(Shares::default(), latency, "connections");
    Ok(Some(q))
}

fn io_error(e: &GlommioError<()>) -> Option<&std::io::Error> {
    match e {
        GlommioError::IoError(e) => Some(e),
        _ => None,
    }
}

async fn accept_loop(
    listener: TcpListener,
    site: Arc<Site>,
    idle: Option<Duration>,
    queue: Option<TaskQueueHandle>,
) -> Result<()> {
    loop {
        let stream = match listener.accept().await {
            Ok(s) => s,
            Err(e) => match io_error(&e) {
                Some(io) if iolab_servers::net::transient_accept_error(io) => continue,
                Some(io) if matches!(io.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    // Out of descriptors: the connection waits in the backlog.
                    glommio::timer::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                _ => return Err(anyhow::anyhow!("accept failed: {e}")),
            },
        };
        // As the models: a response leaves in one write, Nagle would only delay it.
        let _ = stream.set_nodelay(true);
        if stream.set_read_timeout(idle).is_err() || stream.set_write_timeout(idle).is_err() {
            continue; // dropping it closes it; glommio refuses only a zero duration
        }
        let conn = serve(stream, Arc::clone(&site));
        let task = match queue {
            Some(q) => glommio::spawn_local_into(conn, q)
                .map_err(|e| anyhow::anyhow!("spawning a connection: {e}"))?,
            None => glommio::spawn_local(conn),
        };
        task.detach();
    }
}

/// One connection: the models' loop on a glommio socket.
async fn serve(mut stream: TcpStream, site: Arc<Site>) {
    let mut session = Session::new(site);
    let mut buf = vec![0u8; READ_BUF];
    let mut gathered: Vec<u8> = Vec::with_capacity(READ_BUF);
    loop {
        // Errors include glommio's own timeouts (the idle deadline): the connection ends.
        let n = match stream.read(&mut buf).await {
            Ok(n) if n > 0 => n,
            _ => return,
        };
        session.feed(&buf[..n], |_| {});
        while session.has_pending() {
            let written = if session.pending().len() > 1 && session.pending_len() <= GATHER_MAX {
                gathered.clear();
                for c in session.pending() {
                    gathered.extend_from_slice(c);
                }
                stream.write(&gathered).await
            } else {
                match session.pending().front() {
                    Some(first) => stream.write(first).await,
                    None => break,
                }
            };
            match written {
                Ok(w) if w > 0 => session.advance(w),
                _ => return,
            }
            session.resume(|_| {});
        }
        if session.should_close() {
            let _ = stream.close().await;
            return;
        }
    }
}
