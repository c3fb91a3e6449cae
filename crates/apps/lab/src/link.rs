//! `--link RATE [--delay D]` and `--seed-conditions`: the server behind a real, shaped link.
//!
//! The server runs in its own network namespace (`iolab-lab-<pid>-<n>`), joined to the
//! lab's (root) namespace by a veth pair. Both ends are shaped with tbf at the rate (a
//! full-duplex link: each direction gets the rate), plus netem for a one-way delay when
//! asked (so the round trip is twice the delay). The client end carries 8 addresses, so
//! the load generator keeps spreading its connections over several source addresses as it
//! does on loopback. Everything is made and removed through `iolab-netns`: at the end, on
//! Ctrl-C / SIGTERM (the lab's handler stops the servers, then removes the link), and at
//! the next start if a run was SIGKILLed (stale cleanup by owner pid).
//!
//! Before the matrix, a bulk transfer each way measures what the link really carries, and
//! the rate, delay, qdiscs as `tc` reads them back, backlog and the namespace's TCP limits
//! go into `results.json` ("link") and the report.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// The netns tag of the lab's namespaces and veths.
pub const TAG: &str = "lab";

/// Client source addresses on the client end.
pub const CLIENT_ADDRS: u8 = 8;

/// The seed's link: 100 Mb/s switched Ethernet.
pub const SEED_RATE_BPS: u64 = 100_000_000;
/// The seed's listen backlog (its servers asked for 200).
pub const SEED_BACKLOG: u32 = 200;
/// Quick profile budget under the seed's conditions: the matrix over a 100 Mb/s link,
/// inside the 15 minutes the issue allows, with room for setup and the report.
pub const SEED_QUICK_BUDGET_S: u64 = 780;

/// What to build.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkSpec {
    pub rate_bps: u64,
    /// One-way delay (netem on both ends).
    pub delay: Option<Duration>,
}

impl LinkSpec {
    pub fn shape(&self) -> iolab_netns::Shape {
        let mut s = iolab_netns::Shape::rate(self.rate_bps);
        s.delay = self.delay;
        s
    }
}

pub use crate::results::LinkInfo;

/// The link and everything it owns; removed on drop.
pub struct Link {
    // Fields drop in order: the guard that removes the namespace and veth goes last.
    pub ns: iolab_netns::Namespace,
    pub server_ip: IpAddr,
    pub client_ips: Vec<IpAddr>,
    pub info: LinkInfo,
    client_end: iolab_netns::Iface,
    server_end: iolab_netns::Iface,
    net: iolab_netns::Net,
}

const SYSCTLS: [&str; 5] = [
    "net.core.somaxconn",
    "net.ipv4.tcp_max_syn_backlog",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.tcp_abort_on_overflow",
    "net.ipv4.tcp_fin_timeout",
];

