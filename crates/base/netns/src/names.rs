//! The naming scheme: every name says who made it, so cleanup never touches anything else.
//!
//! - namespace: `iolab-<tag>-<pid>-<n>` (decimal pid and counter; namespace names have no
//!   practical length limit), e.g. `iolab-lab-48211-0`;
//! - veth end: `io<tag>-<pid36>-<n36><side>` with the pid and the counter in base 36 and
//!   `side` `a` or `b`, e.g. `iolab-93z-1a` for pid 11807. With a tag of at most 3 characters, a pid up to
//!   the kernel's maximum 4,194,304 (`2heo0`, 5 digits) and a counter below 1,296 (2 digits)
//!   this is at most 15 characters, the kernel's IFNAMSIZ - 1.
//!
//! `tag` names the part of iolab (1 to 3 of `a-z0-9`); `pid` is the owning process; `n` is a
//! process-wide counter, so one process can own many namespaces and veths.

use anyhow::bail;

/// Largest counter value a veth name can carry (two base-36 digits).
pub const MAX_COUNTER: u32 = 36 * 36 - 1;

/// Checks a tag: 1 to 3 characters of `a-z0-9`.
pub fn check_tag(tag: &str) -> anyhow::Result<()> {
    if tag.is_empty()
        || tag.len() > 3
        || !tag
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        bail!("netns tag {tag:?}: give 1 to 3 characters of a-z0-9 (veth names must fit in 15 characters)");
    }
    Ok(())
}

pub fn namespace(tag: &str, pid: u32, n: u32) -> String {
    format!("iolab-{tag}-{pid}-{n}")
}

pub fn veth(tag: &str, pid: u32, n: u32, side: char) -> String {
    format!("io{tag}-{}-{}{side}", base36(pid), base36(n))
}

/// The owner pid of one of our namespaces with this tag, or None if the name is not ours.
pub fn namespace_owner(tag: &str, name: &str) -> Option<u32> {
    let rest = name
        .strip_prefix("iolab-")?
        .strip_prefix(tag)?
        .strip_prefix('-')?;
    let (pid, n) = rest.split_once('-')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// The owner pid of one of our veth ends with this tag, or None if the name is not ours.
pub fn veth_owner(tag: &str, name: &str) -> Option<u32> {
    let rest = name
        .strip_prefix("io")?
        .strip_prefix(tag)?
        .strip_prefix('-')?;
    let (pid, n_side) = rest.split_once('-')?;
    let n = n_side
        .strip_suffix('a')
        .or_else(|| n_side.strip_suffix('b'))?;
    from_base36(n)?;
    from_base36(pid)
}

fn base36(mut v: u32) -> String {
    const D: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(D[(v % 36) as usize]);
        v /= 36;
        if v == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("ascii digits")
}

fn from_base36(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 6 {
        return None;
    }
    let mut v: u32 = 0;
    for b in s.bytes() {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'z' => b - b'a' + 10,
            _ => return None,
        };
        v = v.checked_mul(36)?.checked_add(d as u32)?;
    }
    Some(v)
}

/// True if `pid` names a process that exists (a zombie counts: its parent may still act).
pub fn pid_alive(pid: u32) -> bool {
    iolab_sys::process::exists(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_fit() {
        for &pid in &[1u32, 48211, 4_194_304] {
            for &n in &[0u32, 7, 35, MAX_COUNTER] {
                let v = veth("lab", pid, n, 'b');
                assert!(v.len() <= 15, "{v} is longer than IFNAMSIZ-1");
                assert_eq!(veth_owner("lab", &v), Some(pid));
                let ns = namespace("lab", pid, n);
                assert_eq!(namespace_owner("lab", &ns), Some(pid));
            }
        }
        assert_eq!(veth("lab", 11807, 1, 'a'), "iolab-93z-1a");
    }

    #[test]
    fn foreign_names_are_not_ours() {
        for name in [
            "eth0",
            "lo",
            "iolab-lab-12-3",
            "iolabx-1-2a",
            "iolab-12-3c",
            "iolab-12-a",
            "iotie-12-3a",
        ] {
            assert_eq!(veth_owner("lab", name), None, "{name}");
        }
        for name in [
            "iolab-tie-12-3",
            "iolab-lab-12",
            "iolab-lab-x-3",
            "iolab-lab-12-",
            "iolab-labx-12-3",
            "netns0",
        ] {
            assert_eq!(namespace_owner("lab", name), None, "{name}");
        }
    }

    #[test]
    fn tags_are_checked() {
        assert!(check_tag("lab").is_ok());
        assert!(check_tag("t1").is_ok());
        for bad in ["", "link", "Lab", "a-b", "a b"] {
            assert!(check_tag(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn liveness() {
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(0));
        assert!(!pid_alive(u32::MAX));
    }
}
