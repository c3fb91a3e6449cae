//! BEP 15 UDP trackers: the packet codec (pure: fuzzed by the `udp_tracker` target), the
//! client the seeder announces with, and the server side of `iolab tracker`.
//!
//! The runtime has no UDP socket type yet: a non-blocking `std::net::UdpSocket` waits for
//! readiness through iolab-runtime's `wait_readable`.
//!
//! Limits: the client retries a lost packet after 15·2^n s as BEP 15 says, but only for
//! n = 0 and 1 ([`MAX_RETRY`]: 45 s in all) before the next tracker of the tier is tried;
//! a reply is at most [`MAX_PACKET`] bytes. The server hands out connection ids derived
//! from a secret, the client's address and the minute (no state per client), accepted for
//! two minutes as BEP 15 asks; at most [`crate::tracker::MAX_NUMWANT`] peers per reply.

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha1::{Digest, Sha1};

use crate::tracker::{Announce, AnnounceReply, Tracker, MAX_NUMWANT, MAX_REANNOUNCE_SECS};

/// The magic of a connect request.
pub const PROTOCOL_ID: u64 = 0x41727101980;
pub const ACTION_CONNECT: u32 = 0;
pub const ACTION_ANNOUNCE: u32 = 1;
pub const ACTION_SCRAPE: u32 = 2;
pub const ACTION_ERROR: u32 = 3;
/// Largest packet read or answered.
pub const MAX_PACKET: usize = 2048;
/// Retries are 15·2^n s for n = 0..=MAX_RETRY.
pub const MAX_RETRY: u32 = 1;

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap_or([0; 8]))
}

/// BEP 15 event numbers.
pub fn event_number(event: &str) -> u32 {
    match event {
        "completed" => 1,
        "started" => 2,
        "stopped" => 3,
        _ => 0,
    }
}

fn event_name(n: u32) -> &'static str {
    match n {
        1 => "completed",
        2 => "started",
        3 => "stopped",
        _ => "",
    }
}

pub fn encode_connect(tid: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&PROTOCOL_ID.to_be_bytes());
    b[8..12].copy_from_slice(&ACTION_CONNECT.to_be_bytes());
    b[12..].copy_from_slice(&tid.to_be_bytes());
    b
}

/// What we announce (the client side's request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpAnnounce {
    pub connection_id: u64,
    pub tid: u32,
    pub info_hash: [u8; 20],
    pub peer_id: [u8; 20],
    pub downloaded: u64,
    pub left: u64,
    pub uploaded: u64,
    pub event: u32,
    pub key: u32,
    pub numwant: i32,
    pub port: u16,
}

impl UdpAnnounce {
    pub fn encode(&self) -> [u8; 98] {
        let mut b = [0u8; 98];
        b[..8].copy_from_slice(&self.connection_id.to_be_bytes());
        b[8..12].copy_from_slice(&ACTION_ANNOUNCE.to_be_bytes());
        b[12..16].copy_from_slice(&self.tid.to_be_bytes());
        b[16..36].copy_from_slice(&self.info_hash);
        b[36..56].copy_from_slice(&self.peer_id);
        b[56..64].copy_from_slice(&self.downloaded.to_be_bytes());
        b[64..72].copy_from_slice(&self.left.to_be_bytes());
        b[72..80].copy_from_slice(&self.uploaded.to_be_bytes());
        b[80..84].copy_from_slice(&self.event.to_be_bytes());
        // 84..88: IP address 0 (the sender's); 88..92: key.
        b[88..92].copy_from_slice(&self.key.to_be_bytes());
        b[92..96].copy_from_slice(&self.numwant.to_be_bytes());
        b[96..98].copy_from_slice(&self.port.to_be_bytes());
        b
    }
}

