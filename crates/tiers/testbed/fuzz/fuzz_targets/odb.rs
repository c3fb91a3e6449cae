//! ODB's parsers of what other tiers and agents send (crates/tiers/odb): frame headers (an R
//! frame's length, a V frame's reference: written again, it parses the same), an agent's
//! HELLO reply, and the parts of a lease buffer id. None may panic; nothing parsed claims
//! more header bytes than it was given.
#![no_main]

use iolab_odb::proto::{self, Header};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match proto::parse_header(data) {
        Ok(Some((h, used))) => {
            assert!(used <= data.len());
            if let Header::Virtual(r) = h {
                let b = r.encode();
                match proto::parse_header(&b) {
                    Ok(Some((Header::Virtual(again), n))) => {
                        assert_eq!(again, r);
                        assert_eq!(n, proto::V_HDR);
                    }
                    other => panic!("a reference we wrote does not parse: {other:?}"),
                }
            }
        }
        Ok(None) | Err(_) => {}
    }
    if let Ok(fixed) =
        <[u8; proto::HELLO_REP_FIXED]>::try_from(&data[..data.len().min(proto::HELLO_REP_FIXED)])
    {
        let _ = proto::parse_hello(&fixed);
    }
    if data.len() >= 32 {
        let id = u128::from_le_bytes(data[..16].try_into().unwrap());
        let key: [u8; 16] = data[16..32].try_into().unwrap();
        if let Some((no, off, len)) = proto::lease_id_parts(id) {
            let genuine = proto::lease_buf_id(no, off, len, &key);
            assert!(proto::lease_id_valid(genuine, &key));
        }
        let _ = proto::lease_id_valid(id, &key);
    }
});
