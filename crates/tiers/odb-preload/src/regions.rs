//! The registry of protected ranges (the seed's RZM) and the SIGSEGV page fetch.
//!
//! Invariants:
//! - every range in the registry is page-aligned and mapped PROT_NONE by us; a live one
//!   holds bytes `r` names (the buffer agent has them; this memory does not), a dead one
//!   holds nothing anybody wants (the application freed the block: see `alloc`'s pool) and
//!   is only left protected so that a reference landing there again costs no `mprotect`;
//! - ranges never overlap;
//! - the registry never grows past its capacity, reserved once at start: the signal handler
//!   splits ranges without allocating; when it is full, receivers fetch eagerly instead;
//! - the library never touches protected memory while holding its lock (it classifies ranges
//!   by address only and hands real bytes to the kernel, which reports EFAULT rather than
//!   faulting), so a SIGSEGV on a registered page never finds the lock held by its own thread.

use crate::agentconn::Conns;
use crate::sys;
use iolab_odb::proto::Ref;
use std::sync::atomic::Ordering::Relaxed;

pub use crate::pages::{round_down, round_up, PAGE};
pub const CAPACITY: usize = 16384;

#[derive(Clone, Copy, Debug)]
pub struct Region {
    pub start: usize,
    pub end: usize,
    /// The bytes of [start, end): `r.len == end - start` (meaningless when `dead`).
    pub r: Ref,
    /// Freed memory kept protected: made accessible again without a fetch.
    pub dead: bool,
}

impl Region {
    /// The part [a, b) of this region (inside it), same state.
    fn part(&self, a: usize, b: usize) -> Region {
        Region {
            start: a,
            end: b,
            r: self.r.slice((a - self.start) as u64, (b - a) as u32),
            dead: self.dead,
        }
    }
}

pub struct Registry {
    pub v: Vec<Region>,
}

impl Registry {
    pub fn new() -> Registry {
        Registry {
            v: Vec::with_capacity(CAPACITY),
        }
    }

    pub fn has_room(&self, n: usize) -> bool {
        self.v.len() + n <= CAPACITY
    }

    pub fn add(&mut self, start: usize, end: usize, r: Ref) {
        debug_assert!(self.has_room(1) && start % PAGE == 0 && end % PAGE == 0);
        self.v.push(Region {
            start,
            end,
            r,
            dead: false,
        });
    }

    /// Takes the regions overlapping [a, b) out of the registry, leaving their parts outside
    /// it registered (still protected), without touching any page; returns how many bytes of
    /// [a, b) they covered (all protected). False if a remainder found no room (nothing
    /// changed then).
    fn cut(&mut self, a: usize, b: usize) -> Option<usize> {
        let spanning = self.v.iter().filter(|g| g.start < a && b < g.end).count();
        if !self.has_room(spanning) {
            return None;
        }
        let mut covered = 0;
        self.remove_overlapping(a, b, |v, g, cs, ce| {
            covered += ce - cs;
            if g.start < cs {
                v.push(g.part(g.start, cs));
            }
            if ce < g.end {
                v.push(g.part(ce, g.end));
            }
        });
        Some(covered)
    }

    /// Takes every region overlapping [a, b) out of the registry and calls `each` with the
    /// list (for what it keeps of it), the region and its part inside, [cs, ce).
    fn remove_overlapping(
        &mut self,
        a: usize,
        b: usize,
        mut each: impl FnMut(&mut Vec<Region>, Region, usize, usize),
    ) {
        let mut i = 0;
        while i < self.v.len() {
            let g = self.v[i];
            if g.end <= a || g.start >= b {
                i += 1;
                continue;
            }
            self.v.swap_remove(i);
            each(&mut self.v, g, g.start.max(a), g.end.min(b));
            // slot i now holds another region (or nothing; what `each` kept lies outside
            // [a, b)): look at it again
        }
    }

