//! DP's control protocol as text: the per-run key, the authentication of each line, and
//! the commands parsed into values (no I/O here: [`crate::dp`] serves them, the fuzz
//! target `disc` feeds them anything).
//!
//! Authentication (issue 43): DP greets every control connection it accepts with
//! `DP <nonce>\r\n` (64 random bits, hex). Every line the FE sends is then
//! `<n> <mac> <command>\r\n`: `n` a counter that grows on the connection (decimal, each line
//! above the last: a line seen before is a replay), `mac` SipHash-2-4 under the run's key
//! of the nonce, `n` and the command (16 hex digits). A line on another connection, with an
//! old counter or another key is refused and counted ([`Refusal`]).
//!
//! DP's answers (`OK ...`, `ERR ...`) are signed the same way in the other direction
//! ([`Side::Answers`]: the MAC also covers the side, so a command cannot be reflected as an
//! answer), with their own counter: the FE refuses a forged or replayed answer and counts
//! it ([`refused_answers`]). The payload bytes a `FETCH` answer announces are not covered.
//!
//! The key: 16 random bytes per run, held by the BE (DP) and the FE only, in a file of mode
//! 0600 written by the BE when it starts ([`ControlKey::create_file`]) and read by the FE
//! ([`ControlKey::read_file`]); never on a command line.

use std::cell::Cell;
use std::hash::Hasher;
use std::io;
use std::net::SocketAddrV4;
use std::path::Path;

use siphasher::sip::SipHasher24;

/// Bytes of the key.
pub const KEY_LEN: usize = 16;

/// The run's key of DP's control connections.
#[derive(Clone, PartialEq, Eq)]
pub struct ControlKey([u8; KEY_LEN]);

impl std::fmt::Debug for ControlKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ControlKey(..)") // never the key itself in a log
    }
}

/// `n` bytes from the kernel's random source.
pub fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    use std::io::Read;
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b)
}

impl ControlKey {
    pub fn random() -> io::Result<ControlKey> {
        Ok(ControlKey(random_bytes()?))
    }

    pub fn from_bytes(b: [u8; KEY_LEN]) -> ControlKey {
        ControlKey(b)
    }

    /// The key as the file holds it: 32 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn from_hex(s: &str) -> io::Result<ControlKey> {
        let s = s.trim();
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "a DP key is 32 hex digits");
        if s.len() != 2 * KEY_LEN || !s.is_ascii() {
            return Err(bad());
        }
        let mut b = [0u8; KEY_LEN];
        for (i, o) in b.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(ControlKey(b))
    }

    /// A new random key written to `path` (mode 0600, replacing any file there, so a key
    /// is never reused from an earlier run).
    pub fn create_file(path: &Path) -> io::Result<ControlKey> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let key = ControlKey::random()?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| io::Error::new(e.kind(), format!("DP key {}: {e}", tmp.display())))?;
        writeln!(f, "{}", key.to_hex())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
            .map_err(|e| io::Error::new(e.kind(), format!("DP key {}: {e}", path.display())))?;
        Ok(key)
    }

    /// The key in `path`; refused if others than its owner may read it.
    pub fn read_file(path: &Path) -> io::Result<ControlKey> {
        use std::os::unix::fs::PermissionsExt;
        let named =
            |e: io::Error| io::Error::new(e.kind(), format!("DP key {}: {e}", path.display()));
        let meta = std::fs::metadata(path).map_err(named)?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(named(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "mode {:o}: readable by others (want 0600)",
                    meta.permissions().mode() & 0o777
                ),
            )));
        }
        ControlKey::from_hex(&std::fs::read_to_string(path).map_err(named)?).map_err(named)
    }

    /// The MAC of `command`, line `n` of the connection greeted with `nonce`.
    pub fn mac(&self, nonce: u64, n: u64, command: &str) -> u64 {
        self.mac_on(Side::Commands, nonce, n, command)
    }

    /// The MAC of line `n` on `side` of the connection greeted with `nonce`.
    pub fn mac_on(&self, side: Side, nonce: u64, n: u64, text: &str) -> u64 {
        let mut h = SipHasher24::new_with_key(&self.0);
        if side == Side::Answers {
            h.write(b"answer\0");
        }
        h.write(&nonce.to_le_bytes());
        h.write(&n.to_le_bytes());
        h.write(text.as_bytes());
        h.finish()
    }
}

/// Which way a signed line goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The FE's commands to DP.
    Commands,
    /// DP's answers to the FE.
    Answers,
}

