//! Files: asynchronous open, positional reads and writes, fsync on io_uring. On the epoll
//! driver these run as plain syscalls on the loop (regular files are always "ready"; a slow
//! disk stalls the loop, as in CPC on Unix: use [`crate::detach`] for long disk work there).
//!
//! [`File::send_to`] sends a file region to a socket without a user-space copy: splice
//! through a pipe on io_uring, sendfile(2) on epoll, and read+write when neither applies.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use io_uring::{opcode, squeue, types};
use iolab_sys::cvt;

use crate::buf::{IoBuf, IoBufMut};
use crate::cond::Cond;
use crate::net::{CloseOp, TcpStream};
use crate::op::{submit_inner, Interest, Operation};

/// How to open a file: like `std::fs::OpenOptions`, plus raw flags (O_DIRECT, O_DSYNC...).
#[derive(Debug, Clone)]
pub struct OpenOptions {
    read: bool,
    write: bool,
    append: bool,
    truncate: bool,
    create: bool,
    create_new: bool,
    custom_flags: i32,
    mode: u32,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions::new()
    }
}

impl OpenOptions {
    pub fn new() -> OpenOptions {
        OpenOptions {
            read: false,
            write: false,
            append: false,
            truncate: false,
            create: false,
            create_new: false,
            custom_flags: 0,
            mode: 0o644,
        }
    }
    pub fn read(&mut self, on: bool) -> &mut Self {
        self.read = on;
        self
    }
    pub fn write(&mut self, on: bool) -> &mut Self {
        self.write = on;
        self
    }
    pub fn append(&mut self, on: bool) -> &mut Self {
        self.append = on;
        self
    }
    pub fn truncate(&mut self, on: bool) -> &mut Self {
        self.truncate = on;
        self
    }
    pub fn create(&mut self, on: bool) -> &mut Self {
        self.create = on;
        self
    }
    pub fn create_new(&mut self, on: bool) -> &mut Self {
        self.create_new = on;
        self
    }
    /// Extra open(2) flags, e.g. `libc::O_DIRECT` (buffers, offsets and lengths must then be
    /// aligned to the device's block size) or `libc::O_DSYNC` (each write reaches stable
    /// storage before it completes).
    pub fn custom_flags(&mut self, flags: i32) -> &mut Self {
        self.custom_flags = flags;
        self
    }
    /// Permission bits for a created file (default 0o644, before umask).
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }

    fn flags(&self) -> io::Result<i32> {
        let acc = match (self.read, self.write || self.append) {
            (true, false) => libc::O_RDONLY,
            (false, true) => libc::O_WRONLY,
            (true, true) => libc::O_RDWR,
            (false, false) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "open: neither read nor write requested",
                ))
            }
        };
        let mut f = acc | libc::O_CLOEXEC | self.custom_flags;
        if self.append {
            f |= libc::O_APPEND;
        }
        if self.truncate {
            f |= libc::O_TRUNC;
        }
        if self.create_new {
            f |= libc::O_CREAT | libc::O_EXCL;
        } else if self.create {
            f |= libc::O_CREAT;
        }
        Ok(f)
    }

    /// Opens `path` (IORING_OP_OPENAT on io_uring).
    pub async fn open(&self, path: impl AsRef<Path>) -> io::Result<File> {
        let path = path.as_ref();
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
        let op = OpenOp {
            path: c,
            flags: self.flags()?,
            mode: self.mode,
        };
        let (r, _) = submit_inner(op, None).await;
        let fd =
            r.map_err(|e| io::Error::new(e.kind(), format!("opening {}: {e}", path.display())))?;
        Ok(File {
            // SAFETY: the open just completed successfully, so `fd` is a new descriptor that
            // nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd as RawFd) },
        })
    }
}

struct OpenOp {
    path: CString,
    flags: i32,
    mode: u32,
}

