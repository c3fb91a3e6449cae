//! A small HTTP tracker on iolab-runtime (BEP 3 announce, BEP 23 compact peer lists,
//! BEP 7 `peers6`, BEP 48 scrape), and the announce client the seeder uses (http://, and
//! https:// through [`crate::https`]).
//!
//! Limits: a request must arrive within 10 s and fit in 8 KiB; at most 200 peers per reply
//! (`numwant` is capped); a torrent holds at most 50,000 peers; peers that have not
//! announced for two intervals are forgotten; one request per connection.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::rc::Rc;
use std::time::{Duration, Instant};

use iolab_runtime::net::{TcpListener, TcpStream};
use iolab_runtime::{spawn, timeout};
use lava_torrent::bencode::BencodeElem;
use percent_encoding::{percent_decode, percent_encode, NON_ALPHANUMERIC};

pub const MAX_REQUEST: usize = 8 * 1024;
pub const MAX_NUMWANT: usize = 200;
pub const MAX_PEERS_PER_TORRENT: usize = 50_000;

#[derive(Debug, Clone)]
struct PeerEntry {
    addr: SocketAddr,
    left: u64,
    last: Instant,
    /// Counted in `complete`: it says `left=0` and has shown it has the data (see
    /// [`Tracker::announce_peers`]).
    seeder: bool,
}

#[derive(Debug, Default)]
struct TorrentEntry {
    peers: HashMap<[u8; 20], PeerEntry>,
    completed: u64,
}

/// What the tracker answers to an announce, whatever the transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnounceAnswer {
    pub complete: u64,
    pub incomplete: u64,
    pub downloaded: u64,
    pub interval: Duration,
    pub peers: Vec<([u8; 20], SocketAddr)>,
}

/// The tracker's state (one loop).
pub struct Tracker {
    torrents: RefCell<HashMap<[u8; 20], TorrentEntry>>,
    pub interval: Duration,
    pub announces: std::cell::Cell<u64>,
    pub scrapes: std::cell::Cell<u64>,
    pub bad_requests: std::cell::Cell<u64>,
}

/// An announce: what `iolab tracker` parsed from a client, and what our clients send (the
/// HTTP one, [`announce`], and the UDP one, [`crate::udp_tracker::announce`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announce {
    pub info_hash: [u8; 20],
    pub peer_id: [u8; 20],
    pub port: u16,
    pub left: u64,
    pub uploaded: u64,
    pub event: String,
    pub compact: bool,
    pub numwant: usize,
}

/// Splits a query string into decoded (key, value) byte pairs.
pub fn parse_query(q: &str) -> Vec<(String, Vec<u8>)> {
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (
                percent_decode(k.as_bytes())
                    .decode_utf8_lossy()
                    .into_owned(),
                percent_decode(v.as_bytes()).collect(),
            )
        })
        .collect()
}

fn num<T: std::str::FromStr>(v: &[u8]) -> Option<T> {
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Validates an announce's parameters; the error is the tracker's `failure reason`.
pub fn parse_announce(q: &[(String, Vec<u8>)]) -> Result<Announce, String> {
    let get = |k: &str| {
        q.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_slice())
    };
    let info_hash: [u8; 20] = get("info_hash")
        .ok_or("missing info_hash")?
        .try_into()
        .map_err(|_| "info_hash is not 20 bytes")?;
    let peer_id: [u8; 20] = get("peer_id")
        .ok_or("missing peer_id")?
        .try_into()
        .map_err(|_| "peer_id is not 20 bytes")?;
    let port: u16 = get("port")
        .and_then(num)
        .filter(|p| *p != 0)
        .ok_or("missing or invalid port")?;
    let left = get("left").and_then(num).unwrap_or(0);
    let uploaded = get("uploaded").and_then(num).unwrap_or(0);
    let event = get("event")
        .map(|e| String::from_utf8_lossy(e).into_owned())
        .unwrap_or_default();
    let compact = get("compact").map(|v| v != b"0").unwrap_or(true);
    let numwant = get("numwant")
        .and_then(num::<usize>)
        .unwrap_or(50)
        .min(MAX_NUMWANT);
    Ok(Announce {
        info_hash,
        peer_id,
        port,
        left,
        uploaded,
        event,
        compact,
        numwant,
    })
}