impl Link {
    /// Removes what a killed lab left behind, then builds the link.
    pub fn create(spec: &LinkSpec, backlog: u32) -> anyhow::Result<Link> {
        // The lab's own SIGINT/SIGTERM handler stops the servers first, then calls
        // iolab_netns::cleanup_all (see server::install_signal_handler).
        iolab_netns::external_signal_handling();
        iolab_netns::preflight().context("--link needs a network namespace")?;
        match iolab_netns::cleanup_stale(TAG) {
            Ok(v) if !v.is_empty() => tracing::info!(target: "progress",
                "iolab lab: removed {} stale namespace(s)/veth(s) of killed runs: {}",
                v.len(),
                v.join(", ")
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!("stale link cleanup failed: {e:#}"),
        }
        let mut net = iolab_netns::Net::new(TAG)?;
        let ns = net.namespace()?;
        let (client_end, server_end) = net.veth(None, Some(&ns))?;
        let [a, b, c] = iolab_netns::free_subnet()?;
        let server_ip = Ipv4Addr::new(a, b, c, 1);
        server_end.add_addr(&format!("{server_ip}/24"))?;
        let client_ips: Vec<Ipv4Addr> = (2..2 + CLIENT_ADDRS)
            .map(|d| Ipv4Addr::new(a, b, c, d))
            .collect();
        for ip in &client_ips {
            client_end.add_addr(&format!("{ip}/24"))?;
        }
        client_end.up()?;
        server_end.up()?;
        let shape = spec.shape();
        server_end.shape(&shape)?;
        client_end.shape(&shape)?;
        let info = LinkInfo {
            rate_bps: spec.rate_bps,
            delay_ms: spec.delay.map(|d| d.as_secs_f64() * 1e3).unwrap_or(0.0),
            namespace: ns.name().to_string(),
            server_addr: server_ip.to_string(),
            client_addrs: client_ips.iter().map(|i| i.to_string()).collect(),
            qdisc_server_end: server_end.qdisc_text()?,
            qdisc_client_end: client_end.qdisc_text()?,
            qdiscs: server_end
                .qdiscs()?
                .into_iter()
                .chain(client_end.qdiscs()?)
                .map(|q| q.json)
                .collect(),
            backlog,
            namespace_sysctls: namespace_sysctls(&ns),
            ..LinkInfo::default()
        };
        let link = Link {
            ns,
            server_ip: IpAddr::V4(server_ip),
            client_ips: client_ips.into_iter().map(IpAddr::V4).collect(),
            info,
            client_end,
            server_end,
            net,
        };
        link.check_shaped(spec)?;
        Ok(link)
    }

    /// Fails unless both ends carry a tbf at the asked rate (read back from tc).
    pub fn check_shaped(&self, spec: &LinkSpec) -> anyhow::Result<()> {
        for end in [&self.server_end, &self.client_end] {
            let q = end.qdiscs()?;
            if !q
                .iter()
                .any(|q| q.kind == "tbf" && q.rate_bps == Some(spec.rate_bps))
            {
                bail!(
                    "{}: no tbf at {} after shaping: {}",
                    end.name,
                    iolab_netns::format_rate(spec.rate_bps),
                    end.qdisc_text().unwrap_or_default()
                );
            }
        }
        Ok(())
    }

    /// Measures the link with a bulk transfer each way (about 2 s each at the rate).
    pub fn measure(&mut self) -> anyhow::Result<()> {
        let bytes = (self.info.rate_bps / 8 * 2).clamp(1 << 20, 250 << 20);
        let (down, up) = bulk_transfer(&self.ns, self.server_ip, self.client_ips[0], bytes)?;
        self.info.bulk_bytes = bytes;
        self.info.measured_down_bps = down;
        self.info.measured_up_bps = up;
        Ok(())
    }

    /// One line for the progress output.
    pub fn describe(&self) -> String {
        let i = &self.info;
        format!(
            "link {}{} between namespace {} (server {}) and {} client addresses ({}..{}); measured {} down, {} up; backlog {}",
            iolab_netns::format_rate(i.rate_bps),
            if i.delay_ms > 0.0 {
                format!(" + {} ms one way", i.delay_ms)
            } else {
                String::new()
            },
            i.namespace,
            i.server_addr,
            i.client_addrs.len(),
            i.client_addrs.first().map(String::as_str).unwrap_or("-"),
            i.client_addrs.last().map(String::as_str).unwrap_or("-"),
            mbit(i.measured_down_bps),
            mbit(i.measured_up_bps),
            i.backlog
        )
    }

    /// Removes the link now (drop does the same, silently).
    pub fn remove(self) -> anyhow::Result<()> {
        let Link { net, .. } = self;
        net.remove()
    }

    /// The namespace and veth names (for tests and messages).
    pub fn names(&self) -> Vec<String> {
        self.net.names()
    }
}

fn mbit(bps: f64) -> String {
    format!("{:.1} Mbit/s", bps / 1e6)
}

/// Reads the namespace's TCP limits (/proc/sys/net is per network namespace: `cat` run
/// inside it reads the namespace's own values).
fn namespace_sysctls(ns: &iolab_netns::Namespace) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for k in SYSCTLS {
        let path = format!("/proc/sys/{}", k.replace('.', "/"));
        if let Ok(out) = ns.run("cat", &[&path]) {
            m.insert(
                k.to_string(),
                String::from_utf8_lossy(&out.stdout).trim().to_string(),
            );
        }
    }
    m
}

/// `bytes` from a listener inside `ns` to us, then `bytes` from us to it. Returns the rates
/// (bits/s) down and up, timed from the connection to the last byte (down) and to the
/// server's acknowledgement of the last byte (up).
pub fn bulk_transfer(
    ns: &iolab_netns::Namespace,
    server: IpAddr,
    client: IpAddr,
    bytes: u64,
) -> anyhow::Result<(f64, f64)> {
    let l = ns.tcp_listener(SocketAddr::new(server, 0))?;
    let addr = l.local_addr()?;
    let srv = std::thread::spawn(move || -> std::io::Result<()> {
        // Down: write `bytes`.
        let (mut s, _) = l.accept()?;
        let buf = vec![0x5au8; 256 * 1024];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            s.write_all(&buf[..n])?;
            left -= n as u64;
        }
        drop(s);
        // Up: read to EOF, then answer one byte.
        let (mut s, _) = l.accept()?;
        let mut buf = vec![0u8; 256 * 1024];
        while s.read(&mut buf)? > 0 {}
        s.write_all(b"k")?;
        Ok(())
    });
    let connect = || -> anyhow::Result<TcpStream> {
        let sock =
            connect_from(client, addr).with_context(|| format!("connecting {client} -> {addr}"))?;
        sock.set_read_timeout(Some(Duration::from_secs(120)))?;
        Ok(sock)
    };
    let t = Instant::now();
    let mut s = connect()?;
    let mut got = 0u64;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = s.read(&mut buf).context("bulk transfer (down)")?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    let down_s = t.elapsed().as_secs_f64();
    if got != bytes {
        bail!("bulk transfer (down): got {got} of {bytes} bytes");
    }
    let t = Instant::now();
    let mut s2 = connect()?;
    let chunk = vec![0xa5u8; 256 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        s2.write_all(&chunk[..n]).context("bulk transfer (up)")?;
        left -= n as u64;
    }
    s2.shutdown(std::net::Shutdown::Write)?;
    let mut ack = [0u8; 1];
    s2.read_exact(&mut ack)
        .context("bulk transfer (up): no acknowledgement")?;
    let up_s = t.elapsed().as_secs_f64();
    match srv.join() {
        Ok(r) => r.context("bulk transfer: the sender inside the namespace failed")?,
        Err(_) => bail!("bulk transfer: the namespace thread panicked"),
    }
    let bits = bytes as f64 * 8.0;
    Ok((bits / down_s, bits / up_s))
}

