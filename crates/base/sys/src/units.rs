//! Sizes and durations as people write them on a command line or in a job file: `256K`,
//! `4m`, `0x1000`; `10s`, `500ms`, `2m`, `1.5h`.
//!
//! The parsers accept every form the project's copies accepted; a caller with a narrower
//! rule (a range, a required unit) checks it on the result, and a caller with its own
//! wording maps the [`UnitError`] to its message.

use std::fmt;
use std::time::Duration;

/// Why a size or a duration was refused; `input` is the text as given (trimmed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnitError {
    /// No number where one was expected (`abc`, `k`, `1.2.3s`).
    NotANumber { input: String },
    /// A number with a unit this parser does not know (`4q`, `10parsecs`).
    UnknownUnit { input: String, unit: String },
    /// The value does not fit (a size over u64, a duration over `Duration`, negative or NaN).
    OutOfRange { input: String },
}

impl fmt::Display for UnitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnitError::NotANumber { input } => write!(f, "'{input}' is not a number"),
            UnitError::UnknownUnit { input, unit } => write!(f, "'{input}': unknown unit '{unit}'"),
            UnitError::OutOfRange { input } => write!(f, "'{input}' is too large"),
        }
    }
}

impl std::error::Error for UnitError {}

/// A size in bytes: a decimal or `0x` hexadecimal number, then an optional unit: `b`, or
/// `k`, `m`, `g`, `t`, `p` (any case) alone or followed by `b`, `i` or `ib`, all powers of
/// 1024. `16384`, `256K`, `4M`, `1g`, `4KiB` (4096), `0x1000`.
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    size(s, 1024)
}

/// A size as fio reads one with its default `kb_base=1024`: as [`parse_size`], except that
/// the IEC forms mean powers of 1000 (`4KiB` = 4000: fio's compatibility mode, kept so a job
/// file means what it means to fio).
pub fn parse_fio_size(s: &str) -> Result<u64, UnitError> {
    size(s, 1000)
}

fn size(s: &str, iec_base: u64) -> Result<u64, UnitError> {
    let t = s.trim();
    let not_a_number = || UnitError::NotANumber { input: t.into() };
    let (digits, suffix, radix) = match t.strip_prefix("0x").or(t.strip_prefix("0X")) {
        Some(h) => (h, "", 16),
        None => {
            let end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
            (&t[..end], &t[end..], 10)
        }
    };
    if digits.is_empty() {
        return Err(not_a_number());
    }
    let n = u64::from_str_radix(digits, radix).map_err(|_| not_a_number())?;
    let unknown = || UnitError::UnknownUnit {
        input: t.into(),
        unit: suffix.into(),
    };
    let lower = suffix.to_ascii_lowercase();
    let (exp, base) = match lower.as_str() {
        "" | "b" => (0, 1024),
        _ => {
            let exp = match lower.as_bytes()[0] {
                b'k' => 1,
                b'm' => 2,
                b'g' => 3,
                b't' => 4,
                b'p' => 5,
                _ => return Err(unknown()),
            };
            match &lower[1..] {
                "" | "b" | "i" => (exp, 1024),
                "ib" => (exp, iec_base),
                _ => return Err(unknown()),
            }
        }
    };
    base.checked_pow(exp)
        .and_then(|mult| n.checked_mul(mult))
        .ok_or_else(|| UnitError::OutOfRange { input: t.into() })
}

/// Splits `1.5ms` into its number and its unit, lower-cased and trimmed (`(1.5, "ms")`);
/// `None` when it does not start with a number. The unit may be empty.
pub fn split_number_unit(s: &str) -> Option<(f64, String)> {
    let t = s.trim();
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(end);
    Some((num.parse().ok()?, unit.trim().to_lowercase()))
}

/// The seconds one `unit` stands for: `s` (or none), `ms`, `us`/`µs`, `m`/`min`, `h`.
pub fn duration_unit_secs(unit: &str) -> Option<f64> {
    Some(match unit {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return None,
    })
}