/// A tracker's reply for transaction `tid`: the connection id of a connect, or an error.
pub fn parse_connect_reply(b: &[u8], tid: u32) -> Result<u64, String> {
    check_header(b, tid, ACTION_CONNECT)?;
    if b.len() < 16 {
        return Err(format!("connect reply of {} bytes (16 expected)", b.len()));
    }
    Ok(be64(&b[8..16]))
}

fn check_header(b: &[u8], tid: u32, action: u32) -> Result<(), String> {
    if b.len() < 8 {
        return Err(format!("reply of {} bytes", b.len()));
    }
    if be32(&b[4..8]) != tid {
        return Err("reply for another transaction".into());
    }
    match be32(b) {
        a if a == action => Ok(()),
        ACTION_ERROR => Err(format!(
            "refused: {}",
            String::from_utf8_lossy(&b[8..b.len().min(MAX_PACKET)])
        )),
        a => Err(format!("reply with action {a} (expected {action})")),
    }
}

/// An announce reply for transaction `tid`: interval and IPv4 peers (BEP 15).
pub fn parse_announce_reply(b: &[u8], tid: u32) -> Result<AnnounceReply, String> {
    check_header(b, tid, ACTION_ANNOUNCE)?;
    if b.len() < 20 {
        return Err(format!("announce reply of {} bytes (20 at least)", b.len()));
    }
    let secs = (be32(&b[8..12]) as u64).clamp(1, MAX_REANNOUNCE_SECS);
    let peers = b[20..]
        .chunks_exact(6)
        .map(|c| {
            SocketAddr::new(
                IpAddr::from([c[0], c[1], c[2], c[3]]),
                u16::from_be_bytes([c[4], c[5]]),
            )
        })
        .collect();
    Ok(AnnounceReply {
        interval: Duration::from_secs(secs),
        peers,
    })
}

/// A request to the tracker (the server side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UdpRequest {
    Connect {
        tid: u32,
    },
    Announce(UdpAnnounce),
    Scrape {
        connection_id: u64,
        tid: u32,
        hashes: Vec<[u8; 20]>,
    },
}

/// Parses one request packet; the error says why it is ignored.
pub fn parse_request(b: &[u8]) -> Result<UdpRequest, String> {
    if b.len() < 16 {
        return Err(format!("packet of {} bytes", b.len()));
    }
    let connection_id = be64(b);
    let action = be32(&b[8..12]);
    let tid = be32(&b[12..16]);
    match action {
        ACTION_CONNECT if connection_id == PROTOCOL_ID => Ok(UdpRequest::Connect { tid }),
        ACTION_CONNECT => Err("connect without the protocol id".into()),
        ACTION_ANNOUNCE if b.len() >= 98 => {
            let mut info_hash = [0u8; 20];
            info_hash.copy_from_slice(&b[16..36]);
            let mut peer_id = [0u8; 20];
            peer_id.copy_from_slice(&b[36..56]);
            Ok(UdpRequest::Announce(UdpAnnounce {
                connection_id,
                tid,
                info_hash,
                peer_id,
                downloaded: be64(&b[56..64]),
                left: be64(&b[64..72]),
                uploaded: be64(&b[72..80]),
                event: be32(&b[80..84]),
                key: be32(&b[88..92]),
                numwant: be32(&b[92..96]) as i32,
                port: u16::from_be_bytes([b[96], b[97]]),
            }))
        }
        ACTION_ANNOUNCE => Err(format!("announce of {} bytes (98 expected)", b.len())),
        ACTION_SCRAPE => {
            // At most 74 hashes fit a 1500-byte reply (BEP 15).
            let hashes = b[16..]
                .chunks_exact(20)
                .take(74)
                .map(|c| c.try_into().unwrap_or([0; 20]))
                .collect();
            Ok(UdpRequest::Scrape {
                connection_id,
                tid,
                hashes,
            })
        }
        a => Err(format!("unknown action {a}")),
    }
}

/// The tracker's UDP side: stateless connection ids.
pub struct UdpServer {
    tracker: Rc<Tracker>,
    secret: [u8; 16],
}

