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
//!
//! Memory: glibc keeps the stacks of ended threads for reuse (up to 40 MiB of them, the
//! `glibc.pthread.stack_cache_size` tunable, which a running process cannot change), with
//! their top pages resident: after 2,000 idle connections closed the server stayed 7 MiB
//! above its start in stacks alone. So each connection thread runs on a stack this server
//! maps itself ([`OwnStack`], `pthread_attr_setstack`, which glibc never caches) and unmaps
//! once a reaper thread has joined it. Its heap buffers go to one malloc arena
//! ([`crate::memory::one_arena`]) so that `malloc_trim` can give them back.

use std::ffi::c_void;
use std::sync::mpsc;
use std::thread;

use crate::net::{self, BlockingServer};
use crate::stats::ErrorKind;
use crate::Ctx;

/// Stack of each connection thread. The seed notes Windows rounds stacks up to 64 KiB;
/// 64 KiB is also plenty here since buffers live on the heap.
pub const STACK: usize = 64 * 1024;

/// Guard page below each connection stack (a stack overflow faults instead of writing
/// into the next mapping).
const GUARD: usize = 4096;

/// A connection thread's stack, mapped by this server: [`GUARD`] bytes of `PROT_NONE`, then
/// [`STACK`] bytes; unmapped on drop.
struct OwnStack {
    base: *mut c_void,
}

// SAFETY: the mapping is owned by this value alone; moving it to the reaper thread moves
// the duty to unmap it, nothing else.
unsafe impl Send for OwnStack {}

impl OwnStack {
    fn map() -> std::io::Result<OwnStack> {
        // SAFETY: a fresh private anonymous mapping, no address asked for.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                GUARD + STACK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let stack = OwnStack { base };
        // SAFETY: the first page of the mapping just made.
        iolab_sys::cvt(unsafe { libc::mprotect(base, GUARD, libc::PROT_NONE) })?;
        Ok(stack)
    }

    /// The usable part, as `pthread_attr_setstack` wants it (lowest address).
    fn usable(&self) -> *mut c_void {
        // SAFETY: GUARD is inside the mapping.
        unsafe { self.base.cast::<u8>().add(GUARD).cast() }
    }
}

impl Drop for OwnStack {
    fn drop(&mut self) {
        // SAFETY: our mapping; its thread has been joined (or never started).
        unsafe { libc::munmap(self.base, GUARD + STACK) };
    }
}

/// A connection thread that has finished its work: the reaper joins it, then unmaps its
/// stack.
struct Ended {
    thread: libc::pthread_t,
    stack: OwnStack,
}

// SAFETY: a pthread_t is an id, valid to join from any thread.
unsafe impl Send for Ended {}

/// What a connection thread starts with: its work, its stack (to hand back) and where to
/// hand it.
struct Start {
    work: Box<dyn FnOnce() + Send>,
    stack: OwnStack,
    ended: mpsc::Sender<Ended>,
}

extern "C" fn connection_thread(arg: *mut c_void) -> *mut c_void {
    // SAFETY: `arg` is the `Box<Start>` leaked by `spawn_on_own_stack` for this thread.
    let start = unsafe { Box::from_raw(arg.cast::<Start>()) };
    let Start { work, stack, ended } = *start;
    // No unwinding out of an extern "C" function; the connection's own errors are counted
    // where they happen.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
    // SAFETY: pthread_self has no preconditions.
    let thread = unsafe { libc::pthread_self() };
    // The reaper joins this thread (which ends just after) before unmapping the stack.
    let _ = ended.send(Ended { thread, stack });
    std::ptr::null_mut()
}

/// Starts `work` on a thread with a stack of our own. On failure `work` is dropped.
///
/// # Safety
/// `work` may borrow data that must outlive the thread: the caller keeps it alive until
/// the reaper fed by `ended` has joined every thread (see [`run`]).
unsafe fn spawn_on_own_stack<'a>(
    work: Box<dyn FnOnce() + Send + 'a>,
    ended: &mpsc::Sender<Ended>,
) -> std::io::Result<()> {
    let stack = OwnStack::map()?;
    let usable = stack.usable();
    // SAFETY: only the lifetime is erased; by the caller's promise the reaper joins the
    // thread while 'a lives.
    let work: Box<dyn FnOnce() + Send + 'static> = unsafe { std::mem::transmute(work) };
    let start = Box::into_raw(Box::new(Start {
        work,
        stack,
        ended: ended.clone(),
    }));
    // SAFETY: attr is initialised before use and destroyed after; the stack is ours,
    // aligned to a page and STACK (64 KiB) long, above PTHREAD_STACK_MIN.
    let rc = unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        let mut rc = libc::pthread_attr_init(&mut attr);
        if rc == 0 {
            rc = libc::pthread_attr_setstack(&mut attr, usable, STACK);
        }
        let mut thread: libc::pthread_t = 0;
        if rc == 0 {
            rc = libc::pthread_create(&mut thread, &attr, connection_thread, start.cast());
        }
        libc::pthread_attr_destroy(&mut attr);
        rc
    };
    if rc != 0 {
        // SAFETY: the thread did not start, so `start` is still ours (and drops the stack).
        drop(unsafe { Box::from_raw(start) });
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Joins each ended connection thread and unmaps its stack, until every sender is gone.
fn reap(ended: mpsc::Receiver<Ended>) {
    for Ended { thread, stack } in ended {
        // SAFETY: a joinable thread created by spawn_on_own_stack, joined once, here.
        unsafe { libc::pthread_join(thread, std::ptr::null_mut()) };
        drop(stack);
    }
}

pub fn run(ctx: &Ctx) -> std::io::Result<()> {
    let server = BlockingServer::bind(ctx)?;
    let stats = &*ctx.stats;
    crate::memory::one_arena();

    // The scope joins the reaper, which joins every connection thread, before `run`
    // returns (that keeps `server` and `ctx` alive for them).
    thread::scope(|scope| {
        let server = &server;
        // The reaper first: should the watcher fail to start, `ended` drops and it ends.
        let (ended, to_reap) = mpsc::channel();
        thread::Builder::new()
            .name("reaper".into())
            .spawn_scoped(scope, move || reap(to_reap))?;
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
            let work = Box::new(move || server.serve(ctx, stream, key));
            // SAFETY: `server` and `ctx` outlive the scope, which waits for the reaper, which
            // joins every thread started here (it ends once `ended` and every thread's
            // clone of it are gone).
            let spawned = unsafe { spawn_on_own_stack(work, &ended) };
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
        drop(ended);
        Ok(())
    })
}
