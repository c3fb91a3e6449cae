//! The send paths: on a domain connection, the application's bytes framed as the
//! connection's [`FrameWriter`](crate::frames::FrameWriter) lays them out (our own large
//! ones stored at the local agent first); to anything else, referenced bytes fetched for the
//! kernel (`send_staged`).

use crate::frames::{self, Iovs, Resume, Seg, Segs};
use crate::recv::sub_iov;
use crate::{regions, stats, sys, with_reg, FdState, State, ACTIVE, CONFIG, REGION_COUNT};
use iolab_odb::proto;
use libc::{c_int, c_void, iovec};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;

/// Splits application memory into bytes we have (Real) and bytes still at an agent (Virt).
fn classify(pieces: &[iovec], segs: &mut Segs) {
    enum Found {
        Virt(regions::Region),
        Real(usize),
        Again,
    }
    for pc in pieces {
        let (mut a, e) = (pc.iov_base as usize, pc.iov_base as usize + pc.iov_len);
        while a < e {
            // one short registry section per step; the pushes (allocation) happen outside
            let found = with_reg(|r| {
                if let Some(i) = r.regions.find(a) {
                    // no stale-page check: see the invariants of `alloc`
                    let g = r.regions.v[i];
                    if g.dead {
                        // freed memory sent anyway: accessible again, its bytes as they are
                        let _ = r.regions.take(g.start, g.end, false, &mut r.conns);
                        return Found::Again;
                    }
                    return Found::Virt(g);
                }
                let next = r
                    .regions
                    .v
                    .iter()
                    .filter(|g| g.start > a && g.start < e)
                    .map(|g| g.start)
                    .min()
                    .unwrap_or(e);
                Found::Real(next)
            });
            match found {
                Found::Virt(g) => {
                    let end = e.min(g.end);
                    segs.push(Seg::Virt(g.r.slice((a - g.start) as u64, (end - a) as u32)));
                    a = end;
                }
                Found::Again => {}
                Found::Real(next) => {
                    match segs.last_mut() {
                        Some(Seg::Real(p, l)) if *p + *l == a => *l += next - a,
                        _ => segs.push(Seg::Real(a, next - a)),
                    }
                    a = next;
                }
            }
        }
    }
}

/// Our own bytes of at least the threshold go to the local agent and travel as references.
fn store_large(st: &mut State, segs: &mut [Seg]) {
    let th = CONFIG.get().map_or(usize::MAX, |c| c.threshold);
    let Some(store) = st.store.as_mut() else {
        return;
    };
    for s in segs.iter_mut() {
        if let Seg::Real(p, l) = *s {
            if l < th || l > proto::MAX_FRAME as usize {
                continue;
            }
            match store.alloc(l as u32) {
                Ok((dst, r)) => {
                    // SAFETY: p..p+l is real application memory (classify found no protected
                    // page in it); dst..dst+l was just reserved for us in the arena.
                    unsafe { std::ptr::copy_nonoverlapping(p as *const u8, dst, l) };
                    stats::STORED_BYTES.fetch_add(l as u64, Relaxed);
                    *s = Seg::Virt(r);
                }
                Err(_) => {
                    stats::STORE_FALLBACKS.fetch_add(1, Relaxed);
                }
            }
        }
    }
}

pub(crate) fn is_nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL has no memory arguments.
    let f = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    f >= 0 && f & libc::O_NONBLOCK != 0
}