fn minute() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() / 60)
        .unwrap_or(0)
}

impl UdpServer {
    pub fn new(tracker: Rc<Tracker>) -> UdpServer {
        UdpServer {
            tracker,
            secret: rand::random(),
        }
    }

    fn connection_id(&self, from: SocketAddr, minute: u64) -> u64 {
        let mut h = Sha1::new();
        h.update(self.secret);
        h.update(from.to_string().as_bytes());
        h.update(minute.to_be_bytes());
        be64(&h.finalize()[..8])
    }

    fn valid(&self, id: u64, from: SocketAddr) -> bool {
        let m = minute();
        id == self.connection_id(from, m) || id == self.connection_id(from, m.saturating_sub(1))
    }

    /// The answer to one packet from `from` (`None`: ignored).
    pub fn answer(&self, b: &[u8], from: SocketAddr) -> Option<Vec<u8>> {
        let error = |tid: u32, msg: &str| {
            let mut r = ACTION_ERROR.to_be_bytes().to_vec();
            r.extend_from_slice(&tid.to_be_bytes());
            r.extend_from_slice(msg.as_bytes());
            Some(r)
        };
        let req = match parse_request(b) {
            Ok(r) => r,
            Err(_) => {
                self.tracker
                    .bad_requests
                    .set(self.tracker.bad_requests.get() + 1);
                return None;
            }
        };
        match req {
            UdpRequest::Connect { tid } => {
                let mut r = ACTION_CONNECT.to_be_bytes().to_vec();
                r.extend_from_slice(&tid.to_be_bytes());
                r.extend_from_slice(&self.connection_id(from, minute()).to_be_bytes());
                Some(r)
            }
            UdpRequest::Announce(a) if !self.valid(a.connection_id, from) => {
                error(a.tid, "unknown connection id")
            }
            UdpRequest::Announce(a) => {
                let numwant = if a.numwant < 0 {
                    50
                } else {
                    a.numwant as usize
                };
                let ann = Announce {
                    info_hash: a.info_hash,
                    peer_id: a.peer_id,
                    port: a.port,
                    left: a.left,
                    uploaded: a.uploaded,
                    event: event_name(a.event).to_string(),
                    compact: true,
                    numwant: numwant.min(MAX_NUMWANT),
                };
                if ann.port == 0 {
                    return error(a.tid, "port 0");
                }
                let ip = mapped(from.ip());
                let ans = self.tracker.announce_peers(&ann, ip);
                let mut r = ACTION_ANNOUNCE.to_be_bytes().to_vec();
                r.extend_from_slice(&a.tid.to_be_bytes());
                r.extend_from_slice(&(ans.interval.as_secs() as u32).to_be_bytes());
                r.extend_from_slice(&(ans.incomplete as u32).to_be_bytes());
                r.extend_from_slice(&(ans.complete as u32).to_be_bytes());
                // An IPv4 request gets IPv4 peers; an IPv6 one IPv6 peers (BEP 15).
                for (_, p) in &ans.peers {
                    match (p, ip) {
                        (SocketAddr::V4(s), IpAddr::V4(_)) => r.extend_from_slice(&s.ip().octets()),
                        (SocketAddr::V6(s), IpAddr::V6(_)) => r.extend_from_slice(&s.ip().octets()),
                        _ => continue,
                    }
                    r.extend_from_slice(&p.port().to_be_bytes());
                }
                Some(r)
            }
            UdpRequest::Scrape {
                connection_id, tid, ..
            } if !self.valid(connection_id, from) => error(tid, "unknown connection id"),
            UdpRequest::Scrape { tid, hashes, .. } => {
                let mut r = ACTION_SCRAPE.to_be_bytes().to_vec();
                r.extend_from_slice(&tid.to_be_bytes());
                for h in &hashes {
                    let (c, i, d) = self.tracker.scrape_one(h);
                    for n in [c, d, i] {
                        r.extend_from_slice(&(n as u32).to_be_bytes());
                    }
                }
                self.tracker.scrapes.set(self.tracker.scrapes.get() + 1);
                Some(r)
            }
        }
    }