    /// Registers [a, b) (page-aligned) as holding `r`'s bytes: whatever regions covered it
    /// (live bytes being replaced, or dead pages of a freed buffer) give it up, and the pages
    /// are protected — with no system call at all when they all were already (a buffer
    /// reused for a response laid out as the last one it held). False if it cannot be
    /// registered (no room, mprotect refused): the range is then accessible and unregistered,
    /// and the caller fetches the bytes into it.
    pub fn cover(&mut self, a: usize, b: usize, r: Ref, conns: &mut Conns) -> bool {
        debug_assert!(a % PAGE == 0 && b % PAGE == 0 && a < b);
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        match self.cut(a, b) {
            Some(covered) if self.has_room(1) => {
                if covered == b - a {
                    crate::stats::DEAD_REUSED.fetch_add((b - a) as u64, Relaxed);
                } else if sys::mprotect(a as *mut _, b - a, libc::PROT_NONE).is_err() {
                    // what the cut regions covered is still protected
                    let _ = sys::mprotect(a as *mut _, b - a, rw);
                    return false;
                }
                self.add(a, b, r);
                true
            }
            Some(covered) => {
                if covered > 0 {
                    let _ = sys::mprotect(a as *mut _, b - a, rw);
                }
                false
            }
            None => {
                // no room to split a region around [a, b): `take` makes the parts it cannot
                // keep registered real (the range itself is overwritten: no fetch)
                let _ = self.take(a, b, false, conns);
                false
            }
        }
    }

    /// The application freed [a, b): its live regions there become dead (no bytes to
    /// fetch any more; the pages stay protected, for `cover` to reuse). Without room to split
    /// a region at the edges, that region is unprotected instead.
    pub fn kill(&mut self, a: usize, b: usize, conns: &mut Conns) {
        for i in 0..self.v.len() {
            let g = self.v[i];
            if g.start >= a && g.end <= b {
                self.v[i].dead = true;
            }
        }
        // regions reaching outside the block (not made by the receive path, which registers
        // within one buffer): give up the freed part
        while let Some(g) = self
            .v
            .iter()
            .find(|g| !g.dead && g.start < b && a < g.end)
            .copied()
        {
            let _ = self.take(g.start.max(a), g.end.min(b), false, conns);
        }
    }

    pub fn overlaps(&self, a: usize, b: usize) -> bool {
        self.v.iter().any(|g| g.start < b && a < g.end)
    }

    pub fn find(&self, addr: usize) -> Option<usize> {
        self.v.iter().position(|g| g.start <= addr && addr < g.end)
    }

    /// Takes [a, b) (page-aligned) out of the registry: unprotects it and, with `fetch`,
    /// fills it from the agents. Returns the first fetch error (the range is readable then,
    /// but its bytes are not the payload's: the caller must fail the operation).
    /// No allocation (remainders reuse the slot and the reserved capacity).
    pub fn take(&mut self, a: usize, b: usize, fetch: bool, conns: &mut Conns) -> Result<(), i32> {
        let mut jobs = Fetches::new();
        let r = self.take_into(a, b, fetch.then_some(&mut jobs), conns);
        r.and(jobs.flush(conns))
    }

    /// `take`, with the fetches queued in `jobs` (sent as pipelined batches: one round trip
    /// to the agent for the pieces of several ranges) instead of one round trip each.
    pub fn take_into(
        &mut self,
        a: usize,
        b: usize,
        mut jobs: Option<&mut Fetches>,
        conns: &mut Conns,
    ) -> Result<(), i32> {
        let mut err = Ok(());
        self.remove_overlapping(a, b, |v, g, cs, ce| {
            // No stale-page check (memory unmapped and mapped again readable): `alloc`
            // keeps registered pages out of memory glibc could give back.
            let _ = sys::mprotect(cs as *mut _, ce - cs, libc::PROT_READ | libc::PROT_WRITE);
            match jobs.as_deref_mut() {
                Some(j) if !g.dead => {
                    let r = g.r.slice((cs - g.start) as u64, (ce - cs) as u32);
                    if let Err(e) = j.push(r, cs as *mut u8, conns) {
                        err = err.and(Err(e));
                    }
                }
                _ => {}
            }
            let left = (g.start < cs).then(|| g.part(g.start, cs));
            let right = (ce < g.end).then(|| g.part(ce, g.end));
            for rem in [left, right].into_iter().flatten() {
                if v.len() < CAPACITY {
                    v.push(rem);
                    continue;
                }
                // no room to keep it virtual: make it real now
                let _ = sys::mprotect(
                    rem.start as *mut _,
                    rem.end - rem.start,
                    libc::PROT_READ | libc::PROT_WRITE,
                );
                if rem.dead {
                    continue;
                }
                if let Err(e) = conns.fetch(&rem.r, rem.start as *mut u8) {
                    err = err.and(Err(e));
                }
            }
        });
        err
    }