fn dict(items: Vec<(&str, BencodeElem)>) -> BencodeElem {
    BencodeElem::Dictionary(items.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

fn failure(reason: &str) -> Vec<u8> {
    dict(vec![("failure reason", BencodeElem::String(reason.into()))]).encode()
}

impl Tracker {
    pub fn new(interval: Duration) -> Rc<Tracker> {
        Rc::new(Tracker {
            torrents: RefCell::new(HashMap::new()),
            interval,
            announces: 0.into(),
            scrapes: 0.into(),
            bad_requests: 0.into(),
        })
    }

    /// Records one announce from `from` (the connection's address: the `ip` parameter is
    /// ignored so a client cannot add somebody else's address) and chooses the peers of
    /// the reply.
    ///
    /// BEP 3 and 23 leave two choices to the tracker; ours (issue 47):
    /// - **Who counts in `complete`**: a peer with `left=0` that has shown it has the data:
    ///   it announced `event=completed`, or was seen with `left>0` before, or reports
    ///   `uploaded>0`. A magnet client announces `left=0` before it has even the metadata
    ///   (rqbit does), and so does a fresh seeder: neither is counted until it shows data
    ///   (a seeder does at its next announce after serving anybody).
    /// - **Who gets whom**: everyone gets everyone else; a peer with `left>0` gets the
    ///   seeders first, a peer with `left=0` too (a magnet client needs a peer with the
    ///   metadata, and a seeder connecting to a seeder costs one handshake).
    pub fn announce_peers(&self, a: &Announce, from: IpAddr) -> AnnounceAnswer {
        let now = Instant::now();
        let expiry = self.interval * 2;
        let mut torrents = self.torrents.borrow_mut();
        let t = torrents.entry(a.info_hash).or_default();
        t.peers.retain(|_, p| now.duration_since(p.last) < expiry);
        if a.event == "stopped" {
            t.peers.remove(&a.peer_id);
        } else {
            if a.event == "completed" {
                t.completed += 1;
            }
            let before = t.peers.get(&a.peer_id);
            let had_left = before.is_some_and(|p| p.left > 0);
            let seeder = a.left == 0
                && (a.event == "completed"
                    || had_left
                    || a.uploaded > 0
                    || before.is_some_and(|p| p.seeder));
            if t.peers.len() < MAX_PEERS_PER_TORRENT || t.peers.contains_key(&a.peer_id) {
                t.peers.insert(
                    a.peer_id,
                    PeerEntry {
                        addr: SocketAddr::new(from, a.port),
                        left: a.left,
                        last: now,
                        seeder,
                    },
                );
            }
        }
        let complete = t.peers.values().filter(|p| p.seeder).count() as u64;
        let incomplete = t.peers.len() as u64 - complete;
        let mut others: Vec<(&[u8; 20], &PeerEntry)> =
            t.peers.iter().filter(|(id, _)| **id != a.peer_id).collect();
        // Those with everything (left=0) first, the counted seeders before them all.
        others.sort_by_key(|(_, p)| (!p.seeder, p.left != 0));
        others.truncate(a.numwant);
        self.announces.set(self.announces.get() + 1);
        AnnounceAnswer {
            complete,
            incomplete,
            downloaded: t.completed,
            interval: self.interval,
            peers: others.iter().map(|(id, p)| (**id, p.addr)).collect(),
        }
    }

    /// Answers one HTTP announce (bencoded) from `from`.
    pub fn announce(&self, a: &Announce, from: IpAddr) -> Vec<u8> {
        let ans = self.announce_peers(a, from);
        let mut items = vec![
            ("complete", BencodeElem::Integer(ans.complete as i64)),
            ("incomplete", BencodeElem::Integer(ans.incomplete as i64)),
            ("downloaded", BencodeElem::Integer(ans.downloaded as i64)),
            (
                "interval",
                BencodeElem::Integer(self.interval.as_secs() as i64),
            ),
            (
                "min interval",
                BencodeElem::Integer((self.interval.as_secs() / 2).max(1) as i64),
            ),
        ];
        if a.compact {
            let mut v4 = Vec::new();
            let mut v6 = Vec::new();
            for (_, addr) in &ans.peers {
                match addr {
                    SocketAddr::V4(s) => {
                        v4.extend_from_slice(&s.ip().octets());
                        v4.extend_from_slice(&s.port().to_be_bytes());
                    }
                    SocketAddr::V6(s) => {
                        v6.extend_from_slice(&s.ip().octets());
                        v6.extend_from_slice(&s.port().to_be_bytes());
                    }
                }
            }
            items.push(("peers", BencodeElem::Bytes(v4)));
            if !v6.is_empty() {
                items.push(("peers6", BencodeElem::Bytes(v6)));
            }
        } else {
            let list = ans
                .peers
                .iter()
                .map(|(id, addr)| {
                    dict(vec![
                        ("peer id", BencodeElem::Bytes(id.to_vec())),
                        ("ip", BencodeElem::String(addr.ip().to_string())),
                        ("port", BencodeElem::Integer(addr.port() as i64)),
                    ])
                })
                .collect();
            items.push(("peers", BencodeElem::List(list)));
        }
        dict(items).encode()
    }

    /// Scrape figures of one torrent: (complete, incomplete, downloaded).
    pub fn scrape_one(&self, h: &[u8; 20]) -> (u64, u64, u64) {
        let torrents = self.torrents.borrow();
        let now = Instant::now();
        let expiry = self.interval * 2;
        match torrents.get(h) {
            Some(t) => {
                let (mut c, mut i) = (0, 0);
                for p in t
                    .peers
                    .values()
                    .filter(|p| now.duration_since(p.last) < expiry)
                {
                    if p.seeder {
                        c += 1
                    } else {
                        i += 1
                    }
                }
                (c, i, t.completed)
            }
            None => (0, 0, 0),
        }
    }

    /// BEP 48: statistics for the given info hashes (all torrents, at most 1,000, if none).
    pub fn scrape(&self, hashes: &[[u8; 20]]) -> Vec<u8> {
        let keys: Vec<[u8; 20]> = if hashes.is_empty() {
            self.torrents.borrow().keys().take(1000).copied().collect()
        } else {
            hashes.to_vec()
        };
        let mut files = HashMap::new();
        for h in keys {
            let (c, i, d) = self.scrape_one(&h);
            files.insert(
                h.to_vec(),
                dict(vec![
                    ("complete", BencodeElem::Integer(c as i64)),
                    ("downloaded", BencodeElem::Integer(d as i64)),
                    ("incomplete", BencodeElem::Integer(i as i64)),
                ]),
            );
        }
        self.scrapes.set(self.scrapes.get() + 1);
        let mut top = HashMap::new();
        top.insert(b"files".to_vec(), BencodeElem::RawDictionary(files));
        BencodeElem::RawDictionary(top).encode()
    }

    /// Answers the HTTP request `head` (request line and headers) from `from`.
    pub fn handle(&self, head: &[u8], from: IpAddr) -> (u16, Vec<u8>) {
        let line = head.split(|&b| b == b'\n').next().unwrap_or(b"");
        let line = String::from_utf8_lossy(line);
        let mut parts = line.split_whitespace();
        let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
            self.bad_requests.set(self.bad_requests.get() + 1);
            return (400, failure("malformed request line"));
        };
        if method != "GET" {
            self.bad_requests.set(self.bad_requests.get() + 1);
            return (405, failure("only GET is served"));
        }
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let q = parse_query(query);
        match path.rsplit('/').next().unwrap_or("") {
            "announce" => match parse_announce(&q) {
                Ok(a) => (200, self.announce(&a, from)),
                Err(e) => {
                    self.bad_requests.set(self.bad_requests.get() + 1);
                    (200, failure(&e))
                }
            },
            "scrape" => {
                let mut hs = Vec::new();
                for (k, v) in &q {
                    if k == "info_hash" {
                        match <[u8; 20]>::try_from(v.as_slice()) {
                            Ok(h) => hs.push(h),
                            Err(_) => return (200, failure("info_hash is not 20 bytes")),
                        }
                    }
                }
                (200, self.scrape(&hs))
            }
            _ => {
                self.bad_requests.set(self.bad_requests.get() + 1);
                (404, failure("unknown path: use /announce or /scrape"))
            }
        }
    }

    /// Serves forever (inside the runtime).
    pub async fn serve(self: Rc<Self>, listener: TcpListener) -> io::Result<()> {
        loop {
            let (stream, addr) = match listener.accept().await {
                Ok(x) => x,
                Err(e) if e.raw_os_error() == Some(libc::EMFILE) => {
                    iolab_runtime::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let me = self.clone();
            spawn(async move {
                let _ = timeout(Duration::from_secs(10), me.connection(stream, addr)).await;
            });
        }
    }

    async fn connection(&self, stream: TcpStream, addr: SocketAddr) {
        let mut req = Vec::new();
        loop {
            let (r, buf) = stream.read(vec![0u8; 2048]).await;
            let n = match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            req.extend_from_slice(&buf[..n]);
            if req.windows(4).any(|w| w == b"\r\n\r\n") || req.windows(2).any(|w| w == b"\n\n") {
                break;
            }
            if req.len() > MAX_REQUEST {
                let _ = stream
                    .write_all(b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".as_slice())
                    .await;
                self.bad_requests.set(self.bad_requests.get() + 1);
                return;
            }
        }
        let ip = match addr.ip() {
            IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .map(IpAddr::V4)
                .unwrap_or(IpAddr::V6(v6)),
            v4 => v4,
        };
        let (status, body) = self.handle(&req, ip);
        let reason = match status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            _ => "Method Not Allowed",
        };
        let mut resp = format!(
            "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        resp.extend_from_slice(&body);
        let _ = stream.write_all(resp).await;
    }
}

// ------------------------------------------------------------------ announce client

/// What a tracker answered.
#[derive(Debug, Clone)]
pub struct AnnounceReply {
    pub interval: Duration,
    pub peers: Vec<SocketAddr>,
}

/// Splits `http://host[:port]/path[?query]`.
pub fn parse_http_url(url: &str) -> anyhow::Result<(String, u16, String)> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        anyhow::anyhow!("tracker URL {url:?}: only http:// trackers are supported")
    })?;
    split_host_path(url, rest, 80)
}

/// Splits `http://` or `https://host[:port]/path[?query]`: (TLS, host, port, path).
pub fn parse_tracker_url(url: &str) -> anyhow::Result<(bool, String, u16, String)> {
    if let Some(rest) = url.strip_prefix("https://") {
        let (h, p, path) = split_host_path(url, rest, 443)?;
        return Ok((true, h, p, path));
    }
    let (h, p, path) = parse_http_url(url)?;
    Ok((false, h, p, path))
}

fn split_host_path(
    url: &str,
    rest: &str,
    default_port: u16,
) -> anyhow::Result<(String, u16, String)> {
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
        let (h, p) = h
            .split_once(']')
            .ok_or_else(|| anyhow::anyhow!("tracker URL {url:?}: bad IPv6 literal"))?;
        (h.to_string(), p.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (hostport.to_string(), None),
        }
    };
    let port: u16 = match port {
        None => default_port,
        Some(p) => p
            .parse()
            .map_err(|_| anyhow::anyhow!("tracker URL {url:?}: bad port"))?,
    };
    if host.is_empty() {
        anyhow::bail!("tracker URL {url:?}: no host");
    }
    Ok((host, port, path.to_string()))
}