/// Sends what is left of a partly sent header. Ok(true): nothing pending any more.
pub(crate) fn flush_pending(fs: &mut FdState, fd: c_int, flags: c_int) -> Result<bool, c_int> {
    while !fs.tx.pending().is_empty() {
        let pending = fs.tx.pending();
        let v = [iovec {
            iov_base: pending.as_ptr() as *mut c_void,
            iov_len: pending.len(),
        }];
        match sys::sendmsg(fd, &v, flags) {
            Ok(n) => fs.tx.pending_sent(n),
            Err(libc::EAGAIN) if !is_nonblocking(fd) => {}
            Err(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
        if !fs.tx.pending().is_empty() && is_nonblocking(fd) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// One send call on a domain connection: first what the frame under way is owed, then the
/// rest framed (references for what is at an agent or stored there now, R frames for the
/// rest).
pub(crate) fn odb_send(
    st: &mut State,
    fs: &mut FdState,
    fd: c_int,
    iov: &[iovec],
    flags: c_int,
) -> Result<usize, c_int> {
    let total = crate::recv::iov_total(iov);
    if fs.rx.raw() {
        return send_staged(iov, |v| sys::sendmsg(fd, v, flags));
    }
    if !flush_pending(fs, fd, flags)? {
        return Err(libc::EAGAIN);
    }
    let mut scratch = Iovs::new();
    let consumed = match fs.tx.resume(total) {
        Resume::Fresh => 0,
        Resume::Real(k) => {
            sub_iov(iov, 0, k, &mut scratch);
            let n = send_staged(&scratch, |v| sys::sendmsg(fd, v, flags))?;
            stats::R_OUT_BYTES.fetch_add(n as u64, Relaxed);
            fs.tx.sent_real(n);
            if n < k || n == total {
                return Ok(n);
            }
            n
        }
        Resume::Covered(k) if k == total => return Ok(k),
        Resume::Covered(k) => k,
    };
    sub_iov(iov, consumed, total - consumed, &mut scratch);
    let mut segs = Segs::new();
    if REGION_COUNT.load(Relaxed) == 0 {
        segs.extend(
            scratch
                .iter()
                .map(|v| Seg::Real(v.iov_base as usize, v.iov_len)),
        );
    } else {
        classify(&scratch, &mut segs);
    }
    store_large(st, &mut segs);
    let frames = frames::plan(&segs);
    let mut vecs = Iovs::new();
    let nframes = frames::gather(&frames, &segs, &mut vecs);
    let n = match sys::sendmsg(fd, &vecs, flags) {
        Ok(n) => n,
        Err(e) => return if consumed > 0 { Ok(consumed) } else { Err(e) },
    };
    let sent = fs.tx.account(&frames[..nframes], n);
    stats::R_OUT_BYTES.fetch_add(sent.r_bytes as u64, Relaxed);
    stats::V_OUT_BYTES.fetch_add(sent.v_bytes as u64, Relaxed);
    stats::V_OUT_FRAMES.fetch_add(sent.v_frames as u64, Relaxed);
    let consumed = consumed + sent.app;
    if sent.header_cut && consumed == 0 && !is_nonblocking(fd) {
        flush_pending(fs, fd, flags)?;
        return odb_send(st, fs, fd, iov, flags);
    }
    if consumed == 0 {
        return Err(libc::EAGAIN);
    }
    Ok(consumed)
}

/// Before the kernel writes into application memory (any fd): protected pages there must go.
pub(crate) fn before_kernel_writes(p: *const c_void, len: usize) -> Result<(), c_int> {
    if REGION_COUNT.load(Relaxed) == 0 || !ACTIVE.load(Relaxed) {
        return Ok(());
    }
    with_reg(|st| st.regions.prepare_overwrite(p as usize, len, &mut st.conns))
        .map_err(|_| libc::EIO)
}

/// Before the kernel reads application memory for a non-domain destination: fetch.
fn before_kernel_reads(iov: &[iovec]) -> Result<(), c_int> {
    if REGION_COUNT.load(Relaxed) == 0 || !ACTIVE.load(Relaxed) {
        return Ok(());
    }
    with_reg(|st| {
        let before = stats::FETCH_BYTES.load(Relaxed);
        let ranges = iov.iter().map(|x| (x.iov_base as usize, x.iov_len));
        let r = st.regions.materialize(ranges, &mut st.conns);
        stats::MATERIALIZED.fetch_add(stats::FETCH_BYTES.load(Relaxed) - before, Relaxed);
        r
    })
    .map_err(|_| libc::EIO)
}

/// The staging buffer of `send_staged`, kept between calls (taken out while in use).
static STAGE: Mutex<Vec<u8>> = Mutex::new(Vec::new());
/// Above this many referenced bytes in one call, they are fetched in place instead.
const STAGE_MAX: usize = 4 << 20;

/// Hands application memory that may hold referenced pages to the kernel for a destination
/// outside the domain (the client, a file): `send` gets the iovecs to send, `iov` itself
/// when nothing in it is at an agent, else iovecs whose referenced parts point into a
/// staging buffer of the library's, filled from the agents in pipelined batches. The
/// application's pages stay protected and registered: fetching into them took an
/// `mprotect` to open them, and their buffer's next response another to protect them again
/// (the FE's four per response); left protected, they become dead when the buffer is freed
/// and the next response's reference lands on them for free (see `alloc`). A later send of
/// the same bytes (after a partial write) fetches them again.
pub(crate) fn send_staged(
    iov: &[iovec],
    send: impl FnOnce(&[iovec]) -> Result<usize, c_int>,
) -> Result<usize, c_int> {
    if REGION_COUNT.load(Relaxed) == 0 || !ACTIVE.load(Relaxed) {
        return send(iov);
    }
    let mut segs = Segs::new();
    classify(iov, &mut segs);
    let virt: usize = segs
        .iter()
        .map(|s| match s {
            Seg::Virt(r) => r.len as usize,
            Seg::Real(..) => 0,
        })
        .sum();
    if virt == 0 {
        return send(iov);
    }
    if virt > STAGE_MAX || segs.len() > frames::IOV_MAX {
        before_kernel_reads(iov)?;
        return send(iov);
    }
    let mut stage = std::mem::take(&mut *STAGE.lock().unwrap_or_else(|e| e.into_inner()));
    if stage.len() < virt {
        stage.resize(virt, 0);
    }
    let mut out = Iovs::with_capacity(segs.len());
    let r = match stage_references(&segs, &mut stage, &mut out) {
        Ok(()) => {
            stats::MATERIALIZED.fetch_add(virt as u64, Relaxed);
            send(&out)
        }
        Err(_) => Err(libc::EIO),
    };
    *STAGE.lock().unwrap_or_else(|e| e.into_inner()) = stage;
    r
}

/// The iovecs of `segs` into `out`, each reference's bytes fetched into `stage` (at least
/// as long as all of them) in one pipelined batch.
fn stage_references(segs: &[Seg], stage: &mut [u8], out: &mut Iovs) -> Result<(), c_int> {
    let base = stage.as_mut_ptr();
    with_reg(|st| {
        let mut jobs = regions::Fetches::new();
        let mut res = Ok(());
        let mut at = 0;
        for s in segs {
            match *s {
                Seg::Real(p, l) => out.push(iovec {
                    iov_base: p as *mut c_void,
                    iov_len: l,
                }),
                Seg::Virt(r) => {
                    // SAFETY: at + r.len <= the references' total <= stage.len(): inside
                    // the staging buffer.
                    let dst = unsafe { base.add(at) };
                    out.push(iovec {
                        iov_base: dst.cast(),
                        iov_len: r.len as usize,
                    });
                    res = res.and(jobs.push(r, dst, &mut st.conns));
                    at += r.len as usize;
                }
            }
        }
        res.and(jobs.flush(&mut st.conns))
    })
}