    /// Before the kernel or we write [p, p+len): the pages entirely inside are dropped (their
    /// virtual bytes are being replaced), the partly covered ones are fetched (their other
    /// bytes must survive) — unless the agent answers that it evicted their buffer after
    /// every byte of it was delivered: then, as in the fault handler, the application is
    /// recycling memory it forwarded long ago (nginx reading the next response into a
    /// buffer whose neighbour on the page it sent), and those bytes are zeroed, not an
    /// error (with a full agent, buffers are evicted as soon as they are delivered, and the
    /// FE's reads failed with EIO).
    pub fn prepare_overwrite(
        &mut self,
        p: usize,
        len: usize,
        conns: &mut Conns,
    ) -> Result<(), i32> {
        if self.v.is_empty() || len == 0 {
            return Ok(());
        }
        let q = p + len;
        let mut r = Ok(());
        // the two partial pages' fetches go in one pipelined request, as `materialize`'s do
        let mut jobs = Fetches::new();
        if p % PAGE != 0 {
            r = r.and(self.take_into(round_down(p), round_down(p) + PAGE, Some(&mut jobs), conns));
        }
        if q % PAGE != 0 && round_down(q) >= round_up(p) {
            r = r.and(self.take_into(round_down(q), round_down(q) + PAGE, Some(&mut jobs), conns));
        }
        r = r.and(jobs.flush_recycled(conns));
        if round_up(p) < round_down(q) {
            r = r.and(self.take(round_up(p), round_down(q), false, conns));
        }
        r
    }

    /// Before the kernel reads the ranges (p, len) for a destination outside the domain:
    /// fetch them, every piece of every range in pipelined batches (nginx's `writev` of a
    /// response to the client names its header buffer and its proxy buffers: their
    /// references were fetched one round trip each).
    pub fn materialize(
        &mut self,
        ranges: impl Iterator<Item = (usize, usize)>,
        conns: &mut Conns,
    ) -> Result<(), i32> {
        if self.v.is_empty() {
            return Ok(());
        }
        let mut jobs = Fetches::new();
        let mut err = Ok(());
        for (p, len) in ranges.filter(|r| r.1 > 0) {
            err = err.and(self.take_into(round_down(p), round_up(p + len), Some(&mut jobs), conns));
        }
        err.and(jobs.flush(conns))
    }
}

/// Fetches queued for one pipelined request per agent batch (fixed size: usable from the
/// signal handler, no allocation).
pub struct Fetches {
    jobs: [(Ref, *mut u8); 8],
    n: usize,
}

