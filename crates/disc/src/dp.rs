//! DP, the BE's direct payload sender (seed 004 §3.5.4): the store of payloads the BE kept
//! back (a job per payload, named by its payload id), and its control endpoint, a TCP
//! listener the FE role talks to.
//!
//! Control protocol (one command per line, several per connection):
//! - `FETCH <id>\r\n` → `OK <size>\r\n` and the payload's bytes, or `ERR <why>\r\n`. The
//!   relay mode: the FE writes the payload on the client connection itself. It exercises
//!   the whole header path and the store without any packet forging.
//!
//! Limits: at most [`MAX_JOBS`] jobs and [`MAX_BYTES`] bytes held; a job not claimed within
//! [`JOB_TTL`] is dropped (the FE died or fell back). A BE whose store is full answers on the
//! normal path (no shortcut), so a slow or absent FE never makes the BE hold more.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use iolab_runtime::net::{TcpListener, TcpStream};

use crate::http1::{write_all, Conn};

pub const MAX_JOBS: usize = 4096;
pub const MAX_BYTES: u64 = 1 << 30;
pub const JOB_TTL: Duration = Duration::from_secs(30);

struct Job {
    body: Bytes,
    created: Instant,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    taken: u64,
    jobs: HashMap<u64, Job>,
    bytes: u64,
}

/// The payloads held for the FE.
#[derive(Default)]
pub struct Store {
    inner: Mutex<Inner>,
}

impl Store {
    pub fn new() -> Arc<Store> {
        Arc::new(Store::default())
    }

    /// Keeps `body`; its payload id, or None when the store is full.
    pub fn insert(&self, body: Bytes) -> Option<u64> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let expired: Vec<u64> = g
            .jobs
            .iter()
            .filter(|(_, j)| now.duration_since(j.created) > JOB_TTL)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(j) = g.jobs.remove(&id) {
                g.bytes -= j.body.len() as u64;
            }
        }
        if g.jobs.len() >= MAX_JOBS || g.bytes + body.len() as u64 > MAX_BYTES {
            return None;
        }
        g.next_id += 1;
        let id = g.next_id;
        g.bytes += body.len() as u64;
        g.jobs.insert(id, Job { body, created: now });
        Some(id)
    }

    /// Removes and returns the payload `id`.
    pub fn take(&self, id: u64) -> Option<Bytes> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let j = g.jobs.remove(&id)?;
        g.bytes -= j.body.len() as u64;
        g.taken += 1;
        Some(j.body)
    }

    /// Payloads kept so far (ids handed out) and payloads claimed by an FE.
    pub fn counts(&self) -> (u64, u64) {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (g.next_id, g.taken)
    }

    /// (jobs, bytes) held now.
    pub fn usage(&self) -> (usize, u64) {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (g.jobs.len(), g.bytes)
    }
}

/// Serves the control endpoint until `stop`.
pub async fn serve(listener: TcpListener, store: Arc<Store>, stop: iolab_runtime::Cond) {
    loop {
        let stream = match listener.accept_or_cancel(&stop).await {
            Ok((s, _)) => s,
            Err(e) if iolab_runtime::Cancelled::is(&e) => return,
            Err(e) => {
                tracing::warn!("dp accept: {e}");
                iolab_runtime::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let store = store.clone();
        iolab_runtime::spawn(async move {
            if let Err(e) = control(stream, &store).await {
                tracing::debug!("dp control connection: {e}");
            }
        });
    }
}

async fn control(stream: TcpStream, store: &Store) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    let mut conn = Conn::new(stream);
    loop {
        let line = match conn.read_line(256).await {
            Ok(l) => l,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        let text = String::from_utf8_lossy(&line[..line.len() - 2]).into_owned();
        let mut words = text.split_ascii_whitespace();
        match (
            words.next(),
            words.next().and_then(|w| w.parse::<u64>().ok()),
        ) {
            (Some("FETCH"), Some(id)) => match store.take(id) {
                Some(body) => {
                    write_all(&conn.stream, format!("OK {}\r\n", body.len()).into_bytes()).await?;
                    write_all(&conn.stream, body.to_vec()).await?;
                }
                None => write_all(&conn.stream, b"ERR unknown payload\r\n".to_vec()).await?,
            },
            _ => {
                write_all(&conn.stream, b"ERR bad command\r\n".to_vec()).await?;
                return Ok(());
            }
        }
    }
}

/// The FE side: asks DP at the other end of `conn` for payload `id`; Ok(size) once DP has
/// answered OK (the payload's bytes follow on `conn`), Err before any payload byte.
pub async fn fetch(conn: &mut Conn, id: u64) -> io::Result<u64> {
    write_all(&conn.stream, format!("FETCH {id}\r\n").into_bytes()).await?;
    let line = conn.read_line(256).await?;
    let text = String::from_utf8_lossy(&line[..line.len() - 2]).into_owned();
    match text.strip_prefix("OK ").and_then(|n| n.parse::<u64>().ok()) {
        Some(n) => Ok(n),
        None => Err(io::Error::other(format!("DP answered `{text}`"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_is_bounded_and_ids_are_single_use() {
        let s = Store::new();
        let a = s.insert(Bytes::from_static(b"abc")).unwrap();
        let b = s.insert(Bytes::from_static(b"de")).unwrap();
        assert_ne!(a, b);
        assert_eq!(s.usage(), (2, 5));
        assert_eq!(&s.take(a).unwrap()[..], b"abc");
        assert!(s.take(a).is_none());
        assert_eq!(s.usage(), (1, 2));
        for _ in 1..MAX_JOBS {
            assert!(s.insert(Bytes::new()).is_some());
        }
        assert!(s.insert(Bytes::new()).is_none(), "MAX_JOBS is a bound");
    }
}
