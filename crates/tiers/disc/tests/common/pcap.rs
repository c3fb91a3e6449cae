//! The capture check: tcpdump (Debian package tcpdump) in the client's namespace, and a
//! small reader of what it wrote (pcap, Linux "cooked" link types of `-i any`), to check
//! that the segments the client received from the FE's address form one valid TCP stream.

use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// One TCP segment seen on the wire.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The interface it was seen on (SLL/SLL2 interface index; 0 if the link type has none).
    pub ifindex: u32,
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub seq: u32,
    pub flags: u8,
    pub data: Vec<u8>,
}

pub const FIN: u8 = 0x01;
pub const SYN: u8 = 0x02;

/// Reads a pcap file: every IPv4 TCP segment in it.
pub fn read(path: &Path) -> std::io::Result<Vec<Seen>> {
    let b = std::fs::read(path)?;
    let mut out = Vec::new();
    if b.len() < 24 {
        return Ok(out); // tcpdump has not written its header yet
    }
    let le = match b[..4] {
        [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1] => true,
        [0xa1, 0xb2, 0xc3, 0xd4] | [0xa1, 0xb2, 0x3c, 0x4d] => false,
        _ => return Err(std::io::Error::other("not a pcap file")),
    };
    let u32_at = |p: &[u8]| {
        let a = [p[0], p[1], p[2], p[3]];
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let link = u32_at(&b[20..]);
    let mut at = 24;
    while at + 16 <= b.len() {
        let incl = u32_at(&b[at + 8..]) as usize;
        let rec = at + 16;
        if rec + incl > b.len() {
            break; // a record being written
        }
        let p = &b[rec..rec + incl];
        at = rec + incl;
        // (network-layer protocol, interface index, link header length)
        let (proto, ifindex, hl) = match link {
            276 if p.len() >= 20 => (
                u16::from_be_bytes([p[0], p[1]]),
                u32::from_be_bytes([p[4], p[5], p[6], p[7]]),
                20,
            ),
            113 if p.len() >= 16 => (u16::from_be_bytes([p[14], p[15]]), 0, 16),
            1 if p.len() >= 14 => (u16::from_be_bytes([p[12], p[13]]), 0, 14),
            _ => continue,
        };
        if proto != 0x0800 {
            continue;
        }
        let ip = &p[hl..];
        if ip.len() < 20 || ip[9] != 6 {
            continue;
        }
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]])).min(ip.len());
        if total < ihl + 20 {
            continue;
        }
        let t = &ip[ihl..total];
        let doff = usize::from(t[12] >> 4) * 4;
        if doff < 20 || t.len() < doff {
            continue;
        }
        let addr = |a: &[u8], port: &[u8]| {
            SocketAddrV4::new(
                std::net::Ipv4Addr::new(a[0], a[1], a[2], a[3]),
                u16::from_be_bytes([port[0], port[1]]),
            )
        };
        out.push(Seen {
            ifindex,
            src: addr(&ip[12..16], &t[0..2]),
            dst: addr(&ip[16..20], &t[2..4]),
            seq: u32::from_be_bytes([t[4], t[5], t[6], t[7]]),
            flags: t[13],
            data: t[doff..].to_vec(),
        });
    }
    Ok(out)
}

/// tcpdump running in a namespace, writing to a file; stopped (SIGTERM) on drop.
pub struct Tcpdump {
    child: Child,
    pub file: PathBuf,
}

impl Tcpdump {
    /// None when tcpdump is not installed (the caller skips, or fails under CI=true).
    /// Returns once tcpdump has opened its file (it is capturing then).
    pub fn start(ns: &str, filter: &str, file: PathBuf) -> Option<Tcpdump> {
        Command::new("tcpdump").arg("--version").output().ok()?;
        let child = Command::new("ip")
            .args([
                "netns", "exec", ns, "tcpdump", "-i", "any", "-U", "-n", "-w",
            ])
            .arg(&file)
            .arg(filter)
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting tcpdump");
        let t = Tcpdump { child, file };
        let t0 = Instant::now();
        while !t.file.exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "tcpdump did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(t)
    }

    /// Waits until the capture holds a segment matching `until` (bounded: 60 s), then
    /// stops tcpdump and returns every segment captured.
    pub fn finish(mut self, until: impl Fn(&Seen) -> bool) -> Vec<Seen> {
        let t0 = Instant::now();
        loop {
            let seen = read(&self.file).unwrap_or_default();
            if seen.iter().any(&until) || t0.elapsed() > Duration::from_secs(60) {
                self.stop();
                return read(&self.file).expect("reading the capture");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop(&mut self) {
        // (our own child, not yet waited for: its pid is not reused)
        let _ = iolab_sys::process::signal(self.child.id(), libc::SIGTERM);
        let _ = self.child.wait();
    }
}

impl Drop for Tcpdump {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
        let _ = std::fs::remove_file(&self.file);
    }
}

/// What the client received from `server` on its one connection, checked as a TCP stream:
/// every data byte placed by its sequence number relative to the SYN-ACK's; a byte seen twice
/// (a retransmission) must be the same byte; no hole; the FIN right after the last byte.
/// Returns the reassembled bytes and the interfaces that carried data.
pub fn reassemble(seen: &[Seen], server: SocketAddrV4) -> (Vec<u8>, Vec<u32>) {
    let from: Vec<&Seen> = seen.iter().filter(|s| s.src == server).collect();
    let synack: Vec<&&Seen> = from.iter().filter(|s| s.flags & SYN != 0).collect();
    assert_eq!(
        synack.len(),
        1,
        "one connection from the server in the capture"
    );
    let (isn, client) = (synack[0].seq.wrapping_add(1), synack[0].dst);
    let mut stream: Vec<Option<u8>> = Vec::new();
    let mut fin = None;
    let mut ifaces = Vec::new();
    for s in from
        .iter()
        .filter(|s| s.dst == client && s.flags & SYN == 0)
    {
        let off = s.seq.wrapping_sub(isn) as usize;
        assert!(off < 1 << 31, "a segment before the stream's start: {s:?}");
        if !s.data.is_empty() && !ifaces.contains(&s.ifindex) {
            ifaces.push(s.ifindex);
        }
        if !s.data.is_empty() && stream.len() < off + s.data.len() {
            stream.resize(off + s.data.len(), None);
        }
        for (i, &b) in s.data.iter().enumerate() {
            match stream[off + i] {
                Some(was) => assert_eq!(
                    was,
                    b,
                    "byte {} sent twice with different values (overlapping segments)",
                    off + i
                ),
                None => stream[off + i] = Some(b),
            }
        }
        if s.flags & FIN != 0 {
            let at = off + s.data.len();
            assert!(
                fin.is_none_or(|f| f == at),
                "two FINs at different places: {fin:?} and {at}"
            );
            fin = Some(at);
        }
    }
    if let Some(hole) = stream.iter().position(|b| b.is_none()) {
        panic!(
            "hole in the sequence space at byte {hole} of {}",
            stream.len()
        );
    }
    assert_eq!(fin, Some(stream.len()), "the FIN follows the last byte");
    (stream.into_iter().map(|b| b.unwrap()).collect(), ifaces)
}