// SAFETY: the SQE points at `path`, a CString whose heap bytes the boxed op owns.
unsafe impl Operation for OpenOp {
    fn prepare(&mut self) -> squeue::Entry {
        opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), self.path.as_ptr())
            .flags(self.flags)
            .mode(self.mode)
            .build()
    }

    fn attempt(&mut self) -> io::Result<usize> {
        // SAFETY: path is a valid NUL-terminated string.
        cvt(unsafe { libc::open(self.path.as_ptr(), self.flags, self.mode) }).map(|fd| fd as usize)
    }

    fn readiness(&self) -> Option<(RawFd, Interest)> {
        None
    }

    fn orphaned(&mut self, result: io::Result<usize>) {
        if let Ok(fd) = result {
            // SAFETY: fresh descriptor nobody else knows.
            drop(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
    }
}

/// The positional read and write of a file: one operation but for its direction, which the
/// buffer traits (`IoBufMut` to be written into, `IoBuf` to be read from), the opcode and the
/// syscall each spell differently.
macro_rules! positional_op {
    ($(#[$doc:meta])* $name:ident, $buf:ident, $ptr:ident, $opcode:ident, $syscall:ident) => {
        $(#[$doc])*
        struct $name<B> {
            fd: RawFd,
            buf: B,
            offset: u64,
        }

        // SAFETY: the SQE points into the buffer, which its trait guarantees stays put while
        // the operation (which owns it) lives.
        unsafe impl<B: $buf> Operation for $name<B> {
            fn prepare(&mut self) -> squeue::Entry {
                let len = self.buf.len().min(u32::MAX as usize) as u32;
                opcode::$opcode::new(types::Fd(self.fd), self.buf.$ptr(), len)
                    .offset(self.offset)
                    .build()
            }

            fn attempt(&mut self) -> io::Result<usize> {
                let len = self.buf.len();
                // SAFETY: the buffer is valid for len bytes in the transfer's direction:
                // writable for a read (IoBufMut), initialised for a write (IoBuf).
                cvt(unsafe {
                    libc::$syscall(self.fd, self.buf.$ptr().cast(), len, self.offset as i64)
                })
                .map(|n| n as usize)
            }

            fn readiness(&self) -> Option<(RawFd, Interest)> {
                None
            }
        }
    };
}

positional_op!(
    /// `pread` into the buffer (IORING_OP_READ).
    ReadAtOp, IoBufMut, stable_mut_ptr, Read, pread
);
positional_op!(
    /// `pwrite` from the buffer (IORING_OP_WRITE).
    WriteAtOp, IoBuf, stable_ptr, Write, pwrite
);

struct FsyncOp {
    fd: RawFd,
    data_only: bool,
}

// SAFETY: no pointer in the SQE.
unsafe impl Operation for FsyncOp {
    fn prepare(&mut self) -> squeue::Entry {
        let mut op = opcode::Fsync::new(types::Fd(self.fd));
        if self.data_only {
            op = op.flags(types::FsyncFlags::DATASYNC);
        }
        op.build()
    }

    fn attempt(&mut self) -> io::Result<usize> {
        // SAFETY: plain syscalls on our descriptor.
        let r = unsafe {
            if self.data_only {
                libc::fdatasync(self.fd)
            } else {
                libc::fsync(self.fd)
            }
        };
        cvt(r).map(|_| 0)
    }

    fn readiness(&self) -> Option<(RawFd, Interest)> {
        None
    }
}

struct SpliceOp {
    fd_in: RawFd,
    off_in: i64,
    fd_out: RawFd,
    len: u32,
    /// Where -EAGAIN can come from: a non-blocking socket as `fd_out` whose send buffer is
    /// full. The driver then waits for it to be writable and splices again, so a slow
    /// reader delays the transfer instead of failing it with bytes stranded in the pipe.
    out_socket: Option<RawFd>,
}

// SAFETY: no pointer in the SQE.
unsafe impl Operation for SpliceOp {
    fn prepare(&mut self) -> squeue::Entry {
        opcode::Splice::new(
            types::Fd(self.fd_in),
            self.off_in,
            types::Fd(self.fd_out),
            -1,
            self.len,
        )
        .flags(libc::SPLICE_F_MOVE)
        .build()
    }

    fn attempt(&mut self) -> io::Result<usize> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "splice is io_uring-only here",
        ))
    }

    fn readiness(&self) -> Option<(RawFd, Interest)> {
        self.out_socket.map(|fd| (fd, Interest::Writable))
    }
}

struct SendfileOp {
    sock: RawFd,
    file: RawFd,
    offset: i64,
    len: usize,
}

// SAFETY: never prepared as an SQE on io_uring (send_to uses splice there); the PollAdd-free
// NOP below carries no pointer.
unsafe impl Operation for SendfileOp {
    fn prepare(&mut self) -> squeue::Entry {
        opcode::Nop::new().build()
    }