    /// Serves `socket` forever (inside the runtime).
    pub async fn serve(self, socket: UdpSocket) -> io::Result<()> {
        socket.set_nonblocking(true)?;
        let mut buf = vec![0u8; MAX_PACKET];
        loop {
            let (n, from) = recv_from(&socket, &mut buf).await?;
            if let Some(reply) = self.answer(&buf[..n], from) {
                // A full send buffer drops the reply: the client retries (UDP).
                let _ = socket.send_to(&reply, from);
            }
        }
    }
}

fn mapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

async fn recv_from(socket: &UdpSocket, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
    loop {
        match socket.recv_from(buf) {
            Ok(x) => return Ok(x),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                iolab_runtime::wait_readable(socket.as_raw_fd()).await?
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // An ICMP error of an earlier send (the client went away): not ours to fail on.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
            Err(e) => return Err(e),
        }
    }
}

/// Splits `udp://host:port[/...]`.
pub fn parse_udp_url(url: &str) -> anyhow::Result<(String, u16)> {
    let rest = url
        .strip_prefix("udp://")
        .ok_or_else(|| anyhow::anyhow!("tracker URL {url:?} is not udp://"))?;
    let hostport = rest.split('/').next().unwrap_or("");
    let (host, port) = match hostport.strip_prefix('[') {
        Some(h) => h
            .split_once("]:")
            .ok_or_else(|| anyhow::anyhow!("tracker URL {url:?}: bad IPv6 literal or no port"))?,
        None => hostport
            .rsplit_once(':')
            .ok_or_else(|| anyhow::anyhow!("tracker URL {url:?}: no port"))?,
    };
    let port: u16 = port
        .parse()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| anyhow::anyhow!("tracker URL {url:?}: bad port"))?;
    Ok((host.to_string(), port))
}

/// One exchange: sends `req` until a reply for `tid` comes (15·2^n s per try).
async fn exchange(
    socket: &UdpSocket,
    req: &[u8],
    url: &str,
    mut accept: impl FnMut(&[u8]) -> Option<Result<(), String>>,
) -> anyhow::Result<()> {
    let mut buf = vec![0u8; MAX_PACKET];
    for n in 0..=MAX_RETRY {
        socket.send(req)?;
        let wait = Duration::from_secs(15 << n);
        let got = iolab_runtime::timeout(wait, async {
            loop {
                let (len, _) = recv_from(socket, &mut buf).await?;
                if let Some(r) = accept(&buf[..len]) {
                    return Ok::<_, io::Error>(r);
                }
            }
        })
        .await;
        match got {
            Ok(Ok(Ok(()))) => return Ok(()),
            Ok(Ok(Err(e))) => anyhow::bail!("tracker {url}: {e}"),
            Ok(Err(e)) => anyhow::bail!("tracker {url}: {e}"),
            Err(_) => {}
        }
    }
    anyhow::bail!("tracker {url} did not answer (BEP 15 retries: 15 s, 30 s)")
}

