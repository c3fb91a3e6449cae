//! Giving back the memory of closed connections.
//!
//! Every model frees a connection's buffers when it closes, but glibc's allocator keeps
//! freed memory in its arenas (one per thread that allocated) instead of returning it to
//! the system: after 2,000 idle connections closed, a server stayed at 21–45 MiB against
//! 7 MiB at its start. So each server runs a small thread beside its model that samples the
//! number of open connections every [`TRIM_EVERY`] and calls `malloc_trim(0)` (every
//! arena, free pages given back with `madvise(MADV_DONTNEED)`) once the connections have
//! fallen to a quarter of the peak seen since the last trim, or to none after any
//! activity. It costs nothing on the I/O path and one `malloc_trim` per burst that ends.
//!
//! `malloc_trim` gives back the free pages inside each arena, but not the free top of a
//! thread's own arena (glibc shrinks those only when a free of 64 KiB or more lands there):
//! the thread models, whose hundreds of threads spread over 8 arenas per core, kept
//! 17 MiB after their connections closed. They call [`one_arena`] before starting threads.
//! The trimming thread allocates nothing (a condition variable, no channel), so that it
//! does not create an arena of its own before that.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::stats::{Counter, Stats};

/// How often the open connections are looked at.
pub const TRIM_EVERY: Duration = Duration::from_millis(500);

/// Fewest connections a peak must have had for a partial fall to trim (below it, only a
/// fall to zero does).
const PEAK_WORTH_TRIMMING: u64 = 64;

/// What the trimming thread remembers between samples.
#[derive(Debug, Default)]
struct Watch {
    /// Most connections open at once since the last trim.
    peak: u64,
    /// `accepted` at the last trim: unchanged means nothing happened since.
    accepted: u64,
}

impl Watch {
    /// One sample: true when memory should be given back now.
    fn sample(&mut self, open: u64, accepted: u64) -> bool {
        self.peak = self.peak.max(open);
        let active = accepted != self.accepted;
        let fell = self.peak >= PEAK_WORTH_TRIMMING && open <= self.peak / 4;
        if active && (open == 0 || fell) {
            self.peak = open;
            self.accepted = accepted;
            return true;
        }
        false
    }
}

/// Gives freed heap memory back to the system.
pub fn trim() {
    // SAFETY: malloc_trim only walks the allocator's own arenas, under their locks.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Makes every thread started from now on allocate from the main arena, whose free memory
/// `malloc_trim` returns whole. Call it before the threads start: glibc fixes its arena
/// limit once 8 arenas exist. The cost is one arena lock per allocation the thread cache
/// does not serve; the thread models allocate once per connection.
pub fn one_arena() {
    // SAFETY: mallopt only sets an allocator parameter.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Gives back the pages of the calling thread's stack below what it is using now, from
/// `low` (the stack's lowest address) up: what a deep call touched stays resident in a
/// thread that lives on. One `madvise`; the pages read back as zeros when touched again.
#[inline(never)]
pub fn release_stack_below_here(low: usize) {
    const PAGE: usize = 4096;
    let here = 0u8;
    let sp = std::ptr::addr_of!(here) as usize;
    // A margin below this frame for the madvise call itself (its return address and the
    // wrapper's few words; the 128-byte red zone).
    let end = sp.saturating_sub(512) & !(PAGE - 1);
    let low = (low + PAGE - 1) & !(PAGE - 1);
    if end > low {
        // SAFETY: [low, end) is the calling thread's own stack below its deepest live frame
        // (and that frame's margin): nothing lives there; the pages come back as zeros.
        unsafe { libc::madvise(low as *mut libc::c_void, end - low, libc::MADV_DONTNEED) };
    }
}

/// The lowest address of the calling thread's stack, if the system says.
pub fn own_stack_low() -> Option<usize> {
    // SAFETY: attr is filled by pthread_getattr_np and destroyed after reading it.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size = 0usize;
        let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        (rc == 0).then_some(addr as usize)
    }
}

/// Runs `serve` with the trimming thread beside it; the thread ends when `serve` returns.
pub fn with_trimming<T>(stats: &Stats, serve: impl FnOnce() -> T) -> T {
    let done = Mutex::new(false);
    let wake = Condvar::new();
    std::thread::scope(|s| {
        let spawned = std::thread::Builder::new()
            .name("trim".into())
            .spawn_scoped(s, || {
                let mut watch = Watch::default();
                let mut finished = done.lock().unwrap_or_else(|e| e.into_inner());
                while !*finished {
                    finished = match wake.wait_timeout(finished, TRIM_EVERY) {
                        Ok((g, _)) => g,
                        Err(e) => e.into_inner().0,
                    };
                    if watch.sample(stats.get(Counter::Open), stats.get(Counter::Accepted)) {
                        trim();
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("no memory-trimming thread ({e}): freed memory stays in the heap");
        }
        let r = serve();
        *done.lock().unwrap_or_else(|e| e.into_inner()) = true;
        wake.notify_all();
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_once_a_burst_has_ended() {
        let mut w = Watch::default();
        assert!(!w.sample(0, 0), "nothing happened yet");
        assert!(!w.sample(2000, 2000), "at the peak");
        assert!(!w.sample(900, 2000), "above a quarter of it");
        assert!(w.sample(400, 2000), "fell to a quarter");
        assert!(!w.sample(400, 2000), "and not again while nothing happens");
        assert!(w.sample(0, 2001), "none open after activity");
        assert!(!w.sample(0, 2001));
        assert!(!w.sample(10, 2020), "a small peak");
        assert!(!w.sample(2, 2020));
    }
}
