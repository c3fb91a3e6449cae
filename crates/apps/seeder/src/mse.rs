//! MSE/PE: Message Stream Encryption (the "protocol encryption" of Azureus/Vuze, libtorrent,
//! Transmission, WebTorrent; no BEP number), as two pure state machines fed bytes: a
//! [`Responder`] (we accept) and an [`Initiator`] (we dial). Neither touches a socket, so the
//! fuzz target drives the responder directly and the seeder drives both from its peer tasks.
//!
//! The exchange (A dials B):
//! 1. A→B `Ya, PadA`; 2. B→A `Yb, PadB`: 768-bit Diffie-Hellman keys (prime [`P`], g = 2),
//!    96 bytes big-endian each, then 0–512 random bytes.
//! 3. A→B `HASH("req1", S)`, `HASH("req2", SKEY) xor HASH("req3", S)`,
//!    `ENCRYPT(VC, crypto_provide, len(PadC), PadC, len(IA)), ENCRYPT(IA)`.
//! 4. B→A `ENCRYPT(VC, crypto_select, len(PadD), PadD)`, then the payload stream.
//!
//! S is the DH secret, SKEY the torrent's info hash (which lets B serve several torrents:
//! it finds the one whose req2 hash matches), HASH SHA-1. ENCRYPT is RC4 keyed by
//! `HASH("keyA", S, SKEY)` from A and `HASH("keyB", S, SKEY)` from B, the first 1,024 bytes
//! of each keystream discarded. VC is 8 zero bytes; `crypto_provide`/`crypto_select` bit
//! 0x01 is plaintext, 0x02 RC4, and what was selected carries the payload after step 4 (IA,
//! the initial payload, is always under RC4).
//!
//! Bounds (what a peer can make us hold): a responder buffers at most 96 + 512 + 20 bytes
//! while it looks for req1 (the spec's sync bound), then 20 + 14 + 512 + 2 + `len(IA)`
//! (≤ 65,535) bytes; an initiator at most 96 + 512 + 8 while it looks for the encrypted VC,
//! then 14 + 512. Anything beyond is an error, as are keys out of range (0, 1, ≥ P−1), a
//! wrong VC, pads over 512 and no crypto method in common. The deadline of each phase is
//! the caller's (the seeder gives the whole exchange the handshake timeout).

use std::collections::HashMap;
use std::sync::Arc;

use num_bigint::BigUint;
use rc4::consts::U20;
use rc4::{KeyInit, Rc4, StreamCipher};
use sha1::{Digest, Sha1};

/// Bytes of a DH public key (768 bits).
pub const KEY_LEN: usize = 96;
/// The longest pad (PadA–PadD) the spec allows.
pub const MAX_PAD: usize = 512;
/// `crypto_provide` / `crypto_select` bit: plaintext after the handshake.
pub const CRYPTO_PLAINTEXT: u32 = 0x01;
/// `crypto_provide` / `crypto_select` bit: RC4 after the handshake.
pub const CRYPTO_RC4: u32 = 0x02;

/// The 768-bit prime of MSE (the Oakley group 1 prime).
const P_HEX: &[u8] = b"FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A08798E3404DDEF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A63A36210000000000090563";
/// The most a responder or initiator holds between two feeds (a waiting step's bytes: at
/// most an IA of 65,535 bytes less one).
pub const MAX_BUFFERED: usize = u16::MAX as usize;
/// Bytes of the keystream dropped before use (RC4's weak start).
const DISCARD: usize = 1024;
/// The verification constant.
const VC: [u8; 8] = [0; 8];

/// What the seeder does with encryption (`--encryption`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Accept plaintext and MSE peers (as the major clients do by default); in MSE, choose
    /// RC4 when the peer offers it; dial out with MSE offering both.
    #[default]
    Prefer,
    /// Only MSE with RC4: plaintext handshakes and plaintext-only offers are refused.
    Require,
    /// Plaintext only: MSE openings are closed (and counted).
    Off,
}

