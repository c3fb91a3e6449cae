//! A connection frozen on one socket and continued on another (`iolab_disc::repair`): the
//! peer reads one stream, the bytes before the hand-over and a payload sent after it with
//! `sendfile`, with no FIN or RST in between. Needs root (CAP_NET_ADMIN for TCP_REPAIR);
//! otherwise skips with one line (fails under CI=true).

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

#[test]
fn a_frozen_connection_continues_on_a_restored_socket() {
    if !common::can_run(
        "the TCP repair test",
        (!common::is_root()).then_some("needs root (CAP_NET_ADMIN for TCP_REPAIR)"),
    ) {
        return;
    }
    let payload: Vec<u8> = (0..(1u32 << 20) + 7)
        .map(|i| (i * 7 + i / 4099) as u8)
        .collect();
    let dir = std::env::temp_dir().join(format!("iolab-disc-repair-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("payload");
    std::fs::write(&path, &payload).unwrap();

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let at = listener.local_addr().unwrap();
    let client = std::thread::spawn(move || {
        let mut c = TcpStream::connect(at).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(b"GET\n").unwrap();
        let mut got = Vec::new();
        c.read_to_end(&mut got).map(|_| got)
    });
    let (mut s1, _) = listener.accept().unwrap();
    let mut req = [0u8; 4];
    s1.read_exact(&mut req).unwrap();
    assert_eq!(&req, b"GET\n");
    s1.write_all(b"HEAD\n").unwrap();
    // The head acknowledged before the hand-over (nothing left to retransmit on s1).
    let t0 = Instant::now();
    loop {
        let mut unacked: libc::c_int = 0;
        // SAFETY: SIOCOUTQ writes one int into `unacked`, alive for the call.
        unsafe { libc::ioctl(s1.as_raw_fd(), libc::TIOCOUTQ, &mut unacked) };
        if unacked == 0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "head not acknowledged"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let st = iolab_disc::repair::freeze(&s1).unwrap();
    assert_eq!(
        st.local,
        match at {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!(),
        }
    );
    // Closed in repair mode: the client gets neither FIN nor RST.
    drop(s1);
    drop(listener);
    let s2 = iolab_disc::repair::restore(&st).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    let mut off: libc::off_t = 0;
    while (off as usize) < payload.len() {
        // SAFETY: sendfile reads the file and writes the socket, both open; `off` is alive.
        let n = unsafe {
            libc::sendfile(
                s2.as_raw_fd(),
                f.as_raw_fd(),
                &mut off,
                payload.len() - off as usize,
            )
        };
        assert!(n > 0, "sendfile: {}", std::io::Error::last_os_error());
    }
    s2.shutdown(std::net::Shutdown::Write).unwrap();
    let got = client
        .join()
        .unwrap()
        .expect("the client read one stream to its end");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(got.len(), 5 + payload.len());
    assert_eq!(&got[..5], b"HEAD\n");
    assert!(got[5..] == payload[..], "the payload arrived changed");
}
