//! fio options that fio 3.33 defines and that change nothing the simulated host and device
//! do: accepted, each for the reason beside it. The simulated device neither compresses nor
//! deduplicates, so what the data is costs nothing; it never fails an I/O, so error handling
//! never runs; the host model has one calibrated CPU time per I/O for every engine, so the
//! io_uring submission options (which change that CPU time on a real machine) change nothing
//! here. `docs/results/disksim-fio-examples.md` notes where an example's figures depend on one.

/// (option, why it has no effect in the simulation).
pub(crate) const INERT: &[(&str, &str)] = &[
    // What the buffers hold: fio fills them (dedupe, compressibility, a pattern); the
    // device model does not look at the data.
    (
        "dedupe_percentage",
        "data content: the device does not deduplicate",
    ),
    (
        "dedupe_mode",
        "data content: the device does not deduplicate",
    ),
    ("dedupe_working_set_percentage", "data content"),
    ("dedupe_global", "data content"),
    (
        "buffer_compress_percentage",
        "data content: the device does not compress",
    ),
    ("buffer_compress_chunk", "data content"),
    ("buffer_pattern", "data content"),
    ("scramble_buffers", "data content"),
    ("refill_buffers", "data content (fio's CPU time to refill)"),
    ("zero_buffers", "data content"),
    // How verify checks the data it reads back (the read-back's I/O is `verify`'s).
    ("verify_pattern", "data content checked on read-back"),
    (
        "verify_interval",
        "the checksum's granularity within a block: data content",
    ),
    (
        "verify_offset",
        "where the checksum header sits in a block: data content",
    ),
    (
        "verify_dump",
        "what fio writes on a verify failure: data never mismatches here",
    ),
    (
        "verify_fatal",
        "stops on a verify failure: data never mismatches here",
    ),
    ("verify_async", "checksums on other threads: CPU, not I/O"),
    (
        "verify_async_cpus",
        "CPU placement of verify_async's threads",
    ),
    // Errors: the simulated device never fails an I/O.
    (
        "continue_on_error",
        "error handling: no simulated I/O fails",
    ),
    ("ignore_error", "error handling: no simulated I/O fails"),
    ("error_dump", "error reporting: no simulated I/O fails"),
    // io_uring's submission and completion options: the CPU time per I/O is the host
    // model's one calibrated figure for every engine.
    (
        "sqthread_poll",
        "io_uring submission CPU time: one per-I/O cost for every engine",
    ),
    (
        "sqthread_poll_cpu",
        "CPU placement of sqthread_poll's kernel thread",
    ),
    ("registerfiles", "io_uring submission CPU time"),
    ("fixedbufs", "io_uring submission CPU time"),
    ("nonvectored", "io_uring submission CPU time"),
    ("force_async", "io_uring submission CPU time"),
    (
        "hipri",
        "polled completion: CPU time; the device's service is the same",
    ),
    // Files: the simulator lays every file out before the run, contiguously.
    (
        "create_on_open",
        "when the file is created: files are laid out before the run",
    ),
    (
        "fallocate",
        "how a new file is allocated: files are laid out contiguously before the run",
    ),
];

/// The inert options' names.
pub(crate) fn names() -> impl Iterator<Item = &'static str> {
    INERT.iter().map(|(k, _)| *k)
}
