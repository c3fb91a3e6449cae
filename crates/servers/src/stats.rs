//! Live counters of a server (written by the model, read by `iolab stats` and the lab).
//! (Being written: shared-memory file given by `--stats PATH`.)

#[derive(Default)]
pub struct Stats {}
