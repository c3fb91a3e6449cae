//! The readiness fallback: one epoll instance per loop.
//!
//! A wait for readiness is a *waiter* (slab key) attached to its descriptor. Each descriptor
//! is registered EPOLLONESHOT with the union of its waiters' interests and re-armed only
//! while waiters remain, so a closed and reused descriptor number can at worst cause one
//! spurious wake-up (the operation then retries, gets EAGAIN and waits again).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::task::Waker;
use std::time::Duration;

use iolab_sys::cvt;
use slab::Slab;

use super::{Deferred, KeyError, OpKey};
use crate::op::Interest;

const WAKE_TOKEN: u64 = u64::MAX;

struct Waiter {
    fd: RawFd,
    interest: Interest,
    waker: Option<Waker>,
    ready: bool,
    gen: u64,
}

/// How a poll of a waiter went (decided under the driver's borrow).
pub(crate) enum Polled {
    /// Ready; the waiter is removed.
    Ready,
    Pending,
    /// Pending, and the stored waker would not wake the caller: store a clone made
    /// outside the borrow ([`Epoll::set_waker`]).
    NewWaker,
}

#[derive(Default)]
struct FdState {
    waiters: Vec<usize>,
    /// Events the kernel registration is armed with (0: disarmed or unknown).
    armed: u32,
}

pub(crate) struct Epoll {
    epfd: OwnedFd,
    efd: RawFd,
    waiters: Slab<Waiter>,
    fds: HashMap<RawFd, FdState>,
    events: Vec<libc::epoll_event>,
    id: u64,
    next_gen: u64,
    /// Wakers to wake once the core has released the driver.
    pub(crate) deferred: Deferred,
}