impl Fetches {
    pub fn new() -> Fetches {
        let none = Ref {
            len: 0,
            agent_id: 0,
            agent: std::net::SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0),
            offset: 0,
            buf_id: 0,
        };
        Fetches {
            jobs: [(none, std::ptr::null_mut()); 8],
            n: 0,
        }
    }

    /// Queues a fetch of `r` into `dst` (unprotected, writable for `r.len` bytes); a full
    /// queue is sent first.
    pub fn push(&mut self, r: Ref, dst: *mut u8, conns: &mut Conns) -> Result<(), i32> {
        let mut res = Ok(());
        if self.n == self.jobs.len() {
            res = self.flush(conns);
        }
        self.jobs[self.n] = (r, dst);
        self.n += 1;
        res
    }

    pub fn flush(&mut self, conns: &mut Conns) -> Result<(), i32> {
        let n = std::mem::take(&mut self.n);
        conns.fetch_many(&self.jobs[..n])
    }

    /// `flush` for pages the application is reusing: a piece whose buffer was evicted after
    /// full delivery (EALREADY) is zero-filled and counted (`GONE_PAGES`); any other failure
    /// is still an error. (A pipelined batch stops at its first such answer: the pieces are
    /// then fetched one by one.)
    pub fn flush_recycled(&mut self, conns: &mut Conns) -> Result<(), i32> {
        let n = std::mem::take(&mut self.n);
        match conns.fetch_many(&self.jobs[..n]) {
            Err(libc::EALREADY) => {}
            r => return r,
        }
        for (r, dst) in &self.jobs[..n] {
            match conns.fetch(r, *dst) {
                Ok(()) => {}
                Err(libc::EALREADY) => {
                    crate::stats::GONE_PAGES.fetch_add(1, Relaxed);
                    // SAFETY: `push`'s contract: dst is writable for r.len bytes.
                    unsafe { std::ptr::write_bytes(*dst, 0, r.len as usize) };
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

// ---- SIGSEGV ----

static mut OLD_ACTION: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::uninit();

/// Installs the fault handler (once, from the library constructor, before any thread).
pub fn install() {
    // SAFETY: called once at load time with no other thread running; the sigaction struct is
    // fully initialised; OLD_ACTION is written here and only read by the handler afterwards.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGSEGV, &sa, (&raw mut OLD_ACTION).cast());
    }
}

extern "C" fn handler(sig: i32, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    let ours = crate::with_state_in_handler(|st| {
        st.regions.find(addr)?;
        let page = round_down(addr);
        crate::stats::FAULTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(st.regions.take(page, page + PAGE, true, &mut st.conns))
    });
    match ours {
        Some(Some(Ok(()))) => {} // return: the access is retried on the now-filled page
        Some(Some(Err(libc::EALREADY))) => {
            // The agent certifies that every byte of that buffer was fetched (delivered
            // downstream) before it evicted it: the application is reusing memory it
            // forwarded long ago (nginx recycling a sent buffer). `take` left the page
            // readable; it is zero-filled. (Unknown or expired buffers still abort.)
            crate::stats::GONE_PAGES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // SAFETY: the page was just made PROT_READ|PROT_WRITE by `take` and is ours to fill.
            unsafe { std::ptr::write_bytes(round_down(addr) as *mut u8, 0, PAGE) };
        }
        Some(Some(Err(e))) => {
            // The page cannot be filled with the right bytes: stop this process rather than
            // let it compute on wrong ones (its connections close; nothing wrong is sent).
            sys::stderr("iolab-odb: page fetch failed in fault handler (agent gone?); aborting\n");
            let _ = e;
            // SAFETY: abort is async-signal-safe.
            unsafe { libc::abort() };
        }
        _ => {
            // Not one of our pages: restore the previous disposition and return, so the
            // access faults again and gets the ordinary behaviour (usually a core dump).
            // SAFETY: OLD_ACTION was filled by `install` before this handler could run.
            unsafe {
                libc::sigaction(sig, (&raw const OLD_ACTION).cast(), std::ptr::null_mut());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{DEAD_REUSED, MPROTECTS};
    use std::sync::atomic::Ordering::Relaxed;

    /// Fresh anonymous pages, unmapped on drop.
    struct Pages(usize, usize);
    impl Pages {
        fn new(n: usize) -> Pages {
            // SAFETY: a fresh private anonymous mapping, checked.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    n * PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            Pages(p as usize, n)
        }
        fn page(&self, i: usize) -> usize {
            self.0 + i * PAGE
        }
    }
    impl Drop for Pages {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`.
            unsafe { libc::munmap(self.0 as *mut _, self.1 * PAGE) };
        }
    }

    /// Whether the kernel can read the page at `p` (a protected page makes `write` EFAULT).
    fn readable(p: usize) -> bool {
        let mut fds = [0; 2];
        // SAFETY: pipe2 into a 2-int array; write reads at most one byte at p (the kernel
        // checks the address); both fds closed.
        unsafe {
            assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0);
            let r = libc::write(fds[1], p as *const _, 1);
            libc::close(fds[0]);
            libc::close(fds[1]);
            r == 1
        }
    }

    fn a_ref(len: usize) -> Ref {
        Ref {
            len: len as u32,
            agent_id: 1,
            // nothing listens here: a fetch fails
            agent: std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 1),
            offset: 0,
            buf_id: 7,
        }
    }

    /// MPROTECTS is process-wide: the tests that count it run one at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// `n` fresh pages of which [from, to) held a reference in a buffer since freed (dead),
    /// with the registry and agent connections; the guard serialises the tests.
    fn freed(
        n: usize,
        from: usize,
        to: usize,
    ) -> (std::sync::MutexGuard<'static, ()>, Pages, Registry, Conns) {
        let g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let m = Pages::new(n);
        let (mut reg, mut conns) = (Registry::new(), Conns::new());
        let (a, b) = (m.page(from), m.page(to));
        assert!(reg.cover(a, b, a_ref(b - a), &mut conns));
        assert!(!readable(a) && !readable(b - PAGE));
        reg.kill(m.page(0), m.page(n), &mut conns);
        assert!(reg.v.iter().all(|g| g.dead), "freed: dead");
        assert!(!readable(a), "dead pages stay protected");
        (g, m, reg, conns)
    }

    #[test]
    fn a_reference_on_the_dead_pages_of_a_freed_buffer_costs_no_mprotect() {
        let (_g, m, mut reg, mut conns) = freed(8, 1, 5);
        let (a, b) = (m.page(1), m.page(5));
        assert!(readable(b));
        let (calls, reused) = (MPROTECTS.load(Relaxed), DEAD_REUSED.load(Relaxed));
        assert!(reg.cover(a, b, a_ref(b - a), &mut conns));
        assert_eq!(
            MPROTECTS.load(Relaxed),
            calls,
            "no mprotect for the same pages"
        );
        assert_eq!(DEAD_REUSED.load(Relaxed) - reused, (b - a) as u64);
        assert_eq!(reg.v.len(), 1);
        assert!(!reg.v[0].dead && !readable(a));
    }

    #[test]
    fn a_reference_reaching_past_dead_pages_protects_the_rest_and_keeps_the_outside_dead() {
        let (_g, m, mut reg, mut conns) = freed(8, 2, 6);
        // the next reference covers pages 4..8: 4 and 5 dead already, 6 and 7 not
        let calls = MPROTECTS.load(Relaxed);
        assert!(reg.cover(m.page(4), m.page(8), a_ref(4 * PAGE), &mut conns));
        assert_eq!(MPROTECTS.load(Relaxed), calls + 1);
        assert!((2..8).all(|i| !readable(m.page(i))));
        let mut v: Vec<(usize, usize, bool)> =
            reg.v.iter().map(|g| (g.start, g.end, g.dead)).collect();
        v.sort_unstable();
        assert_eq!(
            v,
            [(m.page(2), m.page(4), true), (m.page(4), m.page(8), false)]
        );
    }

    #[test]
    fn dead_pages_open_without_a_fetch() {
        let (_g, m, mut reg, mut conns) = freed(4, 0, 4);
        // a fault's take (fetch asked: the agent is unreachable, so a fetch would fail)
        assert_eq!(reg.take(m.page(1), m.page(2), true, &mut conns), Ok(()));
        assert!(readable(m.page(1)) && !readable(m.page(0)) && !readable(m.page(2)));
        // an overwrite of a partial page and whole pages: no fetch either
        assert_eq!(
            reg.prepare_overwrite(m.page(2) + 100, 2 * PAGE, &mut conns),
            Ok(())
        );
        assert!(readable(m.page(2)) && readable(m.page(3)) && !readable(m.page(0)));
        assert!(reg.v.iter().all(|g| g.dead) && reg.v.len() == 1);
        // a live page would have needed its bytes: the unreachable agent fails the take
        assert!(reg.cover(m.page(1), m.page(2), a_ref(PAGE), &mut conns));
        assert!(reg.take(m.page(1), m.page(2), true, &mut conns).is_err());
    }

    /// A real agent (arena in the temp dir) serving on a thread until the guard drops.
    struct TestAgent(
        std::sync::Arc<iolab_odb::agent::Agent>,
        std::sync::Arc<std::sync::atomic::AtomicBool>,
    );
    impl Drop for TestAgent {
        fn drop(&mut self) {
            self.1.store(true, std::sync::atomic::Ordering::SeqCst);
            // the serving thread may outlive the test process
            let _ = std::fs::remove_file(self.0.arena_path());
        }
    }
    fn agent(arena: u64) -> TestAgent {
        let cfg = iolab_odb::agent::AgentConfig {
            arena_bytes: arena,
            arena_dir: std::env::temp_dir(),
            drain: std::time::Duration::ZERO,
            ..Default::default()
        };
        let (a, l) = iolab_odb::agent::Agent::bind(cfg).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (a2, s2) = (a.clone(), stop.clone());
        std::thread::spawn(move || a2.serve(l, s2));
        TestAgent(a, stop)
    }

    #[test]
    fn a_partial_overwrite_next_to_a_delivered_and_evicted_buffer_zeroes_it() {
        use iolab_odb::agent::client;
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let ag = agent(2 * PAGE as u64);
        let a = &ag.0;
        // a two-page buffer, fetched in full (delivered), then evicted for the next one
        let (st, _, id) = client::alloc(a.addr(), 2 * PAGE as u32).unwrap();
        assert_eq!(st, iolab_odb::proto::ST_OK);
        assert!(client::fetch(a.addr(), id, 0, 2 * PAGE as u32)
            .unwrap()
            .is_some());
        let (st, _, live) = client::alloc(a.addr(), 2 * PAGE as u32).unwrap();
        assert_eq!(
            st,
            iolab_odb::proto::ST_OK,
            "the delivered buffer made room"
        );
        let at = |buf_id| Ref {
            len: 2 * PAGE as u32,
            agent_id: a.id(),
            agent: a.addr(),
            offset: 0,
            buf_id,
        };
        let m = Pages::new(4);
        let (mut reg, mut conns) = (Registry::new(), Conns::new());
        // SAFETY: the test's own fresh pages, written before they are protected.
        unsafe { std::ptr::write_bytes(m.page(0) as *mut u8, 0xab, 2 * PAGE) };
        assert!(reg.cover(m.page(0), m.page(2), at(id), &mut conns));
        let gone = crate::stats::GONE_PAGES.load(Relaxed);
        // a read into the middle of the two pages: both are partly overwritten
        assert_eq!(
            reg.prepare_overwrite(m.page(0) + 100, PAGE, &mut conns),
            Ok(()),
            "recycled memory, not an error"
        );
        assert_eq!(crate::stats::GONE_PAGES.load(Relaxed) - gone, 2);
        assert!(readable(m.page(0)) && readable(m.page(1)) && reg.v.is_empty());
        // SAFETY: both pages were just made readable.
        let bytes = unsafe { std::slice::from_raw_parts(m.page(0) as *const u8, 2 * PAGE) };
        assert!(
            bytes.iter().all(|&b| b == 0),
            "the unfetchable bytes are zeroed"
        );
        // a buffer the agent never delivered (unknown id) is still an error, and a live one
        // is fetched
        assert!(reg.cover(m.page(2), m.page(4), at(id ^ 1), &mut conns));
        assert!(reg
            .prepare_overwrite(m.page(2) + 100, PAGE, &mut conns)
            .is_err());
        assert!(reg.cover(m.page(2), m.page(4), at(live), &mut conns));
        assert_eq!(
            reg.prepare_overwrite(m.page(2) + 100, PAGE, &mut conns),
            Ok(())
        );
    }

    #[test]
    fn a_full_registry_leaves_the_range_accessible_and_unregistered() {
        let (_g, m, mut reg, mut conns) = freed(4, 0, 3);
        // fill the registry with ranges elsewhere (registered by address only)
        let far = m.page(4) + 16 * PAGE;
        while reg.has_room(1) {
            let at = far + reg.v.len() * 2 * PAGE;
            reg.add(at, at + PAGE, a_ref(PAGE));
        }
        // a reference inside the dead range would split it: no room, so the range is
        // taken out (of the dead parts around it, those with no room left are opened) and
        // the caller fetches into it
        assert!(!reg.cover(m.page(1), m.page(2), a_ref(PAGE), &mut conns));
        assert!(readable(m.page(1)), "the caller writes the bytes here");
        assert!(!reg.overlaps(m.page(1), m.page(2)));
        // every page protected exactly when registered
        for i in 0..3 {
            let p = m.page(i);
            assert_ne!(readable(p), reg.overlaps(p, p + PAGE), "page {i}");
        }
        // full again: a reference on fresh pages cannot be registered, nothing protected
        while reg.has_room(1) {
            let at = far + reg.v.len() * 2 * PAGE;
            reg.add(at, at + PAGE, a_ref(PAGE));
        }
        assert!(!reg.cover(m.page(3), m.page(4), a_ref(PAGE), &mut conns));
        assert!(readable(m.page(3)) && !reg.overlaps(m.page(3), m.page(4)));
    }
}
