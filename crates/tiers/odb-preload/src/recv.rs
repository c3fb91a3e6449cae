//! The receive path on a domain connection: performs what the connection's
//! [`FrameReader`](crate::frames::FrameReader) asks (reads from the kernel, copies into the
//! application's buffers, places references), and the iovec helpers both paths share.

use crate::frames::{Filled, Iovs, RecvAction};
use crate::{regions, stats, sys, with_reg, FdState, Reg, REGION_COUNT};
use iolab_odb::proto::Ref;
use libc::{c_int, iovec};
use std::sync::atomic::Ordering::Relaxed;

/// The iovecs covering bytes [skip, skip + k) of `iov`.
pub(crate) fn sub_iov(iov: &[iovec], mut skip: usize, mut k: usize, out: &mut Iovs) {
    out.clear();
    for v in iov {
        if k == 0 {
            break;
        }
        if skip >= v.iov_len {
            skip -= v.iov_len;
            continue;
        }
        let take = (v.iov_len - skip).min(k);
        out.push(iovec {
            // SAFETY: skip < iov_len (checked above), so the pointer stays inside the
            // application's iovec; nothing is dereferenced here.
            iov_base: unsafe { (v.iov_base as *mut u8).add(skip) }.cast(),
            iov_len: take,
        });
        k -= take;
        skip = 0;
    }
}

pub(crate) fn iov_total(iov: &[iovec]) -> usize {
    iov.iter().map(|v| v.iov_len).sum()
}

/// Places `r` (covering exactly the bytes of `pieces`) into application memory: partial pages
/// fetched now, whole pages protected and registered for fetch on fault (no `mprotect` when
/// they are the dead pages of the same buffer's last response, see `Registry::cover`).
fn place_virtual(st: &mut Reg, pieces: &[iovec], r: Ref) -> Result<(), c_int> {
    use regions::{round_down, round_up};
    let mut o = 0u64;
    for pc in pieces {
        let (s, e) = (pc.iov_base as usize, pc.iov_base as usize + pc.iov_len);
        let sub = r.slice(o, pc.iov_len as u32);
        let (ps, pe) = (round_up(s), round_down(e));
        if ps < pe {
            // the partial pages at the ends are written now: whatever protects them goes
            // first (their other bytes kept), then head and tail in one pipelined request
            let mut jobs: [(Ref, *mut u8); 2] = [(sub, std::ptr::null_mut()); 2];
            let mut n = 0;
            if ps > s {
                st.regions.prepare_overwrite(s, ps - s, &mut st.conns)?;
                jobs[n] = (sub.slice(0, (ps - s) as u32), s as *mut u8);
                n += 1;
            }
            if e > pe {
                st.regions.prepare_overwrite(pe, e - pe, &mut st.conns)?;
                jobs[n] = (sub.slice((pe - s) as u64, (e - pe) as u32), pe as *mut u8);
                n += 1;
            }
            st.conns.fetch_many(&jobs[..n])?;
            let middle = sub.slice((ps - s) as u64, (pe - ps) as u32);
            if st.regions.cover(ps, pe, middle, &mut st.conns) {
                stats::PROTECTED_BYTES.fetch_add((pe - ps) as u64, Relaxed);
            } else {
                st.conns.fetch(&middle, ps as *mut u8)?;
            }
        } else {
            // less than a whole page: fetch it all now
            st.regions.prepare_overwrite(s, e - s, &mut st.conns)?;
            st.conns.fetch(&sub, s as *mut u8)?;
        }
        o += pc.iov_len as u64;
    }
    stats::V_IN_BYTES.fetch_add(o, Relaxed);
    Ok(())
}

/// The iovecs covering bytes [at, at + k) of `iov` into `out`, made ready for the receive path
/// to write real bytes into: protected pages there are dropped (whole) or fetched (partial).
/// Only the part about to be written: the pages a reference lands on stay protected (see
/// `place_virtual`).
fn writable_part(iov: &[iovec], at: usize, k: usize, out: &mut Iovs) -> Result<(), c_int> {
    sub_iov(iov, at, k, out);
    if REGION_COUNT.load(Relaxed) == 0 {
        return Ok(());
    }
    with_reg(|r| {
        out.iter().try_for_each(|v| {
            r.regions
                .prepare_overwrite(v.iov_base as usize, v.iov_len, &mut r.conns)
        })
    })
    .map_err(|_| libc::EIO)
}

