//! iolab-runtime: lightweight tasks on completion I/O (io_uring), with an epoll fallback.
//! (Being written: see crates/runtime/README or the crate docs once they land.)
