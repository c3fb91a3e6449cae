//! Conditional and range requests on a regular file (RFC 9110 §13 and §14): which of 200,
//! 206, 304, 412 and 416 a file gets, and which of its bytes.

use std::sync::Arc;

use crate::reply::{Payload, Reply};
use crate::request::Conditions;
use crate::response::head;
use crate::site::{Body as FileBody, FileFields, FileRef};

/// The answer for a regular file (GET or HEAD): preconditions in the order of RFC 9110
/// §13.2.2, then the range. RFC 9110 defines ranges for GET only, but a HEAD gets the head
/// the GET would have (§9.3.2), a 206 included, as nginx does.
pub(crate) fn serve_file(file: FileRef, cond: &Conditions<'_>, keep_alive: bool) -> Reply {
    let fields = &file.fields;
    let mtime = fields.mtime;
    // 1, 2: If-Match, else If-Unmodified-Since.
    if let Some(v) = cond.if_match {
        if !etag_list_matches(v, &fields.etag, true) {
            return Reply::text(412, &[], keep_alive);
        }
    } else if let Some(since) = cond.if_unmodified_since.and_then(parse_date) {
        if mtime.is_none_or(|m| m > since) {
            return Reply::text(412, &[], keep_alive);
        }
    }
    // 3, 4: If-None-Match, else If-Modified-Since (an invalid date is ignored).
    let not_modified = match (cond.if_none_match, cond.if_modified_since) {
        (Some(v), _) => etag_list_matches(v, &fields.etag, false),
        (None, Some(d)) => match (parse_date(d), mtime) {
            (Some(since), Some(m)) => m <= since,
            _ => false,
        },
        (None, None) => false,
    };
    if not_modified {
        return Reply {
            status: 304,
            head: head(304, &[&fields.validators], None, keep_alive),
            payload: Payload::None,
        };
    }
    let len = file.len;
    let range = match cond.range {
        Some(r) if if_range_holds(cond.if_range, fields) => parse_range(r, len),
        _ => RangeSpec::Whole,
    };
    let body = |offset: u64, n: u64| match &file.body {
        FileBody::Memory(b) => Payload::Memory(b.slice(offset as usize..(offset + n) as usize)),
        FileBody::Disk(f) => Payload::Disk {
            file: f.clone(),
            offset,
            len: n,
            fill: None,
        },
        // A miss: cached only when read whole.
        FileBody::Load(load) => Payload::Disk {
            file: Arc::clone(&load.file),
            offset,
            len: n,
            fill: (offset == 0 && n == len).then(|| Arc::clone(load)),
        },
    };
    const ACCEPT_RANGES: &[u8] = b"Accept-Ranges: bytes\r\n";
    match range {
        RangeSpec::Whole => Reply {
            status: 200,
            head: head(
                200,
                &[&fields.content_type, &fields.validators, ACCEPT_RANGES],
                Some(len),
                keep_alive,
            ),
            payload: body(0, len),
        },
        RangeSpec::Part(first, last) => {
            let mut cr = Vec::with_capacity(64);
            cr.extend_from_slice(b"Content-Range: bytes ");
            crate::response::push_decimal(&mut cr, first);
            cr.push(b'-');
            crate::response::push_decimal(&mut cr, last);
            cr.push(b'/');
            crate::response::push_decimal(&mut cr, len);
            cr.extend_from_slice(b"\r\n");
            let n = last - first + 1;
            Reply {
                status: 206,
                head: head(
                    206,
                    &[&fields.content_type, &fields.validators, ACCEPT_RANGES, &cr],
                    Some(n),
                    keep_alive,
                ),
                payload: body(first, n),
            }
        }
        RangeSpec::Unsatisfiable => {
            let mut cr = Vec::with_capacity(48);
            cr.extend_from_slice(b"Content-Range: bytes */");
            crate::response::push_decimal(&mut cr, len);
            cr.extend_from_slice(b"\r\n");
            Reply::text(416, &[ACCEPT_RANGES, &cr], keep_alive)
        }
    }
}

