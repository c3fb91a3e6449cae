//! The models' loop on one connection (read → feed → write pending → advance → resume,
//! close when the session says so), on whatever runtime's socket implements
//! [`SessionIo`]: the peers differ only in how a read, a write and a close are done and
//! how their deadlines are kept.

use std::collections::VecDeque;
use std::future::Future;

use bytes::Bytes;
use iolab_http::Session;

/// One connection's I/O as the session loop needs it. `None` ends the connection
/// (dropping the socket closes it): the peer closed, an error, a zero-byte write, or the
/// idle deadline.
pub trait SessionIo {
    /// The next bytes read (at least one).
    fn read(&mut self) -> impl Future<Output = Option<&[u8]>>;
    /// Writes a prefix of `pending` (the session's chunks, `len` bytes in all); the number
    /// of bytes written, at least one.
    fn write(
        &mut self,
        pending: &VecDeque<Bytes>,
        len: usize,
    ) -> impl Future<Output = Option<usize>>;
    /// Ends the connection in order (the session asked to close); errors do not matter.
    fn close(&mut self) -> impl Future<Output = ()>;
}

/// Drives `session` on `io` until the connection ends.
pub async fn drive(mut session: Session, io: &mut impl SessionIo) {
    loop {
        match io.read().await {
            Some(bytes) => session.feed(bytes, |_| {}),
            None => return,
        }
        while session.has_pending() {
            let Some(written) = io.write(session.pending(), session.pending_len()).await else {
                return;
            };
            session.advance(written);
            session.resume(|_| {});
        }
        if session.should_close() {
            io.close().await;
            return;
        }
    }
}
