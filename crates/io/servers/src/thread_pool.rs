//! `thread-pool`: N threads started up front, each one `accept` → serve → loop.
//!
//! Mirrors seed 000's **thread-static** server (annex B, "Threads", second variant): as many
//! threads as connections the server must serve at once are created at start, each blocked
//! in `accept(2)` on the shared listener; the one the kernel wakes serves its client with
//! blocking I/O, then goes back to `accept`. No thread is created on the request path.
//!
//! Workers: `--workers N`, and 0 means [`DEFAULT_WORKERS`] (256): the seed sized the pool to
//! the connections it had to hold, and hit the thread limit near 1,000 threads on Windows.
//! 256 threads of [`crate::threads::STACK`] cost 16 MiB of stack. Connections beyond N are
//! not refused: they wait in the kernel's accept queue (`--backlog`) until a thread is free,
//! which is this model's defining behaviour under load. `max_conns` below N still refuses.
//!
//! Linux specifics: threads blocked in `accept` on one socket are woken one at a time (an
//! exclusive wait queue), so there is no thundering herd. A stop request `shutdown(2)`s the
//! listener, which makes every blocked `accept` fail at once, and every open connection.

use std::thread;

use crate::net::{self, BlockingServer};
use crate::stats::ErrorKind;
use crate::Ctx;

/// Pool size when `workers` is 0.
pub const DEFAULT_WORKERS: usize = 256;

/// The pool size for a configuration.
pub fn workers(config: &crate::Config) -> usize {
    if config.workers == 0 {
        DEFAULT_WORKERS
    } else {
        config.workers
    }
}

pub fn run(ctx: &Ctx) -> std::io::Result<()> {
    let server = BlockingServer::bind(ctx)?;
    let stats = &*ctx.stats;
    let n = workers(&ctx.config);

    thread::scope(|scope| {
        let server = &server;
        let worker = move || {
            while let Some((stream, key)) = server.accept(ctx) {
                stats.conn_opened();
                match net::prepare(&stream, false) {
                    Ok(()) => server.serve(ctx, stream, key),
                    Err(_) => {
                        stats.error(ErrorKind::Io);
                        server.close(stats, stream, key);
                    }
                }
            }
        };
        let mut failure = None;
        for i in 0..n {
            let b = thread::Builder::new()
                .name(format!("pool-{i}"))
                .stack_size(crate::threads::STACK);
            match b.spawn_scoped(scope, worker) {
                Ok(_) => {}
                Err(e) => {
                    failure = Some(std::io::Error::new(
                        e.kind(),
                        format!("thread-pool: could not start worker {} of {n}: {e}", i + 1),
                    ));
                    break;
                }
            }
        }
        if failure.is_some() {
            // Stop the workers already started, then report.
            ctx.shutdown.trigger();
        }
        server.stop_when_asked(&ctx.shutdown);
        failure.map_or(Ok(()), Err)
    })
}