/// What a `Range` header asks of a representation of `len` bytes.
#[derive(Debug, PartialEq, Eq)]
enum RangeSpec {
    /// No usable range: answer 200 with everything (another unit, or several ranges).
    Whole,
    /// One satisfiable range, first and last byte positions (inclusive, within the file).
    Part(u64, u64),
    /// 416.
    Unsatisfiable,
}

/// Parses a `Range` value (RFC 9110 §14.1.2) against a length. Several ranges are answered
/// whole (200), as RFC 9110 allows a server to; a syntactically invalid `bytes` range is a
/// 416, as nginx answers it; a unit other than `bytes` is ignored (200).
fn parse_range(value: &[u8], len: u64) -> RangeSpec {
    let Some(eq) = memchr::memchr(b'=', value) else {
        return RangeSpec::Unsatisfiable;
    };
    if !value[..eq].trim_ascii().eq_ignore_ascii_case(b"bytes") {
        return RangeSpec::Whole;
    }
    let set = &value[eq + 1..];
    let mut specs = set
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|s| !s.is_empty());
    let (Some(spec), rest) = (specs.next(), specs.next()) else {
        return RangeSpec::Unsatisfiable;
    };
    if rest.is_some() {
        return RangeSpec::Whole;
    }
    let Some(dash) = memchr::memchr(b'-', spec) else {
        return RangeSpec::Unsatisfiable;
    };
    let (a, b) = (spec[..dash].trim_ascii(), spec[dash + 1..].trim_ascii());
    let number = |d: &[u8]| -> Option<u64> {
        if d.is_empty() || d.len() > 19 || !d.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(d).ok()?.parse().ok()
    };
    if a.is_empty() {
        // Suffix: the last N bytes. RFC 9110 §14.1.1: on a zero-length representation a
        // suffix-range with a non-zero length is the one satisfiable form, yet no
        // Content-Range can name zero bytes, so the whole (empty) file is sent: 200, as nginx.
        return match number(b) {
            Some(n) if n > 0 && len > 0 => RangeSpec::Part(len - n.min(len), len - 1),
            Some(n) if n > 0 => RangeSpec::Whole,
            _ => RangeSpec::Unsatisfiable,
        };
    }
    let Some(first) = number(a) else {
        return RangeSpec::Unsatisfiable;
    };
    let last = if b.is_empty() {
        u64::MAX
    } else {
        match number(b) {
            Some(l) if l >= first => l,
            _ => return RangeSpec::Unsatisfiable,
        }
    };
    if first >= len {
        return RangeSpec::Unsatisfiable;
    }
    RangeSpec::Part(first, last.min(len - 1))
}

/// `If-Range` (RFC 9110 §13.1.5): the range applies only if the validator matches — an
/// entity tag compared strongly, or a date equal to `Last-Modified`. Absent: it applies.
fn if_range_holds(value: Option<&[u8]>, fields: &FileFields) -> bool {
    let Some(v) = value else {
        return true;
    };
    if v.starts_with(b"\"") || v.starts_with(b"W/") {
        return v == &fields.etag[..];
    }
    matches!((parse_date(v), fields.mtime), (Some(d), Some(m)) if d == m)
}

/// True when a comma-separated list of entity tags (or `*`) matches `etag`. Weak comparison
/// ignores a `W/` prefix; strong comparison never matches a weak tag.
fn etag_list_matches(list: &[u8], etag: &[u8], strong: bool) -> bool {
    if list.trim_ascii() == b"*" {
        return true;
    }
    list.split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .any(|tag| match tag.strip_prefix(b"W/") {
            Some(weak) => !strong && weak == etag,
            None => tag == etag,
        })
}

/// An HTTP-date (any of the three forms of RFC 9110 §5.6.7) in seconds since the epoch.
fn parse_date(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value).ok()?;
    let t = httpdate::parse_http_date(text.trim()).ok()?;
    t.duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}
