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
//! Descriptors: Linux's `accept(2)` reserves its descriptor slot before it waits, so each
//! thread blocked in `accept` holds one, and a served connection holds two (its socket and
//! the file it sends). Below a limit of about the pool size plus what the process already
//! holds, every `open` of a file failed with EMFILE and every request was a 500. So the
//! pool is sized to `RLIMIT_NOFILE` ([`pool_size`]): at most (limit − descriptors open at
//! start − [`FD_RESERVE`]) / 2 threads, with a warning when that is fewer than asked.
//!
//! Starvation (documented, the model's nature): a thread serves one connection until it
//! ends, so N idle keep-alive clients (256 with the default pool) hold every thread until
//! their idle timeout, and new clients wait in the accept queue meanwhile.
//!
//! Memory: the workers allocate from one malloc arena ([`crate::memory::one_arena`]), and
//! each gives back the stack pages its last connection touched before it waits in `accept`
//! again ([`crate::memory::release_stack_below_here`], one `madvise` per connection), so
//! RSS returns to its start once connections close.
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

/// Descriptors kept free beyond two per thread: the stats file, the cache's files being
/// loaded, the stop watcher, a library opening one.
pub const FD_RESERVE: usize = 16;

/// The pool size asked for (`workers`, 0 = [`DEFAULT_WORKERS`]).
pub fn workers(config: &crate::Config) -> usize {
    if config.workers == 0 {
        DEFAULT_WORKERS
    } else {
        config.workers
    }
}

/// The pool that `limit` descriptors can hold when `open` are taken already: `asked`, or
/// fewer (at least 1) with the reason, when each thread's two descriptors do not fit.
pub fn pool_size(asked: usize, limit: u64, open: usize) -> (usize, Option<String>) {
    let spare = usize::try_from(limit)
        .unwrap_or(usize::MAX)
        .saturating_sub(open + FD_RESERVE);
    let fits = (spare / 2).max(1);
    if fits >= asked {
        return (asked, None);
    }
    let why = format!(
        "thread-pool: RLIMIT_NOFILE {limit} holds {fits} of the {asked} workers asked for          (each blocked accept reserves a descriptor, each connection served needs two,          {open} are open, {FD_RESERVE} kept spare): running {fits}; raise `ulimit -n` for more"
    );
    (fits, Some(why))
}

/// Descriptors this process holds now (the entries of /proc/self/fd, less the one used to
/// list them); 0 when it cannot be read.
fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count().saturating_sub(1))
}

pub fn run(ctx: &Ctx) -> std::io::Result<()> {
    let server = BlockingServer::bind(ctx)?;
    let stats = &*ctx.stats;
    crate::memory::one_arena();
    let asked = workers(&ctx.config);
    let n = match iolab_sys::fdlimit::nofile_limit() {
        Ok((soft, _)) => {
            let (n, why) = pool_size(asked, soft, open_descriptors());
            if let Some(why) = why {
                tracing::warn!("{why}");
            }
            n
        }
        Err(_) => asked,
    };

    thread::scope(|scope| {
        let server = &server;
        let worker = move || {
            let stack_low = crate::memory::own_stack_low();
            while let Some((stream, key)) = server.accept(ctx) {
                stats.conn_opened();
                match net::prepare(&stream, false) {
                    Ok(()) => server.serve(ctx, stream, key),
                    Err(_) => {
                        stats.error(ErrorKind::Io);
                        server.close(stats, stream, key);
                    }
                }
                // Back to waiting in accept: what serving touched below stays resident
                // otherwise, a page or more per thread (8 MiB over 2,048 threads).
                if let Some(low) = stack_low {
                    crate::memory::release_stack_below_here(low);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_fits_the_descriptor_limit() {
        assert_eq!(pool_size(256, 1 << 20, 10), (256, None));
        // 200 descriptors, 10 open, 16 spare: 87 threads of two.
        let (n, why) = pool_size(256, 200, 10);
        assert_eq!(n, 87);
        assert!(why
            .unwrap()
            .contains("RLIMIT_NOFILE 200 holds 87 of the 256"));
        assert_eq!(pool_size(8, 10, 10).0, 1, "never below one thread");
    }
}