impl Policy {
    /// The `--encryption` value.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Prefer => "prefer",
            Policy::Require => "require",
            Policy::Off => "off",
        }
    }

    /// Parses an `--encryption` value.
    pub fn parse(s: &str) -> Result<Policy, String> {
        match s {
            "prefer" => Ok(Policy::Prefer),
            "require" => Ok(Policy::Require),
            "off" => Ok(Policy::Off),
            _ => Err(format!(
                "encryption policy {s:?}: expected prefer, require or off"
            )),
        }
    }

    /// The methods we offer when we dial.
    pub fn provide(self) -> u32 {
        match self {
            Policy::Require => CRYPTO_RC4,
            _ => CRYPTO_RC4 | CRYPTO_PLAINTEXT,
        }
    }

    /// The method we choose from a peer's `crypto_provide`, if any.
    fn select(self, provide: u32) -> Option<u32> {
        if provide & CRYPTO_RC4 != 0 && self != Policy::Off {
            Some(CRYPTO_RC4)
        } else if provide & CRYPTO_PLAINTEXT != 0 && self != Policy::Require {
            Some(CRYPTO_PLAINTEXT)
        } else {
            None
        }
    }
}

/// Why an exchange failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MseError {
    /// The peer's bytes do not follow the protocol (the reason says where).
    Protocol(String),
    /// The req2 hash matched none of our torrents.
    UnknownTorrent,
}

impl std::fmt::Display for MseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MseError::Protocol(why) => write!(f, "MSE: {why}"),
            MseError::UnknownTorrent => write!(f, "MSE: none of our torrents"),
        }
    }
}

fn bad(why: impl Into<String>) -> MseError {
    MseError::Protocol(why.into())
}

/// RC4 in both directions of an established encrypted stream.
pub struct Rc4Pair {
    send: Keystream,
    recv: Keystream,
}

impl Rc4Pair {
    /// Encrypts outgoing bytes in place.
    pub fn encrypt(&mut self, data: &mut [u8]) -> Result<(), CipherFailed> {
        self.send.apply(data)
    }

    /// Decrypts incoming bytes in place.
    pub fn decrypt(&mut self, data: &mut [u8]) -> Result<(), CipherFailed> {
        self.recv.apply(data)
    }
}

impl std::fmt::Debug for Rc4Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Rc4Pair")
    }
}

/// OpenSSL refused to run the cipher (its state is then unknown: the stream must end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CipherFailed;

impl std::fmt::Display for CipherFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RC4 failed in OpenSSL")
    }
}

impl std::error::Error for CipherFailed {}

impl From<CipherFailed> for MseError {
    fn from(e: CipherFailed) -> MseError {
        bad(e.to_string())
    }
}

/// Which RC4 runs: OpenSSL's (its assembly: 2.6x the rc4 crate's bytes per second on this
/// project's machine, which is the seeder's CPU under MSE), or the rc4 crate's when
/// OpenSSL 3's legacy provider, where RC4 lives, cannot be loaded (or `IOLAB_RC4=crate`).
pub fn rc4_engine() -> &'static str {
    match openssl_rc4() {
        Some(_) => "OpenSSL (legacy provider)",
        None => "the rc4 crate",
    }
}

/// OpenSSL's RC4, fetched once (the legacy provider loaded for the whole process).
fn openssl_rc4() -> Option<&'static openssl::cipher::Cipher> {
    static RC4: std::sync::OnceLock<Option<openssl::cipher::Cipher>> = std::sync::OnceLock::new();
    RC4.get_or_init(|| {
        if std::env::var_os("IOLAB_RC4").is_some_and(|v| v == "crate") {
            return None;
        }
        // Kept loaded: ciphers fetched from it are used until the process ends.
        std::mem::forget(openssl::provider::Provider::try_load(None, "legacy", true).ok()?);
        openssl::cipher::Cipher::fetch(None, "RC4", None).ok()
    })
    .as_ref()
}

