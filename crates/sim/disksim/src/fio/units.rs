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

/// Longest runtime, ms (30 days).
pub const MAX_RUNTIME_MS: f64 = 30.0 * 86_400_000.0;

/// A time in ms; `default_unit_ms` is what a bare number counts (1000 for seconds).
pub fn parse_time_ms(s: &str, default_unit_ms: f64) -> std::result::Result<f64, String> {
    let t = s.trim();
    let end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if end == 0 {
        return Err(format!("'{t}' is not a time"));
    }
    let n: u64 = t[..end]
        .parse()
        .map_err(|_| format!("'{t}' is not a time"))?;
    let unit = match t[end..].to_ascii_lowercase().as_str() {
        "" => default_unit_ms,
        "us" | "usec" => 0.001,
        "ms" | "msec" => 1.0,
        "s" | "sec" => 1000.0,
        "m" | "min" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        u => {
            return Err(format!(
                "'{t}': unknown time unit '{u}' (us, ms, s, m, h, d)"
            ))
        }
    };
    let ms = n as f64 * unit;
    if ms > MAX_RUNTIME_MS {
        return Err(format!("'{t}' is longer than 30 days"));
    }
    Ok(ms)
}
