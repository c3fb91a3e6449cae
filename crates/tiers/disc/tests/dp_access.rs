//! Issue 43 §1: the attacks on DP's control port, each refused and counted. DP runs on
//! loopback with 127.0.0.1 as its only FE; the attacker connects as the FE would, or from
//! 127.0.0.2. Before the fix every one of these got through: any line from anyone was
//! obeyed, ids ran 1, 2, 3..., and a SEND could name any source and destination.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use iolab_disc::control::{ControlKey, Refusal, Signer, Verifier};
use iolab_disc::dp::{Access, SendPath, Store};

mod common;

/// DP serving on loopback in a thread of its own until dropped.
struct Dp {
    at: SocketAddr,
    store: Arc<Store>,
    key: ControlKey,
    stop: Arc<iolab_disc::stop::Stop>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Dp {
    fn start(store: Arc<Store>) -> Dp {
        let key = ControlKey::random().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        let stop = iolab_disc::stop::Stop::new().unwrap();
        let access = Arc::new(Access {
            key: key.clone(),
            peers: vec![Ipv4Addr::LOCALHOST.into()],
        });
        let (s, st) = (store.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let rt = iolab_runtime::Runtime::builder()
                .workers(1)
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = iolab_runtime::net::TcpListener::from_std(listener).unwrap();
                let watch = std::rc::Rc::new(st.watch());
                iolab_disc::dp::serve(l, s, SendPath::Raw, None, access, watch).await;
            });
        });
        Dp {
            at,
            store,
            key,
            stop,
            thread: Some(thread),
        }
    }

    /// A control connection from `from`, its greeting read (None: closed unread).
    fn connect_from(&self, from: Ipv4Addr) -> Client {
        let s = connect(from, self.at);
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut greeting = String::new();
        let _ = r.read_line(&mut greeting);
        let nonce = iolab_disc::control::parse_greeting(greeting.trim_end());
        Client {
            s,
            r,
            signer: nonce.map(|n| Signer::new(self.key.clone(), n)),
            answers: nonce.map(|n| Verifier::answers(self.key.clone(), n)),
            nonce,
        }
    }

    fn connect(&self) -> Client {
        self.connect_from(Ipv4Addr::LOCALHOST)
    }
}

