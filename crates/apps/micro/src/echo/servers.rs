//! The echo servers, one per I/O model (threads, select, poll, epoll, io_uring,
//! iolab-runtime; the peers' runtimes are in `crate::echo::peers`), and [`start`], which runs
//! one on a thread of its own pinned to a CPU.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::fd::{epoll_add, new_epoll, poll_one, read_fd, set_nonblocking, write_all_fd};
use super::{Ctl, Model, BUF};
use crate::osutil;

fn serve_threads(l: TcpListener, ctl: Arc<Ctl>) -> anyhow::Result<()> {
    let lfd = l.as_raw_fd();
    set_nonblocking(lfd);
    let mut handles = Vec::new();
    while !ctl.stopped() {
        if !poll_one(lfd, 50) {
            continue;
        }
        while let Ok(c) = osutil::accept(lfd) {
            let ctl2 = ctl.clone();
            let spawned = std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || {
                    ctl2.register();
                    let mut buf = [0u8; BUF];
                    let fd = c.as_raw_fd();
                    while let Ok(n @ 1..) = read_fd(fd, &mut buf) {
                        if write_all_fd(fd, &buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            match spawned {
                Ok(h) => handles.push(h),
                // The seed's blocking model fails here first (ERROR_NOT_ENOUGH_MEMORY).
                Err(_) => {
                    ctl.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

fn serve_select(l: TcpListener, ctl: Arc<Ctl>) -> anyhow::Result<()> {
    let lfd = l.as_raw_fd();
    set_nonblocking(lfd);
    let mut conns: Vec<OwnedFd> = Vec::new();
    let mut buf = [0u8; BUF];
    while !ctl.stopped() {
        let mut set = crate::limits::FdSet::default();
        set.insert(lfd)?;
        let mut maxfd = lfd;
        for c in &conns {
            set.insert(c.as_raw_fd())?;
            maxfd = maxfd.max(c.as_raw_fd());
        }
        let mut tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 50_000,
        };
        // SAFETY: every fd in the set is < FD_SETSIZE (FdSet refuses others).
        let n = unsafe {
            libc::select(
                maxfd + 1,
                set.as_mut_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut tv,
            )
        };
        if n <= 0 {
            continue;
        }
        let mut i = 0;
        while i < conns.len() {
            let fd = conns[i].as_raw_fd();
            if set.contains(fd) {
                match read_fd(fd, &mut buf) {
                    Ok(n @ 1..) if write_all_fd(fd, &buf[..n]).is_ok() => {}
                    _ => {
                        conns.swap_remove(i);
                        continue;
                    }
                }
            }
            i += 1;
        }
        if set.contains(lfd) {
            while let Ok(c) = osutil::accept(lfd) {
                if (c.as_raw_fd() as usize) < libc::FD_SETSIZE {
                    conns.push(c);
                } else {
                    // Cannot be watched by select: refuse it (closing the socket).
                    ctl.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    Ok(())
}

fn serve_poll(l: TcpListener, ctl: Arc<Ctl>) -> anyhow::Result<()> {
    let lfd = l.as_raw_fd();
    set_nonblocking(lfd);
    let mut fds = vec![libc::pollfd {
        fd: lfd,
        events: libc::POLLIN,
        revents: 0,
    }];
    let mut owned: Vec<Option<OwnedFd>> = vec![None];
    let mut buf = [0u8; BUF];
    while !ctl.stopped() {
        // SAFETY: fds is a valid array of fds.len() pollfd.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 50) };
        if n <= 0 {
            continue;
        }
        let mut i = 1;
        while i < fds.len() {
            if fds[i].revents != 0 {
                let fd = fds[i].fd;
                match read_fd(fd, &mut buf) {
                    Ok(n @ 1..) if write_all_fd(fd, &buf[..n]).is_ok() => {}
                    _ => {
                        fds.swap_remove(i);
                        owned.swap_remove(i);
                        continue;
                    }
                }
            }
            i += 1;
        }
        if fds[0].revents != 0 {
            while let Ok(c) = osutil::accept(lfd) {
                fds.push(libc::pollfd {
                    fd: c.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                owned.push(Some(c));
            }
        }
    }
    Ok(())
}

/// Watches `fd` for input; its events carry `key`.
fn serve_epoll(l: TcpListener, ctl: Arc<Ctl>) -> anyhow::Result<()> {
    let lfd = l.as_raw_fd();
    set_nonblocking(lfd);
    let ep = new_epoll().context("epoll_create1")?;
    epoll_add(ep.as_raw_fd(), lfd, lfd as u64)?;
    let mut conns: HashMap<RawFd, OwnedFd> = HashMap::new();
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
    let mut buf = [0u8; BUF];
    while !ctl.stopped() {
        // SAFETY: events has room for events.len() entries.
        let n = unsafe {
            libc::epoll_wait(ep.as_raw_fd(), events.as_mut_ptr(), events.len() as i32, 50)
        };
        for ev in events.iter().take(n.max(0) as usize) {
            let fd = ev.u64 as RawFd;
            if fd == lfd {
                while let Ok(c) = osutil::accept(lfd) {
                    if epoll_add(ep.as_raw_fd(), c.as_raw_fd(), c.as_raw_fd() as u64).is_ok() {
                        conns.insert(c.as_raw_fd(), c);
                    }
                }
                continue;
            }
            match read_fd(fd, &mut buf) {
                Ok(n @ 1..) if write_all_fd(fd, &buf[..n]).is_ok() => {}
                // Closing the fd removes it from the epoll set.
                _ => drop(conns.remove(&fd)),
            }
        }
    }
    Ok(())
}

fn serve_uring(l: TcpListener, ctl: Arc<Ctl>) -> anyhow::Result<()> {
    use io_uring::{opcode, types, IoUring};
    const ACCEPT: u64 = u64::MAX;
    let lfd = l.as_raw_fd();
    // Buffers are declared before the ring so that the ring is dropped (and its operations
    // cancelled) before they are freed; in-flight operations are also drained below.
    let mut bufs: HashMap<RawFd, (OwnedFd, Box<[u8; BUF]>)> = HashMap::new();
    let mut ring = IoUring::builder()
        .setup_cqsize(32768)
        .setup_clamp()
        .build(4096)
        .context("io_uring setup")?;
    let mut in_flight = 0usize;
    let push = |ring: &mut IoUring, e: io_uring::squeue::Entry| -> anyhow::Result<()> {
        // SAFETY: every SQE points into a buffer owned by `bufs`, kept until its completion.
        while unsafe { ring.submission().push(&e) }.is_err() {
            ring.submit().context("io_uring_enter")?;
        }
        Ok(())
    };
    let accept = || {
        opcode::Accept::new(types::Fd(lfd), std::ptr::null_mut(), std::ptr::null_mut())
            .build()
            .user_data(ACCEPT)
    };
    push(&mut ring, accept())?;
    in_flight += 1;
    let ts = types::Timespec::new().nsec(50_000_000);
    while !ctl.stopped() {
        let args = types::SubmitArgs::new().timespec(&ts);
        match ring.submitter().submit_with_args(1, &args) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) => {}
            Err(e) => return Err(e).context("io_uring_enter"),
        }
        let cqes: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (ud, res) in cqes {
            in_flight -= 1;
            if ud == ACCEPT {
                if res >= 0 {
                    // SAFETY: res is a new connection fd from the accept completion.
                    let c = unsafe { OwnedFd::from_raw_fd(res) };
                    let mut b = Box::new([0u8; BUF]);
                    let e = opcode::Recv::new(types::Fd(res), b.as_mut_ptr(), BUF as u32)
                        .build()
                        .user_data(res as u64);
                    bufs.insert(res, (c, b));
                    push(&mut ring, e)?;
                    in_flight += 1;
                }
                push(&mut ring, accept())?;
                in_flight += 1;
                continue;
            }
            // user_data: fd in the low 32 bits, bit 32 set for a send completion.
            let fd = (ud & 0xffff_ffff) as RawFd;
            let is_send = ud >> 32 == 1;
            if res <= 0 {
                bufs.remove(&fd);
                continue;
            }
            let Some((_, b)) = bufs.get_mut(&fd) else {
                continue;
            };
            let e = if is_send {
                opcode::Recv::new(types::Fd(fd), b.as_mut_ptr(), BUF as u32)
                    .build()
                    .user_data(fd as u64)
            } else {
                // Echo what was received; a short send is rare on loopback and ends the
                // connection rather than being resumed.
                opcode::Send::new(types::Fd(fd), b.as_ptr(), res as u32)
                    .flags(libc::MSG_WAITALL)
                    .build()
                    .user_data(1 << 32 | fd as u64)
            };
            push(&mut ring, e)?;
            in_flight += 1;
        }
    }
    // Cancel what is still posted and wait for it, so no buffer is freed under the kernel.
    let _ = push(
        &mut ring,
        opcode::AsyncCancel2::new(types::CancelBuilder::any())
            .build()
            .user_data(u64::MAX - 1),
    );
    let t0 = Instant::now();
    while in_flight > 0 && t0.elapsed() < Duration::from_secs(2) {
        let args = types::SubmitArgs::new().timespec(&ts);
        let _ = ring.submitter().submit_with_args(1, &args);
        for c in ring.completion() {
            if c.user_data() != u64::MAX - 1 {
                in_flight = in_flight.saturating_sub(1);
            }
        }
    }
    drop(ring);
    drop(bufs);
    Ok(())
}

/// One task per connection on one iolab-runtime loop (io_uring driver, or epoll fallback):
/// the threads model's code, on lightweight tasks.
fn serve_runtime(l: TcpListener, ctl: Arc<Ctl>) -> anyhow::Result<()> {
    use iolab_runtime::{net, sleep, spawn, timeout, Runtime};
    let rt = Runtime::new().context("starting an iolab-runtime loop")?;
    rt.block_on(async move {
        let listener = net::TcpListener::from_std(l).context("runtime listener")?;
        while !ctl.stopped() {
            // The timeout lets the loop notice `stop`; dropping the accept cancels it.
            match timeout(Duration::from_millis(50), listener.accept()).await {
                Err(_) => {}
                Ok(Err(_)) => {
                    // Out of fds or memory: the connection is lost, as in the seed.
                    ctl.refused.fetch_add(1, Ordering::Relaxed);
                    sleep(Duration::from_millis(10)).await;
                }
                Ok(Ok((stream, _))) => {
                    spawn(async move {
                        let mut buf = vec![0u8; BUF];
                        loop {
                            let (r, b) = stream.read(buf).await;
                            buf = b;
                            let n = match r {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            buf.truncate(n);
                            let (r, b) = stream.write_all(buf).await;
                            buf = b;
                            if r.is_err() {
                                break;
                            }
                            buf.resize(BUF, 0);
                        }
                    });
                }
            }
        }
        Ok(())
    })
}

/// A running server: its address and controls.
pub(super) struct Server {
    pub(super) addr: SocketAddr,
    pub(super) ctl: Arc<Ctl>,
    pub(super) join: std::thread::JoinHandle<anyhow::Result<()>>,
}

pub(super) fn start(model: Model, cpu: usize) -> anyhow::Result<Server> {
    // std's bind sets SO_REUSEADDR; the backlog is raised with a second listen() below.
    let l = TcpListener::bind("127.0.0.1:0").context("binding the echo server")?;
    // SAFETY: listen on our own socket (re-listen only updates the backlog).
    unsafe { libc::listen(l.as_raw_fd(), 4096) };
    let addr = l.local_addr()?;
    let ctl = Arc::new(Ctl::default());
    let c2 = ctl.clone();
    let join = std::thread::Builder::new()
        .name(format!("echo-{}", model.name()))
        .spawn(move || {
            let _ = osutil::pin_to(cpu);
            c2.register();
            match model {
                Model::Threads => serve_threads(l, c2),
                Model::Select => serve_select(l, c2),
                Model::Poll => serve_poll(l, c2),
                Model::Epoll => serve_epoll(l, c2),
                Model::Uring => serve_uring(l, c2),
                Model::Runtime => serve_runtime(l, c2),
                Model::Tokio => crate::echo::peers::serve_tokio(l, c2),
                Model::Monoio => crate::echo::peers::serve_monoio(l, c2),
                Model::Glommio => crate::echo::peers::serve_glommio(l, c2),
            }
        })?;
    Ok(Server { addr, ctl, join })
}
