//! DISC's parsers of what other tiers and the network send (crates/tiers/disc): the `X-Disc-Path`
//! and `X-Disc` field values (round trips: what parses, written again, parses the same),
//! the frames DP's tap reads (cloned ACKs and start signals), the ACK ring's records, and
//! the request and response heads our proxies parse, and the FE's end of a connection in
//! DP's HELLO line (round trip). None may panic.
#![no_main]

use iolab_disc::bpf::AckEvent;
use iolab_disc::http1::{field, find_head_end, parse_request, parse_response, rewrite_head};
use iolab_disc::proto::{Disc, PathInfo};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&which, data)) = input.split_first() else {
        return;
    };
    match which % 6 {
        0 => {
            if let Ok(p) = PathInfo::parse(data) {
                let again = PathInfo::parse(p.to_string().as_bytes()).expect("our own value parses");
                assert_eq!(again, p);
                let _ = (
                    p.all_accept(),
                    p.fe_tier(),
                    p.forward(true),
                    p.forward(false),
                );
            }
        }
        1 => {
            if let Ok(d) = Disc::parse(data) {
                let again = Disc::parse(d.to_string().as_bytes()).expect("our own value parses");
                assert_eq!(again, d);
            }
        }
        2 => {
            if let Some((seg, payload, _)) = iolab_disc::packet::parse(data) {
                assert!(payload.len() <= data.len());
                let _ = seg;
            }
            if let Some(iolab_disc::tap::TapFrame::Start(s)) = iolab_disc::tap::parse(data) {
                assert!(s.head.len() <= data.len());
            }
        }
        3 => {
            let _ = AckEvent::parse(data);
        }
        4 => {
            let text = String::from_utf8_lossy(data);
            if let Some(end) = iolab_disc::repair::FeEnd::parse(&mut text.split_ascii_whitespace())
            {
                let again = end.fields();
                assert_eq!(
                    iolab_disc::repair::FeEnd::parse(&mut again.split_ascii_whitespace()),
                    Some(end)
                );
            }
        }
        _ => {
            if let Ok(r) = parse_request(data) {
                // A located field is replaced as the general scan replaces it.
                if find_head_end(data, 0) == Some(data.len()) {
                    let name = iolab_disc::proto::PATH_FIELD;
                    let line = b"X-Disc-Path: nb=1;bypass=1\r\n";
                    assert_eq!(r.path.value(data, name), field(data, name));
                    assert_eq!(
                        r.path.replace(data, name, Some(line)),
                        rewrite_head(data, name, &[String::from_utf8_lossy(line).into()])
                    );
                }
            }
            for method in ["GET", "HEAD"] {
                if let Ok(r) = parse_response(data, method) {
                    assert!(r.status >= 100 && r.status <= 999, "status {}", r.status);
                }
            }
        }
    }
});