impl Drop for Dp {
    fn drop(&mut self) {
        self.stop.trigger();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A TCP connection to `to` from address `from` (loopback holds all of 127/8; std cannot
/// bind a connecting socket).
fn connect(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(to) = to else {
        unreachable!("DP listens on 127.0.0.1")
    };
    let sa = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let (local, remote) = (sa(from, 0), sa(*to.ip(), to.port()));
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket, bound and connected with sockaddr_in structures alive for the
    // calls; TcpStream owns the descriptor from then on (and closes it).
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let s = TcpStream::from_raw_fd(fd);
        assert_eq!(
            libc::bind(fd, (&local as *const libc::sockaddr_in).cast(), len),
            0
        );
        assert_eq!(
            libc::connect(fd, (&remote as *const libc::sockaddr_in).cast(), len),
            0
        );
        s
    }
}

struct Client {
    s: TcpStream,
    r: BufReader<TcpStream>,
    signer: Option<Signer>,
    /// Checks DP's answers, signed as the FE's lines are.
    answers: Option<Verifier>,
    nonce: Option<u64>,
}

impl Client {
    /// Sends `line` as it is (CRLF added) and reads DP's answer ("" when DP closed).
    fn raw(&mut self, line: &str) -> String {
        let _ = self.s.write_all(format!("{line}\r\n").as_bytes());
        self.answer()
    }

    /// DP's next answer, its signature checked and removed ("" when DP closed).
    fn answer(&mut self) -> String {
        let mut a = String::new();
        let _ = self.r.read_line(&mut a);
        let a = a.trim_end();
        if a.is_empty() {
            return String::new();
        }
        let v = self.answers.as_mut().expect("greeted");
        iolab_disc::control::check_answer(v, a).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `command` signed as the FE signs it; the line sent, without CRLF.
    fn signed(&self, command: &str) -> String {
        let l = self.signer.as_ref().expect("greeted").line(command);
        l.trim_end().to_string()
    }
}

fn payload(store: &Store, n: usize) -> u64 {
    store.insert(Bytes::from(vec![7u8; n])).unwrap()
}

#[test]
fn an_unauthenticated_line_is_refused_and_counted() {
    let dp = Dp::start(Store::new());
    let id = payload(&dp.store, 100);
    let mut c = dp.connect();
    assert!(c.nonce.is_some(), "DP greets its FE with a nonce");
    assert_eq!(c.raw(&format!("FETCH {id}")), "ERR unauthenticated");
    assert_eq!(c.answer(), "", "and closes the connection");
    // A MAC under another key.
    let mut c = dp.connect();
    let other = Signer::new(ControlKey::random().unwrap(), c.nonce.unwrap());
    assert_eq!(
        c.raw(other.line(&format!("FETCH {id}")).trim_end()),
        "ERR unauthenticated"
    );
    assert_eq!(dp.store.refused(Refusal::Unauthenticated), 2);
    assert_eq!(dp.store.usage().0, 1, "the payload is still held");
}

#[test]
fn a_connection_from_another_address_is_closed_unread() {
    let dp = Dp::start(Store::new());
    let mut c = dp.connect_from(Ipv4Addr::new(127, 0, 0, 2));
    assert_eq!(c.nonce, None, "no greeting");
    assert_eq!(c.raw("HELLO"), "");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(dp.store.refused(Refusal::Peer), 1);
}

#[test]
fn another_payload_s_id_cannot_be_guessed_or_taken_twice() {
    let dp = Dp::start(Store::new());
    let id = payload(&dp.store, 1000);
    // The ids of the old store: sequential from 1; and the neighbours of a known one.
    for guess in [1, 2, 3, id.wrapping_add(1), id.wrapping_sub(1)] {
        let mut c = dp.connect();
        let line = c.signed(&format!("FETCH {guess}"));
        assert_eq!(c.raw(&line), "ERR unknown payload", "id {guess}");
    }
    let mut fe = dp.connect();
    let line = fe.signed(&format!("FETCH {id}"));
    assert_eq!(fe.raw(&line), "OK 1000");
    let mut c = dp.connect();
    let line = c.signed(&format!("FETCH {id}"));
    assert_eq!(c.raw(&line), "ERR unknown payload", "handed out once");
    assert_eq!(dp.store.refused(Refusal::UnknownPayload), 6);
}

#[test]
fn a_replayed_line_is_refused_on_its_connection_and_on_another() {
    let dp = Dp::start(Store::new());
    let (a, b) = (payload(&dp.store, 10), payload(&dp.store, 10));
    let mut c = dp.connect();
    let hello = c.signed("HELLO");
    assert_eq!(c.raw(&hello), "OK");
    assert_eq!(c.raw(&hello), "ERR replay");
    // A line seen on one connection, sent on another (another nonce).
    let c1 = dp.connect();
    let fetch = c1.signed(&format!("FETCH {a}"));
    let mut c2 = dp.connect();
    assert_eq!(c2.raw(&fetch), "ERR unauthenticated");
    assert_eq!(dp.store.refused(Refusal::Replay), 1);
    assert_eq!(dp.store.refused(Refusal::Unauthenticated), 1);
    assert_eq!(dp.store.usage().0, 2, "{a} and {b} still held");
}

#[test]
fn a_send_to_another_flow_is_refused_and_keeps_the_payload() {
    let dp = Dp::start(Store::new());
    let id = payload(&dp.store, 64 << 10);
    // The line: DP made to send "from" 127.0.0.9:4444 to 127.0.0.10:5556.
    let spoofed = format!("SEND {id} 127.0.0.10:5556 127.0.0.9:4444 1 1 65535 4294967295 14");
    let mut c = dp.connect();
    let line = c.signed(&spoofed);
    assert_eq!(c.raw(&line), "ERR other flow", "no HELLO");
    let mut c = dp.connect();
    let hello = c.signed("HELLO 10.1.0.1:40000 10.2.0.1:80 7");
    assert_eq!(c.raw(&hello), "OK");
    let line = c.signed(&spoofed);
    assert_eq!(c.raw(&line), "ERR other flow", "another flow than HELLO's");
    assert_eq!(dp.store.refused(Refusal::OtherFlow), 2);
    assert_eq!(dp.store.usage().0, 1, "the payload is still held");
    assert_eq!(dp.store.send_paths(), (0, 0), "nothing sent");
}

#[test]
fn an_expired_payload_is_refused() {
    let dp = Dp::start(Store::with_limits(
        Duration::from_millis(50),
        iolab_disc::dp::MAX_BYTES,
    ));
    let id = payload(&dp.store, 10);
    std::thread::sleep(Duration::from_millis(100));
    let mut c = dp.connect();
    let line = c.signed(&format!("FETCH {id}"));
    assert_eq!(c.raw(&line), "ERR expired");
    assert_eq!(dp.store.refused(Refusal::Expired), 1);
}

/// A second SEND on the flow must start past the first payload's end, within
/// MAX_SEQ_ADVANCE. Root: the first one goes out (a raw socket, to a closed loopback port).
#[test]
fn a_send_outside_the_sequence_window_is_refused() {
    if !common::is_root() {
        eprintln!("skipped: raw sockets need root");
        return;
    }
    let dp = Dp::start(Store::new());
    let (a, b) = (payload(&dp.store, 3000), payload(&dp.store, 3000));
    let mut c = dp.connect();
    let hello = c.signed("HELLO 127.0.0.10:5556 127.0.0.9:4444 0");
    assert_eq!(c.raw(&hello), "OK");
    let first = c.signed(&format!(
        "SEND {a} 127.0.0.10:5556 127.0.0.9:4444 1000 1 65535"
    ));
    c.s.write_all(format!("{first}\r\n").as_bytes()).unwrap();
    // Overlapping the first payload (it ends at 4000).
    let second = c.signed(&format!(
        "SEND {b} 127.0.0.10:5556 127.0.0.9:4444 3999 1 65535"
    ));
    assert_eq!(c.raw(&second), "ERR sequence window");
    assert_eq!(dp.store.refused(Refusal::Window), 1);
    assert_eq!(dp.store.start_sources(), (0, 1), "the first one started");
    assert_eq!(dp.store.usage().0, 1, "the second still held");
}

/// A fake DP greeting on a std listener: answers each line it reads with the next of
/// `answers` (made by `make(key, nonce)`).
fn fake_dp(make: fn(&ControlKey, u64) -> Vec<String>) -> (SocketAddr, ControlKey) {
    let key = ControlKey::random().unwrap();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = l.local_addr().unwrap();
    let k = key.clone();
    std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let nonce = 0x1234_5678_9abc_def0;
        (&s).write_all(iolab_disc::control::greeting(nonce).as_bytes())
            .unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        for answer in make(&k, nonce) {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let _ = (&s).write_all(answer.as_bytes());
        }
        let mut rest = String::new();
        let _ = r.read_line(&mut rest);
    });
    (at, key)
}

/// The FE's fetches of two payloads from `at`: each result.
fn two_fetches(at: SocketAddr, key: ControlKey) -> Vec<std::io::Result<u64>> {
    let rt = iolab_runtime::Runtime::builder()
        .workers(1)
        .build()
        .unwrap();
    rt.block_on(async move {
        let s = iolab_runtime::net::TcpStream::connect(at).await.unwrap();
        let mut conn = iolab_disc::http1::Conn::new(s);
        let (signer, mut answers) =
            iolab_disc::dp::greeted(&mut conn, &key, Duration::from_secs(5))
                .await
                .unwrap();
        let mut out = Vec::new();
        for id in [11, 12] {
            let r = iolab_disc::dp::fetch(&mut conn, (&signer, &mut answers), id).await;
            out.push(r);
        }
        out
    })
}

/// DP's answers carried no MAC: whoever could write on the control connection (or pose as
/// DP) made the FE take any size. A forged answer and a replayed one are refused, and
/// counted; a signed one passes.
#[test]
fn a_forged_or_replayed_answer_of_dp_is_refused_and_counted() {
    let before = iolab_disc::control::refused_answers();
    // Unsigned, then under another key.
    let (at, key) = fake_dp(|_, nonce| {
        let other = Signer::answers(ControlKey::from_bytes([5; 16]), nonce);
        vec!["OK 0\r\n".into(), other.line("OK 0")]
    });
    let r = two_fetches(at, key);
    assert!(
        r[0].as_ref()
            .is_err_and(|e| e.to_string().contains("unauthenticated")),
        "{r:?}"
    );
    assert!(r[1].is_err(), "{r:?}");
    assert_eq!(iolab_disc::control::refused_answers(), before + 2);
    // Signed by the right key: accepted; the same line again: a replay.
    let (at, key) = fake_dp(|k, nonce| {
        let line = Signer::answers(k.clone(), nonce).line("OK 0");
        vec![line.clone(), line]
    });
    let r = two_fetches(at, key);
    assert_eq!(r[0].as_ref().ok(), Some(&0), "{r:?}");
    assert!(
        r[1].as_ref()
            .is_err_and(|e| e.to_string().contains("replay")),
        "{r:?}"
    );
    // A command of the FE reflected back as an answer: the MAC covers the side.
    let (at, key) = fake_dp(|k, nonce| vec![Signer::new(k.clone(), nonce).line("OK 0")]);
    let r = two_fetches(at, key);
    assert!(r[0].is_err(), "{r:?}");
    assert_eq!(iolab_disc::control::refused_answers(), before + 4);
}