fn mask(i: Interest) -> u32 {
    match i {
        Interest::Readable => (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
        Interest::Writable => libc::EPOLLOUT as u32,
    }
}

impl Epoll {
    pub(crate) fn new(efd: RawFd, id: u64) -> io::Result<Epoll> {
        // SAFETY: epoll_create1 returns a fresh descriptor or -1.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: fd is ours alone.
        let epfd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: WAKE_TOKEN,
        };
        // SAFETY: valid epoll fd, eventfd and event struct.
        cvt(unsafe { libc::epoll_ctl(epfd.as_raw_fd(), libc::EPOLL_CTL_ADD, efd, &mut ev) })?;
        Ok(Epoll {
            epfd,
            efd,
            waiters: Slab::new(),
            fds: HashMap::new(),
            events: vec![libc::epoll_event { events: 0, u64: 0 }; 1024],
            id,
            next_gen: 0,
            deferred: Deferred::default(),
        })
    }

    pub(crate) fn live_ops(&self) -> usize {
        self.waiters.len()
    }

    fn ctl(&self, op: i32, fd: RawFd, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events,
            u64: fd as u64,
        };
        // SAFETY: valid epoll fd and event struct; a bad `fd` is reported as an error.
        cvt(unsafe { libc::epoll_ctl(self.epfd.as_raw_fd(), op, fd, &mut ev) }).map(|_| ())
    }

    fn arm(&mut self, fd: RawFd, fresh: bool) -> io::Result<()> {
        let st = self.fds.get(&fd).expect("armed fd has state");
        let want = st
            .waiters
            .iter()
            .fold(0u32, |m, &k| m | mask(self.waiters[k].interest));
        if want == 0 || (st.armed & want == want) {
            return Ok(());
        }
        let events = want | libc::EPOLLONESHOT as u32;
        let (first, second) = if fresh {
            (libc::EPOLL_CTL_ADD, libc::EPOLL_CTL_MOD)
        } else {
            (libc::EPOLL_CTL_MOD, libc::EPOLL_CTL_ADD)
        };
        match self.ctl(first, fd, events) {
            Ok(()) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EEXIST) | Some(libc::ENOENT)) => {
                self.ctl(second, fd, events)?
            }
            Err(e) => return Err(e),
        }
        if let Some(st) = self.fds.get_mut(&fd) {
            st.armed = want;
        }
        Ok(())
    }

    /// Registers a wait for `interest` on `fd`; returns its key. On error the waker comes
    /// back with it, to be dropped outside the borrow.
    pub(crate) fn add_waiter(
        &mut self,
        fd: RawFd,
        interest: Interest,
        waker: Waker,
    ) -> Result<OpKey, (io::Error, Option<Waker>)> {
        self.next_gen += 1;
        let gen = self.next_gen;
        let index = self.waiters.insert(Waiter {
            fd,
            interest,
            waker: Some(waker),
            ready: false,
            gen,
        });
        let key = OpKey {
            loop_id: self.id,
            index,
            gen,
        };
        let fresh = !self.fds.contains_key(&fd);
        self.fds.entry(fd).or_default().waiters.push(index);
        if let Err(e) = self.arm(fd, fresh) {
            return Err((e, self.remove_waiter(&key)));
        }
        Ok(key)
    }

    fn waiter(&mut self, key: &OpKey) -> Result<&mut Waiter, KeyError> {
        if key.loop_id != self.id {
            return Err(KeyError::OtherLoop);
        }
        match self.waiters.get_mut(key.index) {
            Some(w) if w.gen == key.gen => Ok(w),
            _ => Err(KeyError::Stale),
        }
    }

    pub(crate) fn poll_waiter(&mut self, key: &OpKey, waker: &Waker) -> Result<Polled, KeyError> {
        let w = self.waiter(key)?;
        Ok(if w.ready {
            self.waiters.remove(key.index);
            Polled::Ready
        } else if w.waker.as_ref().is_some_and(|x| x.will_wake(waker)) {
            Polled::Pending
        } else {
            Polled::NewWaker
        })
    }

    /// Stores the waker of waiter `key`; returns the one it replaces (dropped by the caller
    /// outside the borrow).
    pub(crate) fn set_waker(&mut self, key: &OpKey, waker: Waker) -> Option<Waker> {
        self.waiter(key).ok()?.waker.replace(waker)
    }

    /// Removes waiter `key` (ignored if it is not a live waiter of this loop); returns its
    /// waker, to be dropped outside the borrow.
    pub(crate) fn remove_waiter(&mut self, key: &OpKey) -> Option<Waker> {
        self.waiter(key).ok()?;
        let w = self.waiters.remove(key.index);
        if let Some(st) = self.fds.get_mut(&w.fd) {
            st.waiters.retain(|&k| k != key.index);
            if st.waiters.is_empty() {
                self.fds.remove(&w.fd);
            }
        }
        w.waker
    }

    fn on_event(&mut self, fd: RawFd, revents: u32) {
        let Some(st) = self.fds.get_mut(&fd) else {
            return;
        };
        st.armed = 0;
        let err = (libc::EPOLLERR | libc::EPOLLHUP) as u32;
        let waiters = &mut self.waiters;
        let wakers = &mut self.deferred.wakers;
        st.waiters.retain(|&k| {
            let w = &mut waiters[k];
            let hit = revents & (mask(w.interest) | err) != 0;
            if hit {
                w.ready = true;
                wakers.extend(w.waker.take());
            }
            !hit
        });
        if st.waiters.is_empty() {
            self.fds.remove(&fd);
        } else if let Err(e) = self.arm(fd, false) {
            // Cannot re-arm (descriptor closed under us): wake the rest so they see the error.
            let _ = e;
            if let Some(st) = self.fds.remove(&fd) {
                for k in st.waiters {
                    let w = &mut self.waiters[k];
                    w.ready = true;
                    self.deferred.wakers.extend(w.waker.take());
                }
            }
        }
    }

    pub(crate) fn turn(&mut self, timeout: Option<Duration>) {
        let ms: i32 = match timeout {
            None => -1,
            // Round up: a timer must never fire early.
            Some(d) => d.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32,
        };
        // SAFETY: `events` is a live buffer of the length we pass.
        let n = unsafe {
            libc::epoll_wait(
                self.epfd.as_raw_fd(),
                self.events.as_mut_ptr(),
                self.events.len() as i32,
                ms,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                panic!("iolab-runtime: epoll_wait failed: {e}");
            }
            return;
        }
        for i in 0..n as usize {
            let ev = self.events[i];
            if ev.u64 == WAKE_TOKEN {
                let mut buf = 0u64;
                // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd.
                unsafe { libc::read(self.efd, &mut buf as *mut u64 as *mut _, 8) };
            } else {
                self.on_event(ev.u64 as RawFd, ev.events);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiter key whose slot was freed and reused, or that names another loop, reaches no
    /// waiter.
    #[test]
    fn stale_and_foreign_keys_are_errors() {
        let mut fds = [0; 2];
        // SAFETY: fds is a valid array of two ints.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: eventfd returns a fresh descriptor or -1.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        let mut e = Epoll::new(efd, 7).unwrap();
        let w = Waker::noop().clone();
        let old = e.add_waiter(fds[0], Interest::Readable, w.clone()).unwrap();
        assert!(e.remove_waiter(&old).is_some());
        let new = e.add_waiter(fds[0], Interest::Readable, w).unwrap();
        assert_eq!(new.index, old.index, "the slot is reused");
        assert!(matches!(
            e.poll_waiter(&old, Waker::noop()),
            Err(KeyError::Stale)
        ));
        assert!(e.remove_waiter(&old).is_none());
        let foreign = OpKey { loop_id: 8, ..new };
        assert!(matches!(
            e.poll_waiter(&foreign, Waker::noop()),
            Err(KeyError::OtherLoop)
        ));
        assert!(e.remove_waiter(&foreign).is_none());
        assert_eq!(e.live_ops(), 1, "the live waiter was not touched");
        assert!(e.remove_waiter(&new).is_some());
        drop(e);
        for fd in [fds[0], fds[1], efd] {
            // SAFETY: closes descriptors created above.
            unsafe { libc::close(fd) };
        }
    }
}