/// DP answers this process's FE tiers refused (forged, replayed or unsigned).
static REFUSED_ANSWERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many DP answers the FE tiers of this process refused.
pub fn refused_answers() -> u64 {
    REFUSED_ANSWERS.load(std::sync::atomic::Ordering::Relaxed)
}

/// The text of DP's answer `line` (CRLF removed) once `answers` has checked it; a refused
/// one is counted and an error naming why.
pub fn check_answer(answers: &mut Verifier, line: &str) -> io::Result<String> {
    match answers.check(line) {
        Ok(text) => Ok(text.to_string()),
        Err(why) => {
            REFUSED_ANSWERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("DP's answer refused ({}): `{line}`", why.name()),
            ))
        }
    }
}

/// DP's greeting of a control connection.
pub fn greeting(nonce: u64) -> String {
    format!("DP {nonce:016x}\r\n")
}

/// The nonce of a greeting line (CRLF removed).
pub fn parse_greeting(line: &str) -> Option<u64> {
    let hex = line.strip_prefix("DP ")?;
    (hex.len() == 16).then_some(())?;
    u64::from_str_radix(hex, 16).ok()
}

/// The FE's end of one control connection: signs its lines. Shared by the connection's
/// writers (the request path, the ACK forwarder, the watchdog's resend).
#[derive(Debug)]
pub struct Signer {
    lines: LineKey,
    next: Cell<u64>,
}

/// One direction of one connection: the run's key, the connection's nonce, and which way
/// the lines go (so that a command echoed back is no answer).
#[derive(Debug)]
struct LineKey {
    key: ControlKey,
    nonce: u64,
    side: Side,
}

impl LineKey {
    fn mac(&self, n: u64, command: &str) -> u64 {
        self.key.mac_on(self.side, self.nonce, n, command)
    }
}

impl Signer {
    /// The FE's signer of its commands.
    pub fn new(key: ControlKey, nonce: u64) -> Signer {
        Signer::on(LineKey {
            key,
            nonce,
            side: Side::Commands,
        })
    }

    /// DP's signer of its answers.
    pub fn answers(key: ControlKey, nonce: u64) -> Signer {
        Signer::on(LineKey {
            key,
            nonce,
            side: Side::Answers,
        })
    }

    fn on(lines: LineKey) -> Signer {
        Signer {
            lines,
            next: Cell::new(1),
        }
    }

    /// `command` as a line to send: counter, MAC, command, CRLF.
    pub fn line(&self, command: &str) -> String {
        let n = self.next.get();
        self.next.set(n + 1);
        format!("{n} {:016x} {command}\r\n", self.lines.mac(n, command))
    }
}

/// The receiving end: checks each line's counter and MAC (DP: the commands; the FE: the
/// answers).
#[derive(Debug)]
pub struct Verifier {
    lines: LineKey,
    last: u64,
}

impl Verifier {
    /// DP's verifier of the FE's commands.
    pub fn new(key: ControlKey, nonce: u64) -> Verifier {
        Verifier::on(LineKey {
            key,
            nonce,
            side: Side::Commands,
        })
    }

    /// The FE's verifier of DP's answers.
    pub fn answers(key: ControlKey, nonce: u64) -> Verifier {
        Verifier::on(LineKey {
            key,
            nonce,
            side: Side::Answers,
        })
    }

    fn on(lines: LineKey) -> Verifier {
        Verifier { lines, last: 0 }
    }

    /// The command of an authenticated line (CRLF removed), or why it is refused.
    pub fn check<'a>(&mut self, line: &'a str) -> Result<&'a str, Refusal> {
        let mut parts = line.splitn(3, ' ');
        let (Some(n), Some(mac), Some(command)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(Refusal::Unauthenticated);
        };
        let n: u64 = n.parse().map_err(|_| Refusal::Unauthenticated)?;
        let mac = (mac.len() == 16)
            .then(|| u64::from_str_radix(mac, 16).ok())
            .flatten()
            .ok_or(Refusal::Unauthenticated)?;
        if mac != self.lines.mac(n, command) {
            return Err(Refusal::Unauthenticated);
        }
        if n <= self.last {
            return Err(Refusal::Replay);
        }
        self.last = n;
        Ok(command)
    }
}

/// Why DP refused a connection, a line or a start (each counted: [`crate::dp::Store::refusals`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A control connection from an address DP was not told of.
    Peer,
    /// A line without a valid MAC under the run's key.
    Unauthenticated,
    /// An authenticated line whose counter is not above the last one's.
    Replay,
    /// A line that does not parse.
    BadLine,
    /// A payload id DP does not hold (guessed, or handed out already).
    UnknownPayload,
    /// A payload held longer than [`crate::dp::JOB_TTL`].
    Expired,
    /// A SEND or start for another flow than the one the connection's HELLO named (or
    /// with no HELLO).
    OtherFlow,
    /// A SEND or start outside the connection's sequence window.
    Window,
    /// A connection to the BE's HTTP port from an address that is not one of its
    /// upstream tiers (with DISC on, only they may offer the shortcut, or reach the BE).
    Upstream,
}

