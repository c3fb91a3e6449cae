//! One executor thread of the glommio peer: its executor made as the profile says, its
//! accept loop, and the models' HTTP loop on each connection.

use std::collections::VecDeque;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use bytes::Bytes;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};
use glommio::{GlommioError, Latency, LocalExecutorBuilder, Placement, Shares, TaskQueueHandle};
use iolab_http::{Session, Site};
use iolab_peer_common::session_io::{self, SessionIo};
use iolab_peer_common::shards::Shard;
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

fn builder(cpu: usize, profile: GlommioProfile) -> LocalExecutorBuilder {
    let b = LocalExecutorBuilder::new(Placement::Fixed(cpu)).name("iolab-glommio");
    match profile {
        GlommioProfile::Default | GlommioProfile::Latency => b,
        GlommioProfile::Throughput => b
            .ring_depth(THROUGHPUT_RING_DEPTH)
            .preempt_timer(THROUGHPUT_PREEMPT),
    }
}

/// Makes this thread's executor as `profile` says (reporting the outcome on `ready`) and
/// serves until the process ends.
pub fn serve(shard: Shard, profile: GlommioProfile, ready: mpsc::Sender<Result<()>>) -> Result<()> {
    let ex = match builder(shard.cpu, profile).make() {
        Ok(ex) => {
            let _ = ready.send(Ok(()));
            ex
        }
        Err(e) => {
            let _ = ready.send(Err(anyhow::anyhow!(
                "glommio's executor could not start on CPU {}: {e}",
                shard.cpu
            )));
            return Ok(());
        }
    };
    let Shard {
        listener,
        site,
        idle,
        ..
    } = shard;
    ex.run(async move {
        let queue = task_queue(profile)?;
        // SAFETY: the descriptor comes from a listening std socket whose ownership
        // `into_raw_fd` gives up here; glommio's listener owns and closes it from now on.
        let listener = unsafe { TcpListener::from_raw_fd(listener.into_raw_fd()) };
        accept_loop(listener, site, idle, queue).await
    })
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
        let conn = serve_connection(stream, Arc::clone(&site));
        let task = match queue {
            Some(q) => glommio::spawn_local_into(conn, q)
                .map_err(|e| anyhow::anyhow!("spawning a connection: {e}"))?,
            None => glommio::spawn_local(conn),
        };
        task.detach();
    }
}

/// One connection: the models' loop on a glommio socket.
async fn serve_connection(stream: TcpStream, site: Arc<Site>) {
    let mut io = GlommioSessionIo {
        stream,
        buf: vec![0u8; READ_BUF],
        gathered: Vec::with_capacity(READ_BUF),
    };
    session_io::drive(Session::new(site), &mut io).await;
}

/// A glommio socket for the session loop; its deadlines are the socket's own timeouts.
/// glommio's streams have no vectored write: several chunks up to [`GATHER_MAX`] in all
/// are gathered into one buffer and sent with one write, larger ones sent one by one.
struct GlommioSessionIo {
    stream: TcpStream,
    buf: Vec<u8>,
    gathered: Vec<u8>,
}

impl SessionIo for GlommioSessionIo {
    async fn read(&mut self) -> Option<&[u8]> {
        // Errors include glommio's own timeouts (the idle deadline): the connection ends.
        match self.stream.read(&mut self.buf).await {
            Ok(n) if n > 0 => Some(&self.buf[..n]),
            _ => None,
        }
    }

    async fn write(&mut self, pending: &VecDeque<Bytes>, len: usize) -> Option<usize> {
        let written = if pending.len() > 1 && len <= GATHER_MAX {
            self.gathered.clear();
            for c in pending {
                self.gathered.extend_from_slice(c);
            }
            self.stream.write(&self.gathered).await
        } else {
            // The session has a chunk pending whenever the loop asks for a write.
            self.stream.write(pending.front()?).await
        };
        match written {
            Ok(w) if w > 0 => Some(w),
            _ => None,
        }
    }

    async fn close(&mut self) {
        let _ = self.stream.close().await;
    }
}