/// One receive call on a domain connection (see `FrameReader` for when it returns short).
pub(crate) fn odb_recv(
    fs: &mut FdState,
    fd: c_int,
    iov: &[iovec],
    flags: c_int,
) -> Result<usize, c_int> {
    let rx = &mut fs.rx;
    if rx.broken() {
        return Err(libc::ECONNRESET);
    }
    let total = iov_total(iov);
    if total == 0 {
        return Ok(0);
    }
    rx.start_call();
    let mut produced = 0usize;
    let mut scratch = Iovs::new();
    // Ends a call: with bytes, report them (the error, if any, comes back next time).
    macro_rules! finish {
        ($e:expr) => {
            return if produced > 0 { Ok(produced) } else { $e }
        };
    }
    loop {
        if produced == total {
            return Ok(produced);
        }
        let fl = if produced > 0 {
            flags | libc::MSG_DONTWAIT
        } else {
            flags
        };
        match rx.next(total - produced, produced) {
            RecvAction::Copy { len, frame } => {
                if writable_part(iov, produced, len, &mut scratch).is_err() {
                    finish!(Err(libc::EIO));
                }
                copy_to_iov(iov, produced, &rx.buffered()[..len]);
                rx.copied(len, frame);
                if frame {
                    stats::R_IN_BYTES.fetch_add(len as u64, Relaxed);
                }
                produced += len;
            }
            RecvAction::Place { part, len } => {
                sub_iov(iov, produced, len, &mut scratch);
                if with_reg(|r| place_virtual(r, &scratch, part)).is_err() {
                    // The referenced bytes cannot be had (agent gone, buffer evicted, forged
                    // reference): fail the connection, never hand out wrong bytes.
                    rx.fail();
                    return Err(libc::ECONNRESET);
                }
                rx.placed(len);
                produced += len;
            }
            RecvAction::ReadDirect { len, frame } => {
                if writable_part(iov, produced, len, &mut scratch).is_err() {
                    finish!(Err(libc::EIO));
                }
                match sys::recvmsg(fd, &scratch, fl) {
                    Ok(0) => finish!(Ok(0)),
                    Ok(n) => {
                        produced += n;
                        if frame {
                            rx.read_direct(n);
                            stats::R_IN_BYTES.fetch_add(n as u64, Relaxed);
                        }
                        if n < len {
                            return Ok(produced); // the socket is drained
                        }
                    }
                    Err(e) => finish!(Err(e)),
                }
            }
            RecvAction::Fill => match read_stream(rx.space(), fd, fl) {
                Ok(n) => match rx.filled(n) {
                    Filled::Data => {}
                    Filled::Eof => finish!(Ok(0)),
                    Filled::Broken => finish!(Err(libc::ECONNRESET)),
                },
                Err(e) => finish!(Err(e)),
            },
            RecvAction::Return => return Ok(produced),
            RecvAction::Unframed => {
                stats::RAW_CONNS.fetch_add(1, Relaxed);
            }
            RecvAction::ProtoError => {
                stats::PROTO_ERRORS.fetch_add(1, Relaxed);
                finish!(Err(libc::ECONNRESET));
            }
        }
    }
}

/// Reads from the kernel into the free end of the stream buffer; returns the bytes read.
/// (An application's MSG_WAITALL would wait for the buffer's size, not for its own: the
/// receive loop asks again instead.)
fn read_stream(space: &mut [u8], fd: c_int, fl: c_int) -> Result<usize, c_int> {
    sys::recv(fd, space.as_mut_ptr(), space.len(), fl & !libc::MSG_WAITALL)
}

/// Copies `src` into the application's iovecs starting `at` bytes into them.
fn copy_to_iov(iov: &[iovec], mut at: usize, mut src: &[u8]) {
    for v in iov {
        if src.is_empty() {
            return;
        }
        if at >= v.iov_len {
            at -= v.iov_len;
            continue;
        }
        let k = (v.iov_len - at).min(src.len());
        // SAFETY: the application's buffer: iov_base..iov_base+iov_len is writable memory it
        // handed to recv (prepare_overwrite made any protected page of it writable).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), (v.iov_base as *mut u8).add(at), k) };
        src = &src[k..];
        at = 0;
    }
}