impl Refusal {
    pub const ALL: [Refusal; 9] = [
        Refusal::Peer,
        Refusal::Unauthenticated,
        Refusal::Replay,
        Refusal::BadLine,
        Refusal::UnknownPayload,
        Refusal::Expired,
        Refusal::OtherFlow,
        Refusal::Window,
        Refusal::Upstream,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Refusal::Peer => "peer",
            Refusal::Unauthenticated => "unauthenticated",
            Refusal::Replay => "replay",
            Refusal::BadLine => "bad line",
            Refusal::UnknownPayload => "unknown payload",
            Refusal::Expired => "expired",
            Refusal::OtherFlow => "other flow",
            Refusal::Window => "sequence window",
            Refusal::Upstream => "not an upstream tier",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// HELLO's fields: the client connection a control connection serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub flow: (SocketAddrV4, SocketAddrV4),
    pub wscale: u8,
    pub fe_end: Option<crate::repair::FeEnd>,
}

/// SEND's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendFields {
    pub id: u64,
    pub flow: crate::sender::Flow,
    /// The client's window in bytes (0: unknown).
    pub client_window: usize,
    pub wscale: u8,
}

/// One authenticated command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// `HELLO` alone, or with the flow.
    Hello(Option<Hello>),
    Check(u64),
    Fetch(u64),
    Send(SendFields),
    /// `ACK <ack> <window bytes>`.
    Ack {
        ack: u32,
        window: usize,
    },
}

/// Parses a command (the text after the counter and the MAC).
pub fn parse_command(text: &str) -> Result<Command, Refusal> {
    let mut w = text.split_ascii_whitespace();
    let id = |w: Option<&str>| {
        w.and_then(|x| x.parse::<u64>().ok())
            .ok_or(Refusal::BadLine)
    };
    let command = match w.next() {
        Some("HELLO") => Command::Hello(parse_hello(&mut w)?),
        Some("CHECK") => Command::Check(id(w.next())?),
        Some("FETCH") => Command::Fetch(id(w.next())?),
        Some("SEND") => {
            let id = id(w.next())?;
            let (flow, client_window, wscale) = parse_send(&mut w).ok_or(Refusal::BadLine)?;
            Command::Send(SendFields {
                id,
                flow,
                client_window,
                wscale,
            })
        }
        Some("ACK") => {
            let ack = w.next().and_then(|x| x.parse::<u32>().ok());
            let window = w.next().map_or(Some(0), |x| x.parse::<usize>().ok());
            match (ack, window) {
                (Some(ack), Some(window)) => Command::Ack { ack, window },
                _ => return Err(Refusal::BadLine),
            }
        }
        _ => return Err(Refusal::BadLine),
    };
    if w.next().is_some() {
        return Err(Refusal::BadLine);
    }
    Ok(command)
}

/// `[<client ip:port> <fe ip:port> <wscale> [<FE's end>]]`.
fn parse_hello<'a>(w: &mut impl Iterator<Item = &'a str>) -> Result<Option<Hello>, Refusal> {
    let Some(client) = w.next() else {
        return Ok(None);
    };
    let bad = |_| Refusal::BadLine;
    let client: SocketAddrV4 = client.parse().map_err(bad)?;
    let fe: SocketAddrV4 = w.next().ok_or(Refusal::BadLine)?.parse().map_err(bad)?;
    let wscale = w
        .next()
        .and_then(|x| x.parse::<u8>().ok())
        .filter(|s| *s <= 14)
        .ok_or(Refusal::BadLine)?;
    let mut rest = w.peekable();
    let fe_end = match rest.peek() {
        None => None,
        Some(_) => Some(crate::repair::FeEnd::parse(&mut rest).ok_or(Refusal::BadLine)?),
    };
    if rest.next().is_some() {
        return Err(Refusal::BadLine);
    }
    Ok(Some(Hello {
        flow: (client, fe),
        wscale,
        fe_end,
    }))
}

