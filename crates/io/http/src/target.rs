//! Request targets: from what the client sent to the normalised path the site looks up.

use crate::site::Lookup;

/// What `target` names: its normalised path (left in `key`) looked up with `find`, the
/// query carried over to a redirect's `Location`; a target that cannot be normalised is
/// answered with the status [`normalise_target`] gives it.
pub(crate) fn lookup(
    target: &[u8],
    key: &mut Vec<u8>,
    find: impl FnOnce(&[u8]) -> Lookup,
) -> Lookup {
    let query = match normalise_target(target, key) {
        Ok(query) => query,
        Err(status) => return Lookup::Status(status),
    };
    match find(key) {
        Lookup::Redirect(mut location) => {
            if let Some(q) = query {
                location.push(b'?');
                location.extend_from_slice(q);
            }
            Lookup::Redirect(location)
        }
        other => other,
    }
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Turns a request target into the cache key: `/` followed by the percent-decoded segments
/// joined by `/`, plus a trailing `/` when the path ends with one. Returns the query string.
///
/// 400 for a target that is not origin-form or absolute-form, or for an invalid escape; 404
/// for anything that would step outside the root or cannot be a file name: a `..` segment
/// (raw or encoded), an encoded `/`, a NUL byte.
pub(crate) fn normalise_target<'a>(
    target: &'a [u8],
    key: &mut Vec<u8>,
) -> Result<Option<&'a [u8]>, u16> {
    let path_and_query = if target.first() == Some(&b'/') {
        target
    } else {
        // absolute-form (RFC 9112 §3.2.2): drop scheme and authority.
        let lower_starts =
            |p: &[u8]| target.len() >= p.len() && target[..p.len()].eq_ignore_ascii_case(p);
        let after = if lower_starts(b"http://") {
            &target[7..]
        } else if lower_starts(b"https://") {
            &target[8..]
        } else {
            return Err(400);
        };
        match after.iter().position(|&b| matches!(b, b'/' | b'?' | b'#')) {
            Some(i) if after[i] == b'/' => &after[i..],
            Some(i) => &after[i..], // "http://host?q": empty path, treated as "/"
            None => b"/",
        }
    };
    let (path, query) = match path_and_query.iter().position(|&b| b == b'?' || b == b'#') {
        Some(i) if path_and_query[i] == b'?' => {
            let q = &path_and_query[i + 1..];
            let q = match q.iter().position(|&b| b == b'#') {
                Some(j) => &q[..j],
                None => q,
            };
            (&path_and_query[..i], Some(q))
        }
        Some(i) => (&path_and_query[..i], None),
        None => (path_and_query, None),
    };
    key.clear();
    key.push(b'/');
    for raw in path.split(|&b| b == b'/') {
        if raw.is_empty() {
            continue;
        }
        let start = key.len();
        let mut i = 0;
        while i < raw.len() {
            let b = raw[i];
            if b == b'%' {
                let hi = raw.get(i + 1).copied().and_then(hex_value).ok_or(400u16)?;
                let lo = raw.get(i + 2).copied().and_then(hex_value).ok_or(400u16)?;
                key.push(hi << 4 | lo);
                i += 3;
            } else {
                key.push(b);
                i += 1;
            }
        }
        let seg = &key[start..];
        if seg.contains(&b'/') || seg.contains(&0) || seg == b".." {
            return Err(404);
        }
        if seg == b"." {
            key.truncate(start);
            continue;
        }
        key.push(b'/');
    }
    let trailing = path.ends_with(b"/") || path.is_empty();
    if !trailing && key.len() > 1 {
        key.pop();
    }
    Ok(query)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(target: &str) -> Result<String, u16> {
        let mut key = Vec::new();
        normalise_target(target.as_bytes(), &mut key)?;
        Ok(String::from_utf8_lossy(&key).into_owned())
    }

    #[test]
    fn targets_normalise() {
        assert_eq!(key_of("/").unwrap(), "/");
        assert_eq!(key_of("/a/b.txt").unwrap(), "/a/b.txt");
        assert_eq!(key_of("/a/").unwrap(), "/a/");
        assert_eq!(key_of("//a//b").unwrap(), "/a/b");
        assert_eq!(key_of("/./a/./b").unwrap(), "/a/b");
        assert_eq!(key_of("/a/.").unwrap(), "/a");
        assert_eq!(key_of("/a%20b?x=1#f").unwrap(), "/a b");
        assert_eq!(key_of("/a?x/../..").unwrap(), "/a");
        assert_eq!(key_of("http://host/x/y?q").unwrap(), "/x/y");
        assert_eq!(key_of("HTTP://host").unwrap(), "/");
        assert_eq!(key_of("http://host?q").unwrap(), "/");
        assert_eq!(key_of("/%41%62").unwrap(), "/Ab");
    }

    #[test]
    fn targets_refused() {
        for t in [
            "/../x",
            "/a/../../x",
            "/%2e%2e/x",
            "/%2E%2E/x",
            "/.%2e/x",
            "/a%2Fb",
            "/a%2fb",
            "/%2E%2E%2Fetc%2Fpasswd",
            "/a%00b",
            "/..",
            "http://h/../x",
        ] {
            assert_eq!(key_of(t), Err(404), "{t}");
        }
        for t in ["*", "a/b", "", "/%", "/%4", "/%zz", "/%4g", "ftp://x/y"] {
            assert_eq!(key_of(t), Err(400), "{t}");
        }
    }
}