/// One announce over HTTP.
pub async fn announce(url: &str, a: &Announce) -> anyhow::Result<AnnounceReply> {
    announce_over(url, a, None).await
}

/// One announce over HTTP or HTTPS; an https:// tracker's certificate is checked with
/// `tls` (default: Mozilla's roots).
pub async fn announce_over(
    url: &str,
    a: &Announce,
    tls: Option<&crate::https::TlsClient>,
) -> anyhow::Result<AnnounceReply> {
    let (https, host, tport, path) = parse_tracker_url(url)?;
    let sep = if path.contains('?') { '&' } else { '?' };
    let mut target = format!(
        "{path}{sep}info_hash={}&peer_id={}&port={}&uploaded={}&downloaded=0&left={}&compact={}&numwant={}",
        percent_encode(&a.info_hash, NON_ALPHANUMERIC),
        percent_encode(&a.peer_id, NON_ALPHANUMERIC),
        a.port,
        a.uploaded,
        a.left,
        u8::from(a.compact),
        a.numwant,
    );
    if !a.event.is_empty() {
        target.push_str("&event=");
        target.push_str(&a.event);
    }
    let req = format!(
        "GET {target} HTTP/1.1\r\nHost: {host}:{tport}\r\nUser-Agent: iolab-hekate\r\nConnection: close\r\n\r\n"
    );
    if https {
        let tls = tls
            .cloned()
            .unwrap_or_else(crate::https::TlsClient::mozilla_roots);
        let body = iolab_runtime::detach(move || {
            crate::https::exchange(&tls, &host, tport, req.as_bytes(), Duration::from_secs(15))
        })
        .await
        .map_err(|e| anyhow::anyhow!("tracker {url}: {e}"))?;
        return parse_announce_reply(url, &body);
    }
    let addr = resolve(&host, tport).await?;
    let body = timeout(Duration::from_secs(15), async {
        let s = TcpStream::connect(addr).await?;
        let (r, _) = s.write_all(req.into_bytes()).await;
        r?;
        let mut resp = Vec::new();
        loop {
            let (r, buf) = s.read(vec![0u8; 4096]).await;
            let n = r?;
            if n == 0 {
                break;
            }
            resp.extend_from_slice(&buf[..n]);
            if resp.len() > 1 << 20 {
                return Err(io::Error::other("tracker reply over 1 MiB"));
            }
        }
        Ok::<_, io::Error>(resp)
    })
    .await
    .map_err(|_| anyhow::anyhow!("tracker {url} did not answer within 15 s"))?
    .map_err(|e| anyhow::anyhow!("tracker {url}: {e}"))?;
    parse_announce_reply(url, &body)
}

