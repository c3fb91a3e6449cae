//! PHP through php-fpm on the BE (unmodified nginx and PHP): the bytes a client receives for
//! `/payload.php?n=SIZE` through FE → IS → BE are the same with ODB on the nginx tiers as
//! without it, and ODB carried them by reference past the IS.

use iolab_tiers::nginx::php_payload;
use iolab_tiers::stack::{php_fpm_bin, Odb, Place, Stack, StackConfig};
use iolab_tiers::testutil::*;
use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;

/// nginx and php-fpm are installed; if not, the test skips with one line (fails under
/// CI=true).
fn have_tools() -> bool {
    if iolab_sys::testing::require_tool("nginx", "nginx").is_none() {
        return false;
    }
    let names = ["php-fpm", "php-fpm8.2", "php-fpm8.3", "php-fpm8.4"];
    iolab_sys::testing::require_any_tool(&names, "php-fpm").is_some() && php_fpm_bin().is_some()
}

fn config(scratch: &ScratchDir, tag: &str, root: &Path, odb: bool) -> StackConfig {
    let (o, port) = loop {
        let b = 100 + rand::random::<u8>() % 100;
        let c = rand::random::<u8>() % 250;
        let Ok(l) = TcpListener::bind((Ipv4Addr::new(127, b, c, 11), 0)) else {
            continue;
        };
        let port = l.local_addr().unwrap().port();
        if port <= 65000 {
            break ([127, b, c], port);
        }
    };
    let at = |h: u8| Place {
        ns: None,
        addr: Ipv4Addr::new(o[0], o[1], o[2], h),
    };
    StackConfig {
        fe: at(11),
        is: at(12),
        be: at(13),
        port,
        dir: scratch.join(tag),
        root: root.to_path_buf(),
        odb: odb.then(|| {
            let (lib, agent) = odb_artifacts().expect("ODB artefacts");
            Odb {
                lib,
                agent,
                agent_memory_mib: 128,
                threshold: 4096,
            }
        }),
        loopback: true,
        workers: 1,
        skip_be: false,
        fe_listen: None,
        domain: None,
        cpus: None,
        php: true,
    }
}

#[test]
fn php_payloads_are_identical_with_and_without_odb() {
    if !have_tools() {
        return;
    }
    let sizes = [0usize, 1, 3000, 4096, 4097, 65536, 65537, 300_000];
    let scratch = scratch_dir("php").unwrap();
    let root = scratch.join("www");
    let vanilla = Stack::start(config(&scratch, "van", &root, false), None).unwrap();
    let odb = Stack::start(config(&scratch, "odb", &root, true), None).unwrap();
    for st in [&vanilla, &odb] {
        let mut keep = Client::connect(st.cfg.listen("fe")).unwrap();
        for &s in &sizes {
            let want = php_payload(s);
            let path = format!("/payload.php?n={s}");
            let r = keep
                .request("GET", &path)
                .unwrap_or_else(|e| panic!("size {s}: {e:#} (logs in {})", st.cfg.dir.display()));
            assert_eq!(
                r.status,
                200,
                "size {s} (odb: {}): BE log {}\nphp-fpm log {}",
                st.cfg.odb.is_some(),
                std::fs::read_to_string(st.cfg.dir.join("be/error.log")).unwrap_or_default(),
                std::fs::read_to_string(st.cfg.dir.join("php/php-fpm.log")).unwrap_or_default()
            );
            assert!(
                r.body == want,
                "size {s}: body differs (odb: {}, {} bytes)",
                st.cfg.odb.is_some(),
                r.body.len()
            );
            let r = Client::connect(st.cfg.listen("fe"))
                .unwrap()
                .request("GET", &path)
                .unwrap();
            assert!(r.body == want, "size {s}: new-connection body differs");
        }
    }
    let mut odb = odb;
    odb.stop();
    let c = odb.odb_counters();
    // the 64 KiB and 300 KB responses went past the IS by reference
    let v_out = c["is"]["v_out_bytes"].as_u64().unwrap_or(0);
    assert!(
        v_out > 2 * 300_000,
        "IS forwarded only {v_out} bytes by reference: {c}"
    );
    assert_eq!(c["fe"]["proto_errors"].as_u64(), Some(0), "{c}");
}
