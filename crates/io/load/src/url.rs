//! `http://host[:port][/path]` with an IPv4 literal, a bracketed IPv6 literal or `localhost`
//! (no DNS: the generator measures servers, not resolvers).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// A parsed target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub addr: SocketAddr,
    /// The Host header: the authority as written in the URL.
    pub host: String,
    /// Path and query, starting with '/'.
    pub path: String,
}

/// Parse a URL; the error says what is wrong and what is accepted.
pub fn parse_url(url: &str) -> anyhow::Result<Target> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        if url.starts_with("https://") {
            anyhow::anyhow!("{url:?}: https is not supported (plain http:// only)")
        } else {
            anyhow::anyhow!("{url:?}: expected a URL like http://127.0.0.1:8080/path")
        }
    })?;
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_string()),
        Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
        None => (rest, "/".to_string()),
    };
    let path = path.split('#').next().unwrap_or("/").to_string();
    if authority.is_empty() {
        anyhow::bail!("{url:?}: no host");
    }
    if authority.contains('@') {
        anyhow::bail!("{url:?}: user info in the URL is not supported");
    }
    if path
        .bytes()
        .any(|b| b.is_ascii_control() || b == b' ' || b >= 0x80)
    {
        anyhow::bail!(
            "{url:?}: the path must be percent-encoded (no spaces or control characters)"
        );
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let end = v6
            .find(']')
            .ok_or_else(|| anyhow::anyhow!("{url:?}: unclosed '[' in an IPv6 address"))?;
        let port = match &v6[end + 1..] {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or_else(|| {
                anyhow::anyhow!("{url:?}: expected ':port' after the IPv6 address")
            })?),
        };
        (&v6[..end], port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port: u16 = match port {
        None => 80,
        Some(p) => p
            .parse()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| anyhow::anyhow!("{url:?}: bad port {p:?} (1-65535)"))?,
    };
    let ip: IpAddr = if host.eq_ignore_ascii_case("localhost") {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        host.parse().map_err(|_| {
            anyhow::anyhow!(
                "{url:?}: host {host:?} is not an IP address (use an IPv4 literal, [IPv6] or localhost)"
            )
        })?
    };
    Ok(Target {
        addr: SocketAddr::new(ip, port),
        host: authority.to_string(),
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_forms() {
        let t = parse_url("http://127.0.0.1:8080/small.html").unwrap();
        assert_eq!(t.addr, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(t.host, "127.0.0.1:8080");
        assert_eq!(t.path, "/small.html");

        let t = parse_url("http://localhost").unwrap();
        assert_eq!(t.addr, "127.0.0.1:80".parse().unwrap());
        assert_eq!(t.path, "/");

        let t = parse_url("http://[::1]:9000/a?b=c#frag").unwrap();
        assert_eq!(t.addr, "[::1]:9000".parse().unwrap());
        assert_eq!(t.host, "[::1]:9000");
        assert_eq!(t.path, "/a?b=c");

        let t = parse_url("http://10.0.0.1?x").unwrap();
        assert_eq!(t.path, "/?x");
        assert_eq!(parse_url("http://[::1]").unwrap().addr.port(), 80);
    }

    #[test]
    fn rejected_forms() {
        for bad in [
            "127.0.0.1:80/",
            "https://127.0.0.1/",
            "http://",
            "http://example.com/",
            "http://127.0.0.1:0/",
            "http://127.0.0.1:99999/",
            "http://127.0.0.1:x/",
            "http://[::1/",
            "http://[::1]x/",
            "http://u@127.0.0.1/",
            "http://127.0.0.1/a b",
        ] {
            let e = parse_url(bad);
            assert!(e.is_err(), "{bad} accepted: {e:?}");
        }
    }
}
