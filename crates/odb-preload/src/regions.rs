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

pub const PAGE: usize = 4096;
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

pub fn round_up(x: usize) -> usize {
    (x + PAGE - 1) & !(PAGE - 1)
}
pub fn round_down(x: usize) -> usize {
    x & !(PAGE - 1)
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
        let mut i = 0;
        while i < self.v.len() {
            let g = self.v[i];
            if g.end <= a || g.start >= b {
                i += 1;
                continue;
            }
            let (cs, ce) = (g.start.max(a), g.end.min(b));
            covered += ce - cs;
            self.v.swap_remove(i);
            if g.start < cs {
                self.v.push(g.part(g.start, cs));
            }
            if ce < g.end {
                self.v.push(g.part(ce, g.end));
            }
        }
        Some(covered)
    }

    /// Registers [a, b) (page-aligned) as holding `r`'s bytes: whatever regions covered it
    /// (live bytes being replaced, or dead pages of a freed buffer) give it up, and the pages
    /// are protected — with no system call at all when they all were already (a buffer
    /// reused for a response laid out as the last one it held). False if it cannot be
    /// registered (no room, mprotect refused): the range is then accessible and unregistered,
    /// the caller fetches the bytes.
    pub fn cover(&mut self, a: usize, b: usize, r: Ref) -> bool {
        debug_assert!(a % PAGE == 0 && b % PAGE == 0 && a < b);
        let Some(covered) = self.cut(a, b) else {
            self.unprotect(a, b);
            return false;
        };
        if !self.has_room(1) {
            self.unprotect(a, b);
            return false;
        }
        if covered < b - a {
            if sys::mprotect(a as *mut _, b - a, libc::PROT_NONE).is_err() {
                self.unprotect(a, b);
                return false;
            }
        } else {
            crate::stats::DEAD_REUSED
                .fetch_add((b - a) as u64, std::sync::atomic::Ordering::Relaxed);
        }
        self.add(a, b, r);
        true
    }

    /// Makes [a, b) accessible (its regions gone: the caller overwrites every byte of it).
    fn unprotect(&mut self, a: usize, b: usize) {
        if self.overlaps(a, b) {
            let _ = self.cut(a, b);
            let _ = sys::mprotect(a as *mut _, b - a, libc::PROT_READ | libc::PROT_WRITE);
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
        let mut i = 0;
        while i < self.v.len() {
            let g = self.v[i];
            if g.end <= a || g.start >= b {
                i += 1;
                continue;
            }
            let (cs, ce) = (g.start.max(a), g.end.min(b));
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
            self.v.swap_remove(i);
            for rem in [left, right].into_iter().flatten() {
                if self.has_room(1) {
                    self.v.push(rem);
                } else {
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
            }
            // slot i now holds another region (or nothing): look at it again
        }
        err
    }

    /// Before the kernel or we write [p, p+len): the pages entirely inside are dropped (their
    /// virtual bytes are being replaced), the partly covered ones are fetched (their other
    /// bytes must survive).
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
        r = r.and(jobs.flush(conns));
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
