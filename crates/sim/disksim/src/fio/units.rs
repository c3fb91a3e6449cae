//! fio's size syntax, shared by the job reader and the options of [`super::extra`].

/// Largest size accepted anywhere (1 PiB): beyond it is a typo, not a workload.
pub const MAX_BYTES: u64 = 1 << 50;

/// A size in fio's syntax (kb_base=1024): `4k` = 4096, `4KiB` = 4000 (fio's compatibility
/// mode), `0x1000`, `1m`, `2g`...
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    use iolab_sys::units::{parse_fio_size, UnitError};
    let v = parse_fio_size(s).map_err(|e| match e {
        UnitError::UnknownUnit { .. } => format!("{e} (k, m, g, t, p)"),
        e => e.to_string(),
    })?;
    if v > MAX_BYTES {
        return Err(format!("'{}' is larger than the limit of 1 PiB", s.trim()));
    }
    Ok(v)
}