    fn attempt(&mut self) -> io::Result<usize> {
        let mut off = self.offset;
        // SAFETY: off is a live i64; descriptors are the caller's.
        cvt(unsafe { libc::sendfile(self.sock, self.file, &mut off, self.len) }).map(|n| n as usize)
    }

    fn readiness(&self) -> Option<(RawFd, Interest)> {
        Some((self.sock, Interest::Writable))
    }
}

/// An open file.
#[derive(Debug)]
pub struct File {
    fd: OwnedFd,
}

impl File {
    /// Opens read-only.
    pub async fn open(path: impl AsRef<Path>) -> io::Result<File> {
        OpenOptions::new().read(true).open(path).await
    }

    /// Creates (or truncates) for writing.
    pub async fn create(path: impl AsRef<Path>) -> io::Result<File> {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .await
    }

    pub fn options() -> OpenOptions {
        OpenOptions::new()
    }

    pub fn from_std(f: std::fs::File) -> File {
        File { fd: f.into() }
    }

    /// Reads into `buf[..buf.len()]` from `offset`; returns the count (0 at end of file).
    pub async fn read_at<B: IoBufMut>(&self, buf: B, offset: u64) -> (io::Result<usize>, B) {
        self.read_at_inner(buf, offset, None).await
    }

    /// [`read_at`](File::read_at) that ends with a [`crate::Cancelled`] error when `cancel`
    /// is signalled (on io_uring; on epoll the read runs at once).
    pub async fn read_at_or_cancel<B: IoBufMut>(
        &self,
        buf: B,
        offset: u64,
        cancel: &Cond,
    ) -> (io::Result<usize>, B) {
        self.read_at_inner(buf, offset, Some(cancel)).await
    }

    async fn read_at_inner<B: IoBufMut>(
        &self,
        buf: B,
        offset: u64,
        cancel: Option<&Cond>,
    ) -> (io::Result<usize>, B) {
        let fd = self.fd.as_raw_fd();
        let (r, op) = submit_inner(ReadAtOp { fd, buf, offset }, cancel).await;
        (r, op.buf)
    }

    /// Writes `buf` at `offset`; returns the count written.
    pub async fn write_at<B: IoBuf>(&self, buf: B, offset: u64) -> (io::Result<usize>, B) {
        let fd = self.fd.as_raw_fd();
        let (r, op) = submit_inner(WriteAtOp { fd, buf, offset }, None).await;
        (r, op.buf)
    }

    /// Writes all of `buf` at `offset`.
    pub async fn write_all_at<B: IoBuf>(&self, buf: B, offset: u64) -> (io::Result<()>, B) {
        let total = buf.len();
        let mut buf = buf;
        let mut done = 0usize;
        // Partial writes to regular files are rare; finish them with a copy of the tail.
        let (r, b) = self.write_at(buf, offset).await;
        buf = b;
        match r {
            Ok(n) => done += n,
            Err(e) => return (Err(e), buf),
        }
        while done < total {
            // SAFETY: done < total == buf.len(), so the slice is inside the buffer.
            let tail =
                unsafe { std::slice::from_raw_parts(buf.stable_ptr().add(done), total - done) }
                    .to_vec();
            let (r, _) = self.write_at(tail, offset + done as u64).await;
            match r {
                Ok(0) => return (Err(io::ErrorKind::WriteZero.into()), buf),
                Ok(n) => done += n,
                Err(e) => return (Err(e), buf),
            }
        }
        (Ok(()), buf)
    }

    /// Flushes data and metadata to stable storage.
    pub async fn fsync(&self) -> io::Result<()> {
        self.sync(false).await
    }

    /// Flushes data (and the metadata needed to read it back).
    pub async fn fdatasync(&self) -> io::Result<()> {
        self.sync(true).await
    }

    async fn sync(&self, data_only: bool) -> io::Result<()> {
        let fd = self.fd.as_raw_fd();
        submit_inner(FsyncOp { fd, data_only }, None)
            .await
            .0
            .map(|_| ())
    }

    /// fstat(2) of the open file (synchronous: it never waits on the device).
    pub fn metadata(&self) -> io::Result<std::fs::Metadata> {
        let f = std::mem::ManuallyDrop::new(
            // SAFETY: a temporary std File over our descriptor, never dropped (ManuallyDrop)
            // so the descriptor is not closed twice.
            unsafe { std::fs::File::from_raw_fd(self.fd.as_raw_fd()) },
        );
        f.metadata()
    }

