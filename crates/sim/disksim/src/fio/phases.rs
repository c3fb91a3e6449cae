//! The per-clone state of the options in [`super::extra`] that change when a clone issues:
//! fio's flow control (`flow.c`) and the verify phase (`backend.c`'s `do_verify`).

use crate::request::{FileRef, Op, Request};

/// One flow group (`flow_id`): the I/Os its clones issued and the weights of its clones still
/// running (fio's `fio_flow`: `flow_counter`, `total_weight`).
#[derive(Clone, Debug, Default)]
pub(super) struct FlowGroup {
    pub issued: u64,
    pub weight: u64,
}

impl FlowGroup {
    /// fio's `flow_threshold_exceeded`: a clone that has issued `mine` of the group's I/Os
    /// waits while its share is above its weight's share (0/0 is not above: fio's NaN).
    pub fn exceeded(&self, mine: u64, weight: u32) -> bool {
        if self.issued == 0 || self.weight == 0 {
            return false;
        }
        mine as f64 / self.issued as f64 > f64::from(weight) / self.weight as f64
    }
}

/// Where a clone is in fio's verify (`do_verify`): after its writes, once they have all
/// completed, an `fsync` and a cache drop per file, one after the other, then the writes'
/// blocks again as reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Verify {
    /// No verify, or the writes are still being issued.
    #[default]
    Off,
    /// The writes are issued; the read-back starts when the last completes.
    Pending,
    /// The calls before the read-back, the next one's index.
    Calls(usize),
    /// Reading back.
    Reading,
}

/// The calls fio makes before reading back (`fio_io_sync`, `file_invalidate_cache`): an
/// `fsync` of each file, then a `POSIX_FADV_DONTNEED` of each; `files` as (id, first sector).
pub(super) fn verify_calls(files: &[(u32, u64)]) -> Vec<Request> {
    let call = |(id, lba): (u32, u64), op: Op| Request {
        file: Some(FileRef {
            file: id,
            offset: 0,
        }),
        ..Request::block(lba, 0, op)
    };
    let mut v: Vec<Request> = files.iter().map(|&f| call(f, Op::Flush)).collect();
    v.extend(
        files
            .iter()
            .map(|&f| call(f, Op::Advise(crate::request::Advice::DontNeed))),
    );
    v
}