/// The first address of `host` (resolved on the blocking pool: getaddrinfo blocks).
pub(crate) async fn resolve(host: &str, port: u16) -> anyhow::Result<SocketAddr> {
    let h = host.to_string();
    iolab_runtime::detach(move || (h.as_str(), port).to_socket_addrs())
        .await?
        .next()
        .ok_or_else(|| anyhow::anyhow!("{host} has no address"))
}

/// The longest re-announce interval a tracker can ask of us (a day).
pub const MAX_REANNOUNCE_SECS: u64 = 86_400;

/// A tracker's HTTP reply to an announce (status line, headers, bencoded body) from `url`:
/// its interval and compact IPv4 peers, or why it is not usable (a `failure reason`, not
/// bencode, not a dictionary). Outside data: fuzzed (crates/apps/seeder/fuzz, target tracker).
pub fn parse_announce_reply(url: &str, body: &[u8]) -> anyhow::Result<AnnounceReply> {
    let split = body
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("tracker {url}: malformed HTTP reply"))?;
    let payload = &body[split + 4..];
    let elems = BencodeElem::from_bytes(payload)
        .map_err(|e| anyhow::anyhow!("tracker {url}: reply is not bencode ({e})"))?;
    let Some(BencodeElem::Dictionary(d)) = elems.into_iter().next() else {
        anyhow::bail!("tracker {url}: reply is not a dictionary");
    };
    if let Some(BencodeElem::String(r)) = d.get("failure reason") {
        anyhow::bail!("tracker {url} refused: {r}");
    }
    // Bounded: the next announce is scheduled at now + interval, and an Instant that far
    // out overflows (a panic); a tracker asking for more than a day gets a day.
    let interval = match d.get("interval") {
        Some(BencodeElem::Integer(i)) if *i > 0 => {
            Duration::from_secs((*i as u64).min(MAX_REANNOUNCE_SECS))
        }
        _ => Duration::from_secs(1800),
    };
    let mut peers = Vec::new();
    if let Some(BencodeElem::Bytes(b)) = d.get("peers") {
        for c in b.chunks_exact(6) {
            peers.push(SocketAddr::new(
                IpAddr::from([c[0], c[1], c[2], c[3]]),
                u16::from_be_bytes([c[4], c[5]]),
            ));
        }
    }
    Ok(AnnounceReply { interval, peers })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Vec<(String, Vec<u8>)> {
        parse_query(s)
    }

    #[test]
    fn announce_reply_interval_is_bounded_and_peers_parsed() {
        let url = "http://t/announce";
        // i64::MAX seconds: scheduling now + interval used to overflow Instant (a panic).
        let r = parse_announce_reply(
            url,
            b"HTTP/1.1 200 OK\r\n\r\nd8:intervali9223372036854775807e5:peers6:\x7f\x00\x00\x01\x1a\xe1e",
        )
        .unwrap();
        assert_eq!(r.interval, Duration::from_secs(MAX_REANNOUNCE_SECS));
        assert!(std::time::Instant::now().checked_add(r.interval).is_some());
        assert_eq!(r.peers, vec!["127.0.0.1:6881".parse().unwrap()]);
        let e = parse_announce_reply(url, b"HTTP/1.1 200 OK\r\n\r\nd14:failure reason2:noe")
            .unwrap_err();
        assert!(e.to_string().contains("refused: no"), "{e}");
        assert!(parse_announce_reply(url, b"no header end").is_err());
        assert!(parse_announce_reply(url, b"\r\n\r\nli1ee").is_err());
    }

    #[test]
    fn announce_compact_and_scrape() {
        let t = Tracker::new(Duration::from_secs(60));
        let ih = "%aa".repeat(20);
        let a1 = parse_announce(&q(&format!(
            "info_hash={ih}&peer_id=AAAAAAAAAAAAAAAAAAAA&port=6881&left=0&uploaded=1&event=started"
        )))
        .unwrap();
        assert_eq!(a1.info_hash, [0xaa; 20]);
        let r1 = t.announce(&a1, "127.0.0.1".parse().unwrap());
        // A seeder alone gets no peers.
        assert!(
            r1.windows(8).any(|w| w == b"5:peers0"),
            "{:?}",
            String::from_utf8_lossy(&r1)
        );
        let a2 = parse_announce(&q(&format!(
            "info_hash={ih}&peer_id=BBBBBBBBBBBBBBBBBBBB&port=7000&left=100"
        )))
        .unwrap();
        let r2 = t.announce(&a2, "127.0.0.2".parse().unwrap());
        // The leecher gets the seeder, compact: 127.0.0.1:6881.
        let want = [b"5:peers6:".as_slice(), &[127, 0, 0, 1, 0x1a, 0xe1]].concat();
        assert!(r2.windows(want.len()).any(|w| w == want.as_slice()));
        let s = t.scrape(&[[0xaa; 20]]);
        assert!(
            s.windows(12).any(|w| w == b"completei1e1"),
            "{}",
            String::from_utf8_lossy(&s)
        );
        assert!(s.windows(14).any(|w| w == b"incompletei1ee"));
        // Bad input: a failure reason, not a panic.
        assert!(parse_announce(&q("info_hash=abc&peer_id=x&port=1")).is_err());
        let (code, body) = t.handle(
            b"GET /announce?port=1 HTTP/1.1\r\n\r\n",
            "127.0.0.1".parse().unwrap(),
        );
        assert_eq!(code, 200);
        assert!(body.starts_with(b"d14:failure reason"));
    }

    /// Issue 47: a magnet client announces `left=0` before it has the metadata. It gets the
    /// seeder in its reply (before, "seeders need no seeders" left it out), and neither it
    /// nor a seeder that has not yet shown data counts in `complete` (before, both did).
    #[test]
    fn a_left_0_announce_gets_the_seeders_and_counts_only_with_data() {
        let t = Tracker::new(Duration::from_secs(60));
        let ih = "%bb".repeat(20);
        let ann = |peer: &str, port: u16, rest: &str, ip: &str| {
            let a = parse_announce(&q(&format!(
                "info_hash={ih}&peer_id={peer}&port={port}&{rest}"
            )))
            .unwrap();
            t.announce_peers(&a, ip.parse().unwrap())
        };
        let seeder = "SSSSSSSSSSSSSSSSSSSS";
        let r = ann(seeder, 6881, "left=0&uploaded=0&event=started", "10.0.0.1");
        assert_eq!((r.complete, r.incomplete), (0, 1), "no data shown yet");
        let magnet = "MMMMMMMMMMMMMMMMMMMM";
        let r = ann(magnet, 7000, "left=0&uploaded=0&event=started", "10.0.0.2");
        let addrs: Vec<SocketAddr> = r.peers.iter().map(|p| p.1).collect();
        assert_eq!(addrs, vec!["10.0.0.1:6881".parse().unwrap()]);
        // The seeder's next announce reports bytes served: now it counts.
        let r = ann(seeder, 6881, "left=0&uploaded=5000", "10.0.0.1");
        assert_eq!((r.complete, r.incomplete), (1, 1));
        // A leecher that finishes counts (left>0 then left=0), and one that says completed.
        ann("LLLLLLLLLLLLLLLLLLLL", 7001, "left=100", "10.0.0.3");
        let r = ann("LLLLLLLLLLLLLLLLLLLL", 7001, "left=0", "10.0.0.3");
        assert_eq!((r.complete, r.incomplete), (2, 1));
        let r = ann(magnet, 7000, "left=0&event=completed", "10.0.0.2");
        assert_eq!((r.complete, r.incomplete, r.downloaded), (3, 0, 1));
        assert_eq!(t.scrape_one(&[0xbb; 20]), (3, 0, 1));
    }

    #[test]
    fn urls() {
        assert_eq!(
            parse_http_url("http://127.0.0.1:6969/announce").unwrap(),
            ("127.0.0.1".into(), 6969, "/announce".into())
        );
        assert_eq!(
            parse_http_url("http://[::1]/a?x=1").unwrap(),
            ("::1".into(), 80, "/a?x=1".into())
        );
        assert!(parse_http_url("udp://x:1").is_err());
        assert!(parse_http_url("https://x/a").is_err());
        assert_eq!(
            parse_tracker_url("https://t.example/a").unwrap(),
            (true, "t.example".into(), 443, "/a".into())
        );
        assert_eq!(
            parse_tracker_url("https://[::1]:8443").unwrap(),
            (true, "::1".into(), 8443, "/".into())
        );
        assert_eq!(
            parse_tracker_url("http://h:1/x").unwrap(),
            (false, "h".into(), 1, "/x".into())
        );
        assert!(parse_tracker_url("https://:1/a").is_err());
        assert!(parse_tracker_url("https://h:99999/a").is_err());
    }
}