/// One direction's keystream, its first [`DISCARD`] bytes dropped.
enum Keystream {
    Openssl(openssl::cipher_ctx::CipherCtx),
    Crate(Box<Rc4<U20>>),
}

impl Keystream {
    fn new(key: &[u8; 20]) -> Keystream {
        let openssl = || {
            let mut ctx = openssl::cipher_ctx::CipherCtx::new().ok()?;
            ctx.encrypt_init(Some(openssl_rc4()?), None, None).ok()?;
            ctx.set_key_length(key.len()).ok()?;
            ctx.encrypt_init(None, Some(key), None).ok()?;
            Some(ctx)
        };
        let mut k = match openssl() {
            Some(ctx) => Keystream::Openssl(ctx),
            None => Keystream::Crate(Box::new(Rc4::<U20>::new(key.into()))),
        };
        let mut drop = [0u8; DISCARD];
        if k.apply(&mut drop).is_err() {
            k = Keystream::Crate(Box::new(Rc4::<U20>::new(key.into())));
            let _ = k.apply(&mut drop);
        }
        k
    }

    fn apply(&mut self, data: &mut [u8]) -> Result<(), CipherFailed> {
        match self {
            Keystream::Openssl(ctx) => {
                // EVP takes an int length; RC4 in place is allowed (a stream cipher).
                for chunk in data.chunks_mut(1 << 30) {
                    let n = chunk.len();
                    match ctx.cipher_update_inplace(chunk, n) {
                        Ok(m) if m == n => {}
                        _ => return Err(CipherFailed),
                    }
                }
                Ok(())
            }
            Keystream::Crate(c) => {
                c.apply_keystream(data);
                Ok(())
            }
        }
    }
}

/// A finished exchange.
#[derive(Debug)]
pub struct Established {
    /// Which of the torrents offered the peer asked for (a responder's; 0 for an initiator).
    pub torrent: usize,
    /// RC4 for the payload stream, or `None` for plaintext.
    pub rc4: Option<Rc4Pair>,
    /// Payload bytes already received, decrypted: a responder's IA, then whatever followed
    /// it; an initiator's bytes after PadD.
    pub payload: Vec<u8>,
}

/// What feeding bytes produced: bytes to send now, and the result once the exchange is done.
#[derive(Debug, Default)]
pub struct Progress {
    pub send: Vec<u8>,
    pub done: Option<Established>,
}