/// One announce to a UDP tracker (BEP 15): connect, then announce.
pub async fn announce(url: &str, a: &Announce) -> anyhow::Result<AnnounceReply> {
    let (host, tport) = parse_udp_url(url)?;
    let addr = crate::tracker::resolve(&host, tport).await?;
    let local: SocketAddr = if addr.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(local)?;
    socket.connect(addr)?;
    socket.set_nonblocking(true)?;
    let tid: u32 = rand::random();
    let mut connection_id = 0;
    exchange(
        &socket,
        &encode_connect(tid),
        url,
        |b| match parse_connect_reply(b, tid) {
            Err(e) if e.contains("another transaction") => None,
            r => Some(r.map(|id| connection_id = id)),
        },
    )
    .await?;
    let tid: u32 = rand::random();
    let req = UdpAnnounce {
        connection_id,
        tid,
        info_hash: a.info_hash,
        peer_id: a.peer_id,
        downloaded: 0,
        left: a.left,
        uploaded: a.uploaded,
        event: event_number(&a.event),
        key: rand::random(),
        numwant: i32::try_from(a.numwant).unwrap_or(i32::MAX),
        port: a.port,
    };
    let mut reply = None;
    exchange(
        &socket,
        &req.encode(),
        url,
        |b| match parse_announce_reply(b, tid) {
            Err(e) if e.contains("another transaction") => None,
            r => Some(r.map(|a| reply = Some(a))),
        },
    )
    .await?;
    reply.ok_or_else(|| anyhow::anyhow!("tracker {url}: no reply"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_and_bad_packets_are_errors() {
        let a = UdpAnnounce {
            connection_id: 7,
            tid: 9,
            info_hash: [1; 20],
            peer_id: [2; 20],
            downloaded: 3,
            left: 4,
            uploaded: 5,
            event: 2,
            key: 6,
            numwant: -1,
            port: 6881,
        };
        assert_eq!(
            parse_request(&a.encode()),
            Ok(UdpRequest::Announce(a.clone()))
        );
        assert_eq!(
            parse_request(&encode_connect(5)),
            Ok(UdpRequest::Connect { tid: 5 })
        );
        assert!(parse_request(&a.encode()[..50]).is_err());
        assert!(parse_request(b"short").is_err());
        let mut bad = encode_connect(5);
        bad[0] ^= 1;
        assert!(parse_request(&bad).is_err(), "a connect needs the magic");
        assert!(parse_connect_reply(&[0, 0, 0, 0, 0, 0, 0, 5], 5).is_err());
        let err = [&3u32.to_be_bytes()[..], &5u32.to_be_bytes(), b"go away"].concat();
        assert_eq!(parse_connect_reply(&err, 5), Err("refused: go away".into()));
        assert!(parse_announce_reply(&err, 6)
            .unwrap_err()
            .contains("another transaction"));
    }

    #[test]
    fn the_server_answers_connect_then_announce_with_the_seeder() {
        let t = Tracker::new(Duration::from_secs(60));
        let srv = UdpServer::new(t.clone());
        let seeder: SocketAddr = "10.0.0.1:5000".parse().unwrap();
        let client: SocketAddr = "10.0.0.2:5001".parse().unwrap();
        let mut ids = Vec::new();
        for from in [seeder, client] {
            let r = srv.answer(&encode_connect(1), from).unwrap();
            ids.push(parse_connect_reply(&r, 1).unwrap());
        }
        let ann = |id: u64, from: SocketAddr, peer: u8, port: u16| {
            let a = UdpAnnounce {
                connection_id: id,
                tid: 2,
                info_hash: [9; 20],
                peer_id: [peer; 20],
                downloaded: 0,
                left: 0,
                uploaded: 0,
                event: 2,
                key: 0,
                numwant: -1,
                port,
            };
            srv.answer(&a.encode(), from).unwrap()
        };
        ann(ids[0], seeder, 1, 6881);
        let r = parse_announce_reply(&ann(ids[1], client, 2, 6882), 2).unwrap();
        assert_eq!(r.peers, vec!["10.0.0.1:6881".parse().unwrap()]);
        // Another address cannot use a connection id it was not given.
        let r = ann(ids[0], client, 2, 6882);
        assert!(parse_announce_reply(&r, 2)
            .unwrap_err()
            .contains("unknown connection id"));
    }

    #[test]
    fn udp_urls() {
        assert_eq!(
            parse_udp_url("udp://t.example:1337/announce").unwrap(),
            ("t.example".into(), 1337)
        );
        assert_eq!(parse_udp_url("udp://[::1]:80").unwrap(), ("::1".into(), 80));
        assert!(parse_udp_url("udp://nopport").is_err());
        assert!(parse_udp_url("http://x:1").is_err());
    }
}