/// A TCP connection to `to` from source address `from` (port chosen by the kernel).
fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    let domain = if from.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: socket(2) has no memory preconditions; the fd it returns is owned by the
    // TcpStream built right after, which closes it on every path.
    let fd =
        iolab_sys::cvt(unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fd is a fresh, valid socket that nothing else owns.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    let (sa, len) = iolab_sys::sockaddr::to_raw(&SocketAddr::new(from, 0));
    // SAFETY: sa is a properly initialised sockaddr of `len` bytes for this socket's family.
    iolab_sys::cvt(unsafe { libc::bind(fd, &sa as *const _ as *const libc::sockaddr, len) })?;
    let (sa, len) = iolab_sys::sockaddr::to_raw(&to);
    // SAFETY: as above; a blocking connect on our own socket.
    iolab_sys::cvt(unsafe { libc::connect(fd, &sa as *const _ as *const libc::sockaddr, len) })?;
    Ok(stream)
}

/// The report's "Link" section (empty on loopback).
pub fn report_section(info: Option<&LinkInfo>) -> String {
    use std::fmt::Write as _;
    let Some(i) = info else {
        return String::new();
    };
    let esc = crate::svg::esc;
    let mut out = String::from(r#"<h2 id="link">The link</h2>"#);
    let _ = write!(
        out,
        "<p>{}The server ran in network namespace <code>{}</code> behind a veth pair shaped with <code>tc</code>; the client connected from {} addresses. Made and removed by iolab.</p><table><tbody>",
        if i.seed_conditions {
            "<b>Seed 000's conditions</b> (<code>--seed-conditions</code>): 100 Mb/s, backlog 200, a new connection per request. "
        } else {
            ""
        },
        esc(&i.namespace),
        i.client_addrs.len()
    );
    let mut row = |k: &str, v: String| {
        let _ = write!(out, "<tr><th>{}</th><td>{}</td></tr>", esc(k), v);
    };
    row(
        "rate (each way)",
        esc(&iolab_netns::format_rate(i.rate_bps)),
    );
    row(
        "one-way delay",
        if i.delay_ms > 0.0 {
            format!("{} ms (round trip {} ms)", i.delay_ms, 2.0 * i.delay_ms)
        } else {
            "none".into()
        },
    );
    row(
        "measured (bulk transfer before the matrix)",
        format!(
            "{} server→client, {} client→server ({} MB each way)",
            mbit(i.measured_down_bps),
            mbit(i.measured_up_bps),
            i.bulk_bytes / 1_000_000
        ),
    );
    row("listen backlog asked", i.backlog.to_string());
    row(
        "qdisc, server end",
        format!("<code>{}</code>", esc(&i.qdisc_server_end)),
    );
    row(
        "qdisc, client end",
        format!("<code>{}</code>", esc(&i.qdisc_client_end)),
    );
    row(
        "addresses",
        esc(&format!(
            "server {}; client {}",
            i.server_addr,
            i.client_addrs.join(", ")
        )),
    );
    for (k, v) in &i.namespace_sysctls {
        row(&format!("{k} (server namespace)"), esc(v));
    }
    out.push_str("</tbody></table>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_no_link_section() {
        assert!(report_section(None).is_empty());
        let i = LinkInfo {
            rate_bps: SEED_RATE_BPS,
            backlog: 200,
            seed_conditions: true,
            qdisc_server_end: "qdisc tbf 1: root <x>".into(),
            ..LinkInfo::default()
        };
        let s = report_section(Some(&i));
        assert!(s.contains("100 Mbit/s"));
        assert!(s.contains("Seed 000"));
        assert!(s.contains("&lt;x&gt;"), "escaped: {s}");
    }
}
