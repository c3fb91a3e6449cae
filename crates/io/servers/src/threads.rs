//! `threads`: one OS thread per connection, created by a dedicated accept thread.
//!
//! Mirrors seed 000's **thread** server (annex B, "Threads", first variant): a thread only
//! accepts, and every accepted socket gets a new thread that serves it with plain blocking
//! `read`/`write` on its own stack, so no per-connection state is allocated by hand. As in
//! the seed, the stack size is given explicitly at creation ([`STACK`], close to what a
//! connection really uses) instead of the 8 MiB default; the read buffer is on the heap.
//!
//! Linux specifics: the deadlines are SO_RCVTIMEO and a `poll` for room before a send
//! (`net::serve_blocking`); `max_conns` and a failed
//! thread creation both refuse (close at once, counted). A stop request `shutdown(2)`s the
//! listener (waking the blocked `accept`) and every open connection (waking blocked reads),
//! then waits for every connection thread to finish.

use std::thread;

use crate::net::{self, BlockingServer};
use crate::stats::ErrorKind;
use crate::Ctx;

/// Stack of each connection thread. The seed notes Windows rounds stacks up to 64 KiB;
/// 64 KiB is also plenty here since buffers live on the heap.
pub const STACK: usize = 64 * 1024;

pub fn run(ctx: &Ctx) -> std::io::Result<()> {
    let server = BlockingServer::bind(ctx)?;
    let stats = &*ctx.stats;

    // The scope joins every connection thread before `run` returns.
    thread::scope(|scope| {
        let server = &server;
        // The stop watcher: wakes the accept below and every blocked connection thread.
        thread::Builder::new()
            .name("stop-watcher".into())
            .spawn_scoped(scope, move || server.stop_when_asked(&ctx.shutdown))?;

        while let Some((stream, key)) = server.accept(ctx) {
            if net::prepare(&stream, false).is_err() {
                server.unregister(key);
                stats.error(ErrorKind::Io);
                continue;
            }
            stats.conn_opened();
            let spawned = thread::Builder::new()
                .stack_size(STACK)
                .spawn_scoped(scope, move || server.serve(ctx, stream, key));
            if spawned.is_err() {
                // At the thread limit (EAGAIN): the closure and its socket are already
                // dropped. The registry entry is removed just after; the only exposure is a
                // stop request in between shutting down a reused descriptor number, while
                // the whole server is stopping anyway.
                server.unregister(key);
                stats.conn_closed();
                stats.refused();
            }
        }
        Ok(())
    })
}
