//! One connection of an io_uring model: the same state machine in all four models.
//!
//! A connection receives a request, feeds it to its `iolab_http::Session`, then reads the
//! file bytes the session waits for, sends what is pending, closes when the session is over
//! or receives the next request ([`next`]); it has one operation in flight at a time, and
//! what it waits for is its [`Step`]. The pieces here are what every model keeps for a
//! connection:
//! - [`Socket`]: what the loop knows of its socket (descriptor, step, last I/O, why it
//!   ends); the idle tick and the stop request read it;
//! - [`IoMemory`]: the memory its sends and file reads hand the kernel (iovecs, msghdr, the
//!   file read's buffer, the test hook's delay);
//! - its `Session`, and a receive buffer.
//!
//! What the models differ in is where these live and how a completion finds them again:
//! `uring` and `uring-accept-sync` box each connection in a slab, `uring-fixed` keeps them in
//! an array allocated at start (both through [`crate::uring_worker`], `user_data` = (key,
//! operation)); `uring-callback` gives the connection to the routine of its operation in
//! flight and keeps only its `Socket` in a registry.

use std::io;
use std::os::fd::RawFd;
use std::time::Instant;

use io_uring::{opcode, squeue, types};
use iolab_http::{Deadline, FileRead, Session, Timeouts};

use crate::stats::{ErrorKind, Stats};
use crate::uring_common::{self as common, FileReadEntries, Gate};

/// What a connection waits for: the next step of its state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// A receive is in flight; its completion feeds the HTTP session.
    Receiving,
    /// A send of the pending response bytes is in flight; its completion advances them.
    Sending,
    /// A read of file bytes is in flight; its completion hands them to the session.
    ReadingFile,
    /// The close is in flight; its completion frees the connection. The descriptor may
    /// already be closed (and its number reused): the tick and the stop leave it alone.
    Closing,
}

/// What a connection does once its operation has completed (see [`next`]).
pub(crate) enum Next {
    /// Read the file bytes the session waits for.
    ReadFile(FileRead),
    /// Send the pending response bytes.
    Send,
    /// Close: the session is over, or the server stops.
    Close,
    /// Receive the next request.
    Receive,
}

/// After a receive, a send or a file read: read the file bytes the session waits for, else
/// send what is pending, else close if the session is over, else receive the next request.
/// A stopping server closes at once.
pub(crate) fn next(session: &mut Session, stopping: bool) -> Next {
    if stopping {
        Next::Close
    } else if let Some(job) = session.file_read() {
        Next::ReadFile(job)
    } else if session.has_pending() {
        Next::Send
    } else if session.should_close() {
        Next::Close
    } else {
        Next::Receive
    }
}

/// Marks `sent` bytes as sent and answers the requests held back while the session's queue
/// was full (backpressure).
pub(crate) fn advance(session: &mut Session, sent: usize, stats: &Stats) {
    session.advance(sent);
    session.resume(|status| stats.response(status));
}

/// What the loop knows of a connection's socket.
pub(crate) struct Socket {
    pub(crate) fd: RawFd,
    pub(crate) step: Step,
    /// When it must be closed, as of its last completed receive, send or file read.
    deadline: Deadline,
    /// Shut down by the worker (idle timeout or stop): no second shutdown.
    shut: bool,
    /// Why it ends, counted when the close completes; None for an orderly end.
    fault: Option<ErrorKind>,
}

impl Socket {
    /// A socket just taken, about to receive.
    pub(crate) fn new(fd: RawFd, timeouts: Timeouts, now: Instant) -> Socket {
        Socket {
            fd,
            step: Step::Receiving,
            deadline: Deadline::new(timeouts, now),
            shut: false,
            fault: None,
        }
    }

    /// A receive completed with `res`: the bytes it brought, or None when the connection
    /// ends (0: the peer closed, or our shutdown at an idle timeout or stop).
    pub(crate) fn received(&mut self, res: i32) -> Option<usize> {
        if res > 0 {
            return Some(res as usize);
        }
        if res < 0 && self.fault.is_none() {
            self.fault = Some(common::error_kind(res));
        }
        None
    }

    /// A send completed with `res`: the bytes it took, or None when the connection ends (a
    /// send that takes nothing is an I/O error).
    pub(crate) fn sent(&mut self, res: i32) -> Option<usize> {
        if res > 0 {
            return Some(res as usize);
        }
        if self.fault.is_none() {
            self.fault = Some(if res < 0 {
                common::error_kind(res)
            } else {
                ErrorKind::Io
            });
        }
        None
    }