    /// Sets the file length (ftruncate, synchronous).
    pub fn set_len(&self, len: u64) -> io::Result<()> {
        let f = std::mem::ManuallyDrop::new(
            // SAFETY: as in metadata().
            unsafe { std::fs::File::from_raw_fd(self.fd.as_raw_fd()) },
        );
        f.set_len(len)
    }

    /// Sends `len` bytes of the file from `offset` to `stream` without copying them through
    /// user space: splice file -> pipe -> socket on io_uring, sendfile(2) on epoll; falls
    /// back to read+write where the file system supports neither. Returns the bytes sent
    /// (fewer than `len` only at end of file).
    pub async fn send_to(&self, stream: &TcpStream, offset: u64, len: usize) -> io::Result<usize> {
        let uring = crate::driver::current_driver() == crate::Driver::Uring;
        let r = if uring {
            self.splice_to(stream, offset, len).await
        } else {
            self.sendfile_to(stream, offset, len).await
        };
        match r {
            Err((0, e)) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) => {
                self.copy_to(stream, offset, len).await
            }
            Err((_, e)) => Err(e),
            Ok(n) => Ok(n),
        }
    }

    async fn sendfile_to(
        &self,
        stream: &TcpStream,
        offset: u64,
        len: usize,
    ) -> Result<usize, (usize, io::Error)> {
        let mut sent = 0usize;
        while sent < len {
            let op = SendfileOp {
                sock: stream.as_raw_fd(),
                file: self.fd.as_raw_fd(),
                offset: (offset + sent as u64) as i64,
                len: len - sent,
            };
            match submit_inner(op, None).await.0 {
                Ok(0) => break,
                Ok(n) => sent += n,
                Err(e) => return Err((sent, e)),
            }
        }
        Ok(sent)
    }

    async fn splice_to(
        &self,
        stream: &TcpStream,
        offset: u64,
        len: usize,
    ) -> Result<usize, (usize, io::Error)> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: fds is a valid array of two ints.
        if let Err(e) = cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }) {
            return Err((0, e));
        }
        // SAFETY: fresh descriptors we own.
        let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        const CHUNK: usize = 64 * 1024; // the default pipe capacity
        let mut sent = 0usize;
        while sent < len {
            let want = (len - sent).min(CHUNK) as u32;
            let op = SpliceOp {
                fd_in: self.fd.as_raw_fd(),
                off_in: (offset + sent as u64) as i64,
                fd_out: wr.as_raw_fd(),
                len: want,
                out_socket: None,
            };
            let n = match submit_inner(op, None).await.0 {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => return Err((sent, e)),
            };
            let mut left = n;
            while left > 0 {
                let op = SpliceOp {
                    fd_in: rd.as_raw_fd(),
                    off_in: -1,
                    fd_out: stream.as_raw_fd(),
                    len: left as u32,
                    out_socket: Some(stream.as_raw_fd()),
                };
                match submit_inner(op, None).await.0 {
                    Ok(0) => return Err((sent + 1, io::ErrorKind::WriteZero.into())),
                    Ok(m) => left -= m,
                    Err(e) => return Err((sent + 1, e)),
                }
            }
            sent += n;
        }
        Ok(sent)
    }

    async fn copy_to(&self, stream: &TcpStream, offset: u64, len: usize) -> io::Result<usize> {
        let mut sent = 0usize;
        let mut buf = vec![0u8; len.clamp(1, 64 * 1024)];
        while sent < len {
            let want = (len - sent).min(buf.capacity());
            buf.resize(want, 0);
            let (r, b) = self.read_at(buf, offset + sent as u64).await;
            buf = b;
            let n = r?;
            if n == 0 {
                break;
            }
            buf.truncate(n);
            let (r, b) = stream.write_all(buf).await;
            buf = b;
            r?;
            sent += n;
        }
        Ok(sent)
    }

    /// Closes through the driver (IORING_OP_CLOSE); dropping closes synchronously.
    pub async fn close(self) -> io::Result<()> {
        let fd = self.fd.into_raw_fd();
        submit_inner(CloseOp { fd }, None).await.0.map(|_| ())
    }
}

impl AsRawFd for File {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for File {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
