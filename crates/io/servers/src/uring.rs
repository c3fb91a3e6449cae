//! `uring` — seed 000's **iocp2** on io_uring.
//!
//! iocp2 posted several `AcceptEx` calls ahead on its listening socket, allocated the state of
//! each client on demand, and ran one event loop around `GetQueuedCompletionStatus`: each
//! completion packet led, through the `OVERLAPPED` it carried, to the client's environment and
//! to "the next function to run". Here:
//!
//! - the completion port is an io_uring per worker thread (`workers`, 0 = one per core), each
//!   with its own listener on the same port (SO_REUSEPORT spreads connections over them);
//! - `AcceptEx` posted ahead is [`ACCEPTS_AHEAD`](common::ACCEPTS_AHEAD) `IORING_OP_ACCEPT`s
//!   kept in flight; each one is re-posted as soon as it completes;
//! - the client environment is a [`Place`] allocated when its socket is accepted and freed
//!   when its close completes (a slab of boxes, [`Boxes`]: the box never moves, so the kernel
//!   can hold pointers into it while an operation is in flight). This store is what this
//!   file holds; the event loop is [`crate::uring_worker`]'s, the connection's state machine
//!   [`crate::uring_conn`]'s;
//! - the `OVERLAPPED` pointer is the SQE's `user_data`: (slab key, operation);
//! - "the next function to run" is `uring_conn::Step`, the one thing each connection waits
//!   for, set where the operation is submitted and matched when it completes;
//! - file bytes (a cache miss, the chunks of a large file) are read with `IORING_OP_READ`
//!   into a buffer the connection owns (`Step::ReadingFile`), as an iocp server read files
//!   with `ReadFile` on the same port: a slow disk holds up only the connection waiting.
//!
//! `uring-accept-sync` (iocp1) runs this worker and store unchanged except for where sockets
//! come from (`Source::Handoff`): exactly the one difference between iocp1 and iocp2.
//! `uring-fixed` (iocp3) runs the same worker over its fixed slots instead of [`Boxes`].
//!
//! Idle timeout and shutdown: see [`crate::uring_common`].

use std::io;

use io_uring::{opcode, squeue, types};
use slab::Slab;

use crate::uring_common::{self as common, Gate, StartLine};
use crate::uring_conn::IoMemory;
use crate::uring_worker::{Conn, Source, Store, Worker};
use crate::{Buffers, Ctx};

/// Serves `ctx` until its shutdown: one ring and one listener per worker thread.
pub fn run(ctx: &Ctx) -> io::Result<()> {
    let n = common::worker_count(ctx.config.workers);
    let sockets = common::bound_sockets(ctx, n, false)?;
    let gate = Gate::new(ctx.config.max_conns);
    let start = StartLine::new(n);
    common::run_workers(ctx, sockets, "uring", |_, sock| {
        let worker = common::ring().map(|ring| {
            let store = Boxes::new(ctx.config.buffers);
            Worker::new(ctx, &gate, Source::Listener(sock), ring, store)
        });
        start.arrive_and_wait(&ctx.shutdown);
        worker?.serve()
    })
}

/// One client's environment, allocated when its socket arrives.
pub(crate) struct Place {
    conn: Conn,
    mem: IoMemory,
    buf: Box<[u8]>,
}

/// The connections of a worker, each in its own box, allocated when its socket arrives and
/// freed when its close completes. No limit but the gate's.
pub(crate) struct Boxes {
    places: Slab<Box<Place>>,
    buffers: Buffers,
}

impl Boxes {
    pub(crate) fn new(buffers: Buffers) -> Boxes {
        Boxes {
            places: Slab::new(),
            buffers,
        }
    }
}

impl Store for Boxes {
    fn has_room(&self) -> bool {
        true
    }

    fn insert(&mut self, conn: Conn) -> usize {
        self.places.insert(Box::new(Place {
            conn,
            mem: IoMemory::new(self.buffers.max_iov),
            buf: vec![0u8; self.buffers.read_buf].into_boxed_slice(),
        }))
    }

    fn get(&mut self, key: usize) -> (&mut Conn, &mut IoMemory) {
        let p = &mut *self.places[key];
        (&mut p.conn, &mut p.mem)
    }

    fn receive(&mut self, key: usize) -> (&mut Conn, squeue::Entry) {
        let p = &mut *self.places[key];
        // The buffer is a boxed slice owned by the connection, which stays in the slab until
        // its close completes — after this receive's completion.
        let e = opcode::Recv::new(
            types::Fd(p.conn.socket.fd),
            p.buf.as_mut_ptr(),
            p.buf.len() as u32,
        )
        .build();
        (&mut p.conn, e)
    }

    fn received(&mut self, key: usize) -> (&mut Conn, &[u8]) {
        let p = &mut *self.places[key];
        (&mut p.conn, &p.buf)
    }

    fn remove(&mut self, key: usize) -> Conn {
        self.places.remove(key).conn
    }

    fn for_each(&mut self, mut f: impl FnMut(&mut Conn)) {
        for (_, p) in self.places.iter_mut() {
            f(&mut p.conn);
        }
    }

    fn leak(&mut self) {
        std::mem::forget(std::mem::take(&mut self.places));
    }
}

#[cfg(test)]
mod serve_tests {
    crate::testing::serve_tests!(super::run);
}