/// SEND's fields after the id; the last two (the client's window in bytes, 0 = unknown;
/// its window scale, for the ACKs the tap reads) are optional.
pub fn parse_send<'a>(
    w: &mut impl Iterator<Item = &'a str>,
) -> Option<(crate::sender::Flow, usize, u8)> {
    let client: SocketAddrV4 = w.next()?.parse().ok()?;
    let fe: SocketAddrV4 = w.next()?.parse().ok()?;
    let seq: u32 = w.next()?.parse().ok()?;
    let ack: u32 = w.next()?.parse().ok()?;
    let window: u16 = w.next()?.parse().ok()?;
    let client_window = match w.next() {
        None => 0,
        Some(x) => x.parse::<u32>().ok()? as usize,
    };
    let wscale = match w.next() {
        None => 0,
        Some(x) => x.parse::<u8>().ok().filter(|s| *s <= 14)?,
    };
    Some((
        crate::sender::Flow {
            fe,
            client,
            seq,
            ack,
            window,
            mss: crate::sender::SEND_MSS,
        },
        client_window,
        wscale,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ControlKey {
        ControlKey::from_bytes(*b"0123456789abcdef")
    }

    #[test]
    fn signed_lines_pass_once_and_in_order() {
        let s = Signer::new(key(), 7);
        let mut v = Verifier::new(key(), 7);
        let a = s.line("CHECK 5");
        let b = s.line("FETCH 6");
        let strip = |l: &str| l.trim_end_matches("\r\n").to_string();
        assert_eq!(v.check(&strip(&b)), Ok("FETCH 6"));
        // An older line after a newer one, and the same line again: replays.
        assert_eq!(v.check(&strip(&a)), Err(Refusal::Replay));
        assert_eq!(v.check(&strip(&b)), Err(Refusal::Replay));
        // Another nonce (another connection), another key, a changed command.
        let mut other = Verifier::new(key(), 8);
        assert_eq!(
            other.check(&strip(&s.line("X"))),
            Err(Refusal::Unauthenticated)
        );
        let forged = strip(&s.line("FETCH 1")).replace("FETCH 1", "FETCH 2");
        assert_eq!(v.check(&forged), Err(Refusal::Unauthenticated));
        let mut wrong = Verifier::new(ControlKey::from_bytes([9; 16]), 7);
        assert_eq!(
            wrong.check(&strip(&s.line("HELLO"))),
            Err(Refusal::Unauthenticated)
        );
        assert_eq!(v.check("FETCH 1"), Err(Refusal::Unauthenticated));
    }

    #[test]
    fn keys_round_trip_through_a_private_file() {
        let dir = iolab_sys::testing::tempdir("disc-key").unwrap();
        let p = dir.path().join("dp.key");
        let k = ControlKey::create_file(&p).unwrap();
        assert_eq!(ControlKey::read_file(&p).unwrap(), k);
        let k2 = ControlKey::create_file(&p).unwrap();
        assert_ne!(k, k2, "a new key each time");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = ControlKey::read_file(&p).unwrap_err().to_string();
        assert!(e.contains("readable by others"), "{e}");
        assert!(ControlKey::from_hex("zz").is_err());
    }

    #[test]
    fn commands_parse_and_junk_is_a_bad_line() {
        assert_eq!(parse_command("CHECK 12"), Ok(Command::Check(12)));
        assert_eq!(parse_command("HELLO"), Ok(Command::Hello(None)));
        let h = parse_command("HELLO 10.0.0.1:5000 10.0.0.2:80 7").unwrap();
        assert!(matches!(
            h,
            Command::Hello(Some(Hello {
                wscale: 7,
                fe_end: None,
                ..
            }))
        ));
        let s = parse_command("SEND 9 10.0.0.1:5000 10.0.0.2:80 1 2 3 4 5").unwrap();
        assert!(matches!(
            s,
            Command::Send(SendFields {
                id: 9,
                client_window: 4,
                wscale: 5,
                ..
            })
        ));
        assert_eq!(
            parse_command("ACK 5 100"),
            Ok(Command::Ack {
                ack: 5,
                window: 100
            })
        );
        for junk in [
            "",
            "CHECK",
            "CHECK x",
            "CHECK 1 2",
            "SEND 1 10.0.0.1:5000",
            "SEND 1 10.0.0.1:5000 10.0.0.2:80 1 2 3 4 15",
            "HELLO 10.0.0.1:5000 10.0.0.2:80 15",
            "HELLO 10.0.0.1:5000 10.0.0.2:80 7 - 10",
            "ACK x",
            "NOPE",
        ] {
            assert_eq!(parse_command(junk), Err(Refusal::BadLine), "{junk:?}");
        }
        assert_eq!(parse_greeting(greeting(0xabc).trim_end()), Some(0xabc));
        assert_eq!(parse_greeting("DP 12"), None);
    }
}