    /// After a receive fed to `session`, a send that advanced it or a file read handed
    /// back, at `now`: its deadline follows the session's phase.
    pub(crate) fn update(&mut self, session: &Session, now: Instant) {
        self.deadline.update(session, now);
    }

    /// The tick: a socket past its deadline (a head not complete in time, a send without
    /// progress, idle too long) is shut down, so that its pending operation completes at
    /// once and the connection leaves through its close, counted as a timeout.
    pub(crate) fn shut_if_expired(&mut self, now: Instant) {
        if self.step != Step::Closing && !self.shut && self.deadline.expired(now).is_some() {
            common::shutdown_socket(self.fd);
            self.shut = true;
            self.fault = Some(ErrorKind::Timeout);
        }
    }

    /// The stop request: every socket not closing yet is shut down.
    pub(crate) fn shut_for_stop(&mut self) {
        if self.step != Step::Closing && !self.shut {
            common::shutdown_socket(self.fd);
            self.shut = true;
        }
    }

    /// Its close completed: counts why it ended and gives its place back to the gate.
    pub(crate) fn closed(self, stats: &Stats, gate: &Gate) {
        if let Some(kind) = self.fault {
            stats.error(kind);
        }
        stats.conn_closed();
        gate.leave();
    }
}

/// Before the close of a connection's socket: one ended by an error answer, flushed,
/// lingers in a duplicate ([`crate::linger`]), so that the ring's close does not reset it.
pub(crate) fn linger_if_needed(session: &Session, fd: RawFd) {
    if session.lingers() && !session.has_pending() {
        if let Some(dup) = crate::linger::dup(fd) {
            crate::linger::linger(dup);
        }
    }
}

/// The close of a connection's socket.
pub(crate) fn close_entry(fd: RawFd) -> squeue::Entry {
    opcode::Close::new(types::Fd(fd)).build()
}

/// The memory a connection's sends and file reads hand the kernel. Its owner keeps it in
/// place (a box, a slot of a fixed array) from the submission of an operation until its
/// completion: the kernel reads the msghdr and iovecs, and writes the file bytes, until then.
pub(crate) struct IoMemory {
    iov: Box<[libc::iovec]>,
    msg: libc::msghdr,
    /// The file read in flight and the buffer it reads into (both kept until it completes).
    file: Option<(FileRead, Vec<u8>)>,
    /// The test hook's delay before a file read (see `uring_common::file_read_entries`).
    delay: types::Timespec,
}

impl IoMemory {
    /// Room for sends of at most `max_iov` chunks (`Buffers::max_iov`).
    pub(crate) fn new(max_iov: usize) -> IoMemory {
        IoMemory {
            iov: common::empty_iovecs(max_iov),
            msg: common::empty_msghdr(),
            file: None,
            delay: types::Timespec::new(),
        }
    }

    /// The send of the first pending chunks of `session` in one sendmsg on `fd`; None when
    /// nothing is left to send.
    ///
    /// The msghdr and iovecs are in `self`, kept in place until the send completes; the
    /// bytes they point to are the session's pending chunks, which are not touched until then
    /// either.
    pub(crate) fn send(&mut self, session: &Session, fd: RawFd) -> Option<squeue::Entry> {
        let n = common::fill_iovecs(session, &mut self.iov);
        if n == 0 {
            return None;
        }
        self.msg.msg_iov = self.iov.as_mut_ptr();
        self.msg.msg_iovlen = n;
        Some(
            opcode::SendMsg::new(types::Fd(fd), &self.msg)
                .flags(common::SEND_FLAGS)
                .build(),
        )
    }

    /// The entries of the read `job` the session waits for, into a buffer of its size.
    ///
    /// The buffer and the job (which holds the descriptor open) are kept in `self` until
    /// [`IoMemory::file_read_done`]; the delay lives here too.
    pub(crate) fn read_file(&mut self, job: FileRead) -> FileReadEntries {
        let buf = vec![0u8; job.len()];
        let (job, buf) = self.file.insert((job, buf));
        common::file_read_entries(job, buf, &mut self.delay)
    }

    /// The file read completed with `res`: its bytes, or its error, go to `session`. False
    /// when no read was in flight (the connection is then closed).
    pub(crate) fn file_read_done(
        &mut self,
        res: i32,
        session: &mut Session,
        stats: &Stats,
    ) -> bool {
        let Some((_, mut buf)) = self.file.take() else {
            return false;
        };
        let result = if res < 0 {
            Err(io::Error::from_raw_os_error(-res))
        } else {
            buf.truncate(res as usize);
            Ok(buf)
        };
        session.file_read_done(result, |status| stats.response(status));
        true
    }
}