/// A duration: a number (fractions allowed) and a unit of [`duration_unit_secs`]; a bare
/// number is seconds. `10s`, `500ms`, `250us`, `1.5ms`, `2m`, `1h`, `30`. Zero is allowed
/// (a caller that needs a positive duration checks it).
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let t = s.trim();
    let (v, unit) =
        split_number_unit(t).ok_or_else(|| UnitError::NotANumber { input: t.into() })?;
    let per = duration_unit_secs(&unit).ok_or_else(|| UnitError::UnknownUnit {
        input: t.into(),
        unit: unit.clone(),
    })?;
    Duration::try_from_secs_f64(v * per).map_err(|_| UnitError::OutOfRange { input: t.into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_every_accepted_form() {
        for (s, want) in [
            ("16384", 16384),
            ("256K", 256 << 10),
            ("256k", 256 << 10),
            ("4M", 4 << 20),
            ("1G", 1 << 30),
            ("2t", 2 << 40),
            ("1p", 1 << 50),
            ("4kb", 4096),
            ("4KiB", 4096),
            ("4ki", 4096),
            ("10b", 10),
            ("0x1000", 4096),
            ("0X10", 16),
            (" 8k ", 8192),
        ] {
            assert_eq!(parse_size(s), Ok(want), "{s}");
        }
        assert_eq!(parse_fio_size("4KiB"), Ok(4000));
        assert_eq!(parse_fio_size("1MiB"), Ok(1_000_000));
        assert_eq!(parse_fio_size("4k"), Ok(4096));
    }

    #[test]
    fn sizes_refused_with_their_reason() {
        let nan = |s: &str| UnitError::NotANumber { input: s.into() };
        assert_eq!(parse_size("k"), Err(nan("k")));
        assert_eq!(parse_size(""), Err(nan("")));
        assert_eq!(parse_size("0xzz"), Err(nan("0xzz")));
        assert_eq!(parse_size("-4k"), Err(nan("-4k")));
        let e = parse_size("4q").unwrap_err();
        assert_eq!(e.to_string(), "'4q': unknown unit 'q'");
        assert!(matches!(
            parse_size("4kx"),
            Err(UnitError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_size("1.5M"),
            Err(UnitError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_size("16384p"),
            Err(UnitError::OutOfRange { .. })
        ));
        assert!(matches!(
            parse_size("99999999999999999999"),
            Err(UnitError::NotANumber { .. })
        ));
    }

    #[test]
    fn durations_in_every_accepted_form() {
        for (s, ms) in [
            ("10s", 10_000.0),
            ("500ms", 500.0),
            ("250us", 0.25),
            ("250µs", 0.25),
            ("1.5ms", 1.5),
            ("2m", 120_000.0),
            ("2min", 120_000.0),
            ("1h", 3_600_000.0),
            ("30", 30_000.0),
            ("10MS", 10.0),
            ("0s", 0.0),
        ] {
            let got = parse_duration(s).unwrap().as_secs_f64() * 1e3;
            assert!((got - ms).abs() < 1e-9, "{s}: {got} ms");
        }
        assert_eq!(split_number_unit(" 3 ms"), Some((3.0, "ms".into())));
        assert_eq!(split_number_unit("ms"), None);
    }

    #[test]
    fn durations_refused_with_their_reason() {
        assert!(matches!(
            parse_duration("fast"),
            Err(UnitError::NotANumber { .. })
        ));
        assert!(matches!(
            parse_duration("-1s"),
            Err(UnitError::NotANumber { .. })
        ));
        assert!(matches!(
            parse_duration("1.2.3s"),
            Err(UnitError::NotANumber { .. })
        ));
        let e = parse_duration("10parsecs").unwrap_err();
        assert_eq!(
            e,
            UnitError::UnknownUnit {
                input: "10parsecs".into(),
                unit: "parsecs".into()
            }
        );
        assert!(matches!(
            parse_duration("1e300h"),
            Err(UnitError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_duration(&format!("{}h", "9".repeat(30))),
            Err(UnitError::OutOfRange { .. })
        ));
    }
}
