//! Page arithmetic, shared by the frame state machine and the registry (and by the fuzz
//! target, which includes this file and frames.rs without the rest of the library).

pub const PAGE: usize = 4096;

pub fn round_up(x: usize) -> usize {
    (x + PAGE - 1) & !(PAGE - 1)
}

pub fn round_down(x: usize) -> usize {
    x & !(PAGE - 1)
}
