//! The receive path of [`crate::frames::FrameReader`] without its system calls, as the
//! library's `recv` drives it: the unit tests and the fuzz target (crates/tiers/odb-preload/
//! fuzz, which includes this file) replay a peer's byte stream through it.

use crate::frames::{Filled, FrameReader, RecvAction};
use iolab_odb::proto::Ref;
use std::collections::VecDeque;

/// How one receive call ended, as the receive path would report it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum End {
    Bytes(usize),
    Eof,
    Reset,
    WouldBlock,
}

/// The receive path without its system calls: `kernel` holds what each read from the
/// socket returns in turn (empty: EAGAIN; a `None` entry: the peer closed, and every read
/// from then on returns 0, as the kernel's does); the
/// application's bytes go to `app` and the references placed to `placed`.
pub(crate) struct Peer {
    pub(crate) kernel: VecDeque<Option<Vec<u8>>>,
    pub(crate) app: Vec<u8>,
    pub(crate) placed: Vec<Ref>,
}

impl Peer {
    pub(crate) fn new(chunks: &[&[u8]]) -> Peer {
        Peer {
            kernel: chunks.iter().map(|c| Some(c.to_vec())).collect(),
            app: Vec::new(),
            placed: Vec::new(),
        }
    }

    /// Takes up to `max` bytes of the kernel's next chunk (the rest stays queued).
    pub(crate) fn read(&mut self, max: usize) -> Result<Vec<u8>, End> {
        match self.kernel.pop_front() {
            None => Err(End::WouldBlock),
            // a closed socket reads 0 again on every later read
            Some(None) => {
                self.kernel.push_front(None);
                Ok(Vec::new())
            }
            Some(Some(mut c)) => {
                if c.len() > max {
                    let rest = c.split_off(max);
                    self.kernel.push_front(Some(rest));
                }
                Ok(c)
            }
        }
    }

    /// One receive call asking for `want` bytes.
    pub(crate) fn recv(&mut self, rx: &mut FrameReader, want: usize) -> End {
        if rx.broken() {
            return End::Reset;
        }
        rx.start_call();
        let mut produced = 0;
        let finish = |produced: usize, e: End| {
            if produced > 0 {
                End::Bytes(produced)
            } else {
                e
            }
        };
        loop {
            if produced == want {
                return End::Bytes(produced);
            }
            match rx.next(want - produced, produced) {
                RecvAction::Copy { len, frame } => {
                    self.app.extend_from_slice(&rx.buffered()[..len]);
                    rx.copied(len, frame);
                    produced += len;
                }
                RecvAction::Place { part, len } => {
                    assert_eq!(part.len as usize, len);
                    self.placed.push(part);
                    self.app.extend(std::iter::repeat_n(b'V', len));
                    rx.placed(len);
                    produced += len;
                }
                RecvAction::ReadDirect { len, frame } => match self.read(len) {
                    Ok(b) if b.is_empty() => return finish(produced, End::Eof),
                    Ok(b) => {
                        self.app.extend_from_slice(&b);
                        produced += b.len();
                        if frame {
                            rx.read_direct(b.len());
                        }
                        if b.len() < len {
                            return End::Bytes(produced);
                        }
                    }
                    Err(e) => return finish(produced, e),
                },
                RecvAction::Fill => {
                    let space = rx.space().len();
                    match self.read(space) {
                        Ok(b) => {
                            rx.space()[..b.len()].copy_from_slice(&b);
                            match rx.filled(b.len()) {
                                Filled::Data => {}
                                Filled::Eof => return finish(produced, End::Eof),
                                Filled::Broken => return finish(produced, End::Reset),
                            }
                        }
                        Err(e) => return finish(produced, e),
                    }
                }
                RecvAction::Return => return End::Bytes(produced),
                RecvAction::Unframed => {}
                RecvAction::ProtoError => return finish(produced, End::Reset),
            }
        }
    }
}