fn sha1(parts: &[&[u8]]) -> [u8; 20] {
    let mut h = Sha1::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

fn rc4(key: &[u8; 20]) -> Keystream {
    Keystream::new(key)
}

fn prime() -> BigUint {
    // The constant is valid hex: parsing cannot fail.
    BigUint::parse_bytes(P_HEX, 16).unwrap_or_default()
}

/// `n` as exactly 96 big-endian bytes (n < P, so it fits).
fn to_key_bytes(n: &BigUint) -> [u8; KEY_LEN] {
    let b = n.to_bytes_be();
    let mut out = [0u8; KEY_LEN];
    let k = b.len().min(KEY_LEN);
    out[KEY_LEN - k..].copy_from_slice(&b[b.len() - k..]);
    out
}

/// One side's DH key pair.
struct Dh {
    private: BigUint,
    public: [u8; KEY_LEN],
}

impl Dh {
    fn new() -> Dh {
        // 160 random bits, as libtorrent and Transmission use.
        let private = BigUint::from_bytes_be(&rand::random::<[u8; 20]>());
        let public = to_key_bytes(&BigUint::from(2u32).modpow(&private, &prime()));
        Dh { private, public }
    }

    /// The shared secret S from the peer's public key; keys 0, 1 and ≥ P−1 are refused
    /// (they fix S whatever our key).
    fn secret(&self, theirs: &[u8]) -> Result<[u8; KEY_LEN], MseError> {
        let p = prime();
        let y = BigUint::from_bytes_be(theirs);
        if y <= BigUint::from(1u32) || y >= &p - 1u32 {
            return Err(bad("DH public key out of range"));
        }
        Ok(to_key_bytes(&y.modpow(&self.private, &p)))
    }

    /// Our public key and a random pad of 0..=512 bytes.
    fn opening(&self) -> Vec<u8> {
        let mut out = self.public.to_vec();
        let pad = rand::random_range(0..=MAX_PAD);
        out.extend((0..pad).map(|_| rand::random::<u8>()));
        out
    }
}

fn u16_at(b: &[u8], i: usize) -> usize {
    u16::from_be_bytes([b[i], b[i + 1]]) as usize
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RStep {
    Key,
    Req1,
    Req23,
    Header,
    PadC(usize),
    Ia(usize),
    Done,
}

/// The SKEYs (info hashes) a responder knows, by `HASH("req2", SKEY)`: step 3's
/// `HASH("req2", SKEY) xor HASH("req3", S)` is undone with req3 and looked up, one hash and
/// one map lookup whatever the number of torrents.
#[derive(Debug, Clone, Default)]
pub struct Skeys {
    by_req2: HashMap<[u8; 20], (usize, [u8; 20])>,
}

impl Skeys {
    /// The map of `info_hashes`, each named by its index; a repeated hash keeps its first
    /// index.
    pub fn new(info_hashes: &[[u8; 20]]) -> Skeys {
        let mut by_req2 = HashMap::with_capacity(info_hashes.len());
        for (i, ih) in info_hashes.iter().enumerate() {
            by_req2.entry(sha1(&[b"req2", ih])).or_insert((i, *ih));
        }
        Skeys { by_req2 }
    }

    /// Adds `info_hash` as torrent `index` (a hash already there keeps its index).
    pub fn insert(&mut self, index: usize, info_hash: [u8; 20]) {
        self.by_req2
            .entry(sha1(&[b"req2", &info_hash]))
            .or_insert((index, info_hash));
    }

    /// The torrent (index, SKEY) whose req2 hash is `obfuscated` xor `req3`.
    pub fn find(&self, obfuscated: &[u8], req3: &[u8; 20]) -> Option<(usize, [u8; 20])> {
        let mut req2 = [0u8; 20];
        for (i, b) in req2.iter_mut().enumerate() {
            *b = obfuscated.get(i)? ^ req3[i];
        }
        self.by_req2.get(&req2).copied()
    }

    pub fn len(&self) -> usize {
        self.by_req2.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_req2.is_empty()
    }
}

/// Our side when a peer dials us (B in the spec).
pub struct Responder {
    policy: Policy,
    skeys: Arc<Skeys>,
    dh: Dh,
    step: RStep,
    /// Received bytes not yet consumed (bounded as the module says).
    buf: Vec<u8>,
    secret: [u8; KEY_LEN],
    torrent: usize,
    rc4: Option<Rc4Pair>,
    provide: u32,
}

impl Responder {
    /// A responder for the torrents `info_hashes` (SKEYs) under `policy`.
    pub fn new(policy: Policy, info_hashes: Vec<[u8; 20]>) -> Responder {
        Responder::with_skeys(policy, Arc::new(Skeys::new(&info_hashes)))
    }

    /// A responder for the torrents of `skeys` (shared by every connection) under `policy`.
    pub fn with_skeys(policy: Policy, skeys: Arc<Skeys>) -> Responder {
        Responder {
            policy,
            skeys,
            dh: Dh::new(),
            step: RStep::Key,
            buf: Vec::new(),
            secret: [0; KEY_LEN],
            torrent: 0,
            rc4: None,
            provide: 0,
        }
    }

    /// One step if its bytes are there: `Some(bytes consumed)`, `None` to wait for more.
    fn take_step(&mut self, out: &mut Progress) -> Result<Option<usize>, MseError> {
        let b = &mut self.buf;
        match self.step {
            RStep::Key if b.len() >= KEY_LEN => {
                self.secret = self.dh.secret(&b[..KEY_LEN])?;
                out.send.extend(self.dh.opening());
                self.step = RStep::Req1;
                Ok(Some(KEY_LEN))
            }
            RStep::Req1 => {
                let req1 = sha1(&[b"req1", &self.secret]);
                if let Some(i) = find(&b[..b.len().min(MAX_PAD + 20)], &req1) {
                    self.step = RStep::Req23;
                    Ok(Some(i + 20))
                } else if b.len() >= MAX_PAD + 20 {
                    Err(bad("no req1 hash within 512 bytes of padding"))
                } else {
                    Ok(None)
                }
            }
            RStep::Req23 if b.len() >= 20 => {
                let s = &self.secret;
                let req3 = sha1(&[b"req3", s]);
                let (torrent, skey) = self
                    .skeys
                    .find(&b[..20], &req3)
                    .ok_or(MseError::UnknownTorrent)?;
                self.torrent = torrent;
                self.rc4 = Some(Rc4Pair {
                    send: rc4(&sha1(&[b"keyB", s, &skey])),
                    recv: rc4(&sha1(&[b"keyA", s, &skey])),
                });
                self.step = RStep::Header;
                Ok(Some(20))
            }
            RStep::Header if b.len() >= 14 => {
                let rc4 = self.rc4.as_mut().ok_or_else(|| bad("no keys"))?;
                rc4.decrypt(&mut b[..14])?;
                if b[..8] != VC {
                    return Err(bad("wrong verification constant"));
                }
                self.provide = u32_at(b, 8);
                let pad = u16_at(b, 12);
                if pad > MAX_PAD {
                    return Err(bad(format!("PadC of {pad} bytes (at most 512)")));
                }
                self.step = RStep::PadC(pad);
                Ok(Some(14))
            }
            RStep::PadC(n) if b.len() >= n + 2 => {
                let rc4 = self.rc4.as_mut().ok_or_else(|| bad("no keys"))?;
                rc4.decrypt(&mut b[..n + 2])?;
                self.step = RStep::Ia(u16_at(b, n));
                Ok(Some(n + 2))
            }
            RStep::Ia(n) if b.len() >= n => {
                let select = self.policy.select(self.provide).ok_or_else(|| {
                    bad(format!(
                        "crypto_provide {:#x}: nothing in common with policy {}",
                        self.provide,
                        self.policy.name()
                    ))
                })?;
                let mut rc4 = self.rc4.take().ok_or_else(|| bad("no keys"))?;
                rc4.decrypt(&mut b[..n])?;
                let mut payload = std::mem::take(b);
                if select == CRYPTO_RC4 {
                    rc4.decrypt(&mut payload[n..])?;
                }
                // Step 4: VC, crypto_select, len(PadD) = 0.
                let mut answer = VC.to_vec();
                answer.extend_from_slice(&select.to_be_bytes());
                answer.extend_from_slice(&0u16.to_be_bytes());
                rc4.encrypt(&mut answer)?;
                out.send.extend(answer);
                self.step = RStep::Done;
                out.done = Some(Established {
                    torrent: self.torrent,
                    rc4: (select == CRYPTO_RC4).then_some(rc4),
                    payload,
                });
                Ok(Some(0))
            }
            _ => Ok(None),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IStep {
    Key,
    SyncVc,
    Header,
    PadD(u32, usize),
    Done,
}

/// Our side when we dial (A in the spec).
pub struct Initiator {
    info_hash: [u8; 20],
    provide: u32,
    /// The initial payload (our BitTorrent handshake), sent under RC4 in step 3.
    ia: Vec<u8>,
    dh: Dh,
    step: IStep,
    buf: Vec<u8>,
    rc4: Option<Rc4Pair>,
    /// VC as the responder's keystream encrypts it: what step 4 starts with.
    vc_sealed: [u8; 8],
}

impl Initiator {
    /// An initiator for `info_hash` offering `provide`, with `ia` as the initial payload;
    /// returns it and its opening (Ya, PadA) to send.
    pub fn new(info_hash: [u8; 20], provide: u32, ia: Vec<u8>) -> (Initiator, Vec<u8>) {
        let dh = Dh::new();
        let opening = dh.opening();
        let me = Initiator {
            info_hash,
            provide,
            ia,
            dh,
            step: IStep::Key,
            buf: Vec::new(),
            rc4: None,
            vc_sealed: [0; 8],
        };
        (me, opening)
    }

    /// One step if its bytes are there: `Some(bytes consumed)`, `None` to wait for more.
    fn take_step(&mut self, out: &mut Progress) -> Result<Option<usize>, MseError> {
        let b = &mut self.buf;
        match self.step {
            IStep::Key if b.len() >= KEY_LEN => {
                let s = self.dh.secret(&b[..KEY_LEN])?;
                let skey = self.info_hash;
                let mut keys = Rc4Pair {
                    send: rc4(&sha1(&[b"keyA", &s, &skey])),
                    recv: rc4(&sha1(&[b"keyB", &s, &skey])),
                };
                let mut vc = VC;
                rc4(&sha1(&[b"keyB", &s, &skey])).apply(&mut vc)?;
                self.vc_sealed = vc;
                out.send.extend_from_slice(&sha1(&[b"req1", &s]));
                let req2 = sha1(&[b"req2", &skey]);
                let req3 = sha1(&[b"req3", &s]);
                out.send.extend((0..20).map(|i| req2[i] ^ req3[i]));
                let mut sealed = VC.to_vec();
                sealed.extend_from_slice(&self.provide.to_be_bytes());
                sealed.extend_from_slice(&0u16.to_be_bytes()); // len(PadC)
                sealed.extend_from_slice(&(self.ia.len() as u16).to_be_bytes());
                sealed.extend_from_slice(&self.ia);
                keys.encrypt(&mut sealed)?;
                out.send.extend(sealed);
                self.rc4 = Some(keys);
                self.step = IStep::SyncVc;
                Ok(Some(KEY_LEN))
            }
            IStep::SyncVc => {
                if let Some(i) = find(&b[..b.len().min(MAX_PAD + 8)], &self.vc_sealed) {
                    self.step = IStep::Header;
                    Ok(Some(i))
                } else if b.len() >= MAX_PAD + 8 {
                    Err(bad("no verification constant within 512 bytes of padding"))
                } else {
                    Ok(None)
                }
            }
            IStep::Header if b.len() >= 14 => {
                let rc4 = self.rc4.as_mut().ok_or_else(|| bad("no keys"))?;
                rc4.decrypt(&mut b[..14])?;
                let select = u32_at(b, 8);
                if select != CRYPTO_RC4 && select != CRYPTO_PLAINTEXT || select & self.provide == 0
                {
                    return Err(bad(format!("crypto_select {select:#x} not offered")));
                }
                let pad = u16_at(b, 12);
                if pad > MAX_PAD {
                    return Err(bad(format!("PadD of {pad} bytes (at most 512)")));
                }
                self.step = IStep::PadD(select, pad);
                Ok(Some(14))
            }
            IStep::PadD(select, n) if b.len() >= n => {
                let mut rc4 = self.rc4.take().ok_or_else(|| bad("no keys"))?;
                rc4.decrypt(&mut b[..n])?;
                let mut payload = b.split_off(n);
                if select == CRYPTO_RC4 {
                    rc4.decrypt(&mut payload)?;
                }
                self.step = IStep::Done;
                out.done = Some(Established {
                    torrent: 0,
                    rc4: (select == CRYPTO_RC4).then_some(rc4),
                    payload,
                });
                Ok(Some(n))
            }
            _ => Ok(None),
        }
    }
}

/// Either side of the exchange, fed the bytes received.
pub trait Exchange {
    /// The received bytes not yet consumed.
    fn input(&mut self) -> &mut Vec<u8>;
    /// Whether the exchange has ended.
    fn finished(&self) -> bool;
    /// One step if its bytes are there: `Some(bytes consumed)`, `None` to wait for more.
    fn advance(&mut self, out: &mut Progress) -> Result<Option<usize>, MseError>;

    /// Received bytes held, waiting for the rest of a step (≤ [`MAX_BUFFERED`]).
    fn buffered(&mut self) -> usize {
        self.input().len()
    }

    /// Feeds received bytes; returns what to send and, at the end, the established stream.
    fn feed(&mut self, data: &[u8]) -> Result<Progress, MseError> {
        if self.finished() {
            return Err(bad("fed after the end"));
        }
        self.input().extend_from_slice(data);
        let mut out = Progress::default();
        while let Some(consumed) = self.advance(&mut out)? {
            self.input().drain(..consumed);
            if out.done.is_some() {
                break;
            }
        }
        Ok(out)
    }
}

impl Exchange for Responder {
    fn input(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }
    fn finished(&self) -> bool {
        self.step == RStep::Done
    }
    fn advance(&mut self, out: &mut Progress) -> Result<Option<usize>, MseError> {
        self.take_step(out)
    }
}

impl Exchange for Initiator {
    fn input(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }
    fn finished(&self) -> bool {
        self.step == IStep::Done
    }
    fn advance(&mut self, out: &mut Progress) -> Result<Option<usize>, MseError> {
        self.take_step(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs an initiator against a responder, bytes delivered in `chunk`-sized pieces.
    fn pair(
        policy: Policy,
        provide: u32,
        chunk: usize,
    ) -> Result<(Established, Established), MseError> {
        let ih = [7u8; 20];
        let mut r = Responder::new(policy, vec![[1u8; 20], ih]);
        let (mut i, mut to_r) = Initiator::new(ih, provide, b"hello IA".to_vec());
        let (mut got_r, mut got_i) = (None, None);
        for _ in 0..10_000 {
            let mut to_i = Vec::new();
            for c in to_r.chunks(chunk) {
                let p = r.feed(c)?;
                to_i.extend(p.send);
                if p.done.is_some() {
                    got_r = p.done;
                }
            }
            to_r = Vec::new();
            for c in to_i.chunks(chunk) {
                let p = i.feed(c)?;
                to_r.extend(p.send);
                if p.done.is_some() {
                    got_i = p.done;
                }
            }
            if got_r.is_some() && got_i.is_some() {
                break;
            }
        }
        Ok((got_r.unwrap(), got_i.unwrap()))
    }

    /// OpenSSL's RC4 (when its legacy provider loads here) gives the rc4 crate's keystream,
    /// after the same 1,024 bytes dropped, over lengths that cross its internal blocks.
    #[test]
    fn openssl_and_the_rc4_crate_give_one_keystream() {
        let key = sha1(&[b"keyA", b"a secret"]);
        let mut ours = Keystream::new(&key);
        if !matches!(ours, Keystream::Openssl(_)) {
            eprintln!(
                "OpenSSL's legacy provider is not loadable here: {}",
                rc4_engine()
            );
            return;
        }
        let mut reference = Rc4::<U20>::new((&key).into());
        reference.apply_keystream(&mut [0u8; DISCARD]);
        for len in [1usize, 15, 16, 17, 4096, 65_537] {
            let data: Vec<u8> = (0..len).map(|i| (i * 31) as u8).collect();
            let (mut a, mut b) = (data.clone(), data.clone());
            ours.apply(&mut a).unwrap();
            reference.apply_keystream(&mut b);
            assert!(
                a == b && a != data,
                "keystreams differ at a {len}-byte step"
            );
        }
    }

    #[test]
    fn the_prime_has_768_bits() {
        assert_eq!(prime().bits(), 768);
    }

    #[test]
    fn both_sides_agree_on_rc4_and_on_plaintext() {
        for chunk in [1, 7, 4096] {
            let (mut r, mut i) =
                pair(Policy::Prefer, CRYPTO_RC4 | CRYPTO_PLAINTEXT, chunk).unwrap();
            assert_eq!(r.torrent, 1);
            assert_eq!(r.payload, b"hello IA");
            let (mut a, mut b) = (r.rc4.take().unwrap(), i.rc4.take().unwrap());
            let mut m = b"piece data".to_vec();
            b.encrypt(&mut m).unwrap();
            assert_ne!(m, b"piece data");
            a.decrypt(&mut m).unwrap();
            assert_eq!(m, b"piece data");
            a.encrypt(&mut m).unwrap();
            b.decrypt(&mut m).unwrap();
            assert_eq!(m, b"piece data");
        }
        let (r, i) = pair(Policy::Off, CRYPTO_RC4 | CRYPTO_PLAINTEXT, 50).unwrap();
        assert!(r.rc4.is_none() && i.rc4.is_none());
        assert_eq!(r.payload, b"hello IA");
    }

    #[test]
    fn policies_refuse_what_they_must() {
        assert!(pair(Policy::Require, CRYPTO_PLAINTEXT, 64).is_err());
        assert!(pair(Policy::Off, CRYPTO_RC4, 64).is_err());
        assert!(pair(Policy::Require, CRYPTO_RC4, 64).is_ok());
    }

    #[test]
    fn an_unknown_torrent_and_garbage_are_errors_within_bounds() {
        let mut r = Responder::new(Policy::Prefer, vec![[9u8; 20]]);
        let (mut i, open) = Initiator::new([7u8; 20], CRYPTO_RC4, Vec::new());
        let p = r.feed(&open).unwrap();
        let p3 = i.feed(&p.send).unwrap();
        assert_eq!(r.feed(&p3.send).unwrap_err(), MseError::UnknownTorrent);
        // A key, then 532 bytes without the req1 hash.
        let mut r = Responder::new(Policy::Prefer, vec![[9u8; 20]]);
        let mut junk = Dh::new().public.to_vec();
        junk.extend(vec![0x55; MAX_PAD + 19]);
        assert!(r.feed(&junk).unwrap().done.is_none());
        assert!(r.feed(&[0x55]).is_err(), "the sync search is bounded");
        // Keys that fix the secret.
        let mut r = Responder::new(Policy::Prefer, vec![[9u8; 20]]);
        let mut one = [0u8; KEY_LEN];
        one[KEY_LEN - 1] = 1;
        assert!(r.feed(&one).is_err());
    }

    /// Step 3 of one initiator for `ih` against a responder of `skeys`: the torrent found.
    fn step3(skeys: &Arc<Skeys>, ih: [u8; 20]) -> Result<usize, MseError> {
        let mut r = Responder::with_skeys(Policy::Prefer, skeys.clone());
        let (mut i, open) = Initiator::new(ih, CRYPTO_RC4, b"IA".to_vec());
        let p2 = r.feed(&open)?;
        let p3 = i.feed(&p2.send)?;
        let p4 = r.feed(&p3.send)?;
        Ok(p4.done.expect("step 3 and IA complete").torrent)
    }

    #[test]
    fn step3_finds_each_torrent_of_a_shared_map_and_refuses_others() {
        let (a, b) = ([0xA1u8; 20], [0xB2u8; 20]);
        let skeys = Arc::new(Skeys::new(&[a, b, a]));
        assert_eq!(skeys.len(), 2, "a repeated hash keeps its first index");
        assert_eq!(step3(&skeys, a), Ok(0));
        assert_eq!(step3(&skeys, b), Ok(1));
        assert_eq!(step3(&skeys, [0xC3; 20]), Err(MseError::UnknownTorrent));
        let mut more = Skeys::default();
        more.insert(5, b);
        assert_eq!(step3(&Arc::new(more), b), Ok(5));
    }
}
