//! ODB's receive state machine (frames.rs' FrameReader: the partial-header stash, R data,
//! V-frame placement) on any byte stream a peer may send, cut into reads anywhere and asked
//! for any sizes. A stream built of valid frames arrives exactly (R data as sent, each
//! reference placed as its length in bytes) however it is cut; any other stream ends in a
//! reset or an end of file, never a panic and never a call that makes no progress.
#![no_main]

#[allow(dead_code)]
#[path = "../../src/frames.rs"]
mod frames;
#[path = "../../src/pages.rs"]
mod pages;
#[path = "../../src/recv_peer.rs"]
mod recv_peer;

use frames::{FrameReader, InFrame};
use iolab_odb::proto::{self, Ref};
use libfuzzer_sys::fuzz_target;
use recv_peer::{End, Peer};
use std::net::{Ipv4Addr, SocketAddrV4};

/// A stream of valid frames described by `ops`, and the bytes the application must get.
fn frames_of(ops: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let (mut stream, mut app) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i + 2 < ops.len() {
        let len = usize::from(u16::from_le_bytes([ops[i + 1], ops[i + 2]])) + 1;
        if ops[i] % 2 == 0 {
            let data: Vec<u8> = (0..len).map(|k| (k as u8) ^ ops[i]).collect();
            stream.extend_from_slice(&proto::encode_r(len as u32));
            stream.extend_from_slice(&data);
            app.extend_from_slice(&data);
        } else {
            let r = Ref {
                len: len as u32,
                agent_id: u64::from(ops[i]),
                agent: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 7000),
                offset: 4096 * i as u64,
                buf_id: 0xfeed,
            };
            stream.extend_from_slice(&r.encode());
            app.extend(std::iter::repeat_n(b'V', len));
        }
        i += 3;
    }
    (stream, app)
}

/// Every receive call until the stream is used up; how the last one ended.
fn drain(peer: &mut Peer, rx: &mut FrameReader, wants: &[usize], budget: usize) -> End {
    for (calls, &want) in wants.iter().cycle().enumerate() {
        assert!(calls <= budget, "no progress after {calls} calls");
        match peer.recv(rx, want) {
            End::Bytes(n) => assert!(n > 0 && n <= want, "{n} bytes for {want}"),
            end => return end,
        }
    }
    unreachable!()
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let (knobs, rest) = data.split_at(3);
    let cut = usize::from(u16::from_le_bytes([knobs[1], knobs[2]])) % 9000 + 1;
    let wants = [1, 7, 100, 4096, 65536, usize::from(knobs[1]) + 1];
    let framed = knobs[0] % 2 == 0;
    let (stream, app) = if framed {
        frames_of(rest)
    } else {
        (rest.to_vec(), Vec::new())
    };
    let mut chunks: Vec<&[u8]> = stream.chunks(cut).collect();
    if knobs[0] % 4 == 2 {
        chunks.truncate(chunks.len() / 2); // the peer closes midway
    }
    let mut peer = Peer::new(&chunks);
    if knobs[0] % 4 == 2 {
        peer.kernel.push_back(None);
    }
    let mut rx = FrameReader::new();
    let end = drain(&mut peer, &mut rx, &wants, 2 * stream.len() + 16);
    if framed && knobs[0] % 4 == 0 {
        assert_eq!(end, End::WouldBlock);
        assert!(peer.app == app, "bytes differ, cut {cut}");
        assert_eq!(rx.frame(), InFrame::None);
    } else if framed {
        // closed midway: a prefix of the frames' bytes, then an end of file or a reset
        assert!(app.starts_with(&peer.app), "not a prefix, cut {cut}");
        assert!(matches!(end, End::Eof | End::Reset), "{end:?}");
    }
});
