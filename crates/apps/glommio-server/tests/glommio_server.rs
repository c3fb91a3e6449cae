//! iolab-glommio-server on the wire, in each profile (the monoio peer's tests/peer_http.rs:
//! one standard for both peers), and its start line naming the configuration in force.

#[path = "../../monoio-server/tests/peer_http.rs"]
mod peer_http;

const BIN: &str = env!("CARGO_BIN_EXE_iolab-glommio-server");

#[test]
fn serves_like_the_models_in_every_profile() {
    for profile in ["default", "latency", "throughput"] {
        peer_http::serves_like_the_models(BIN, &["--profile", profile]);
    }
}

#[test]
fn the_start_line_gives_the_configuration() {
    let dir = iolab_sys::testing::tempdir("glommio-line").unwrap();
    let peer = peer_http::start(BIN, dir.path(), &["--profile", "throughput"]);
    let line = &peer.start_line;
    for part in [
        "with glommio (2 executors",
        "profile throughput",
        "ring depth 1024",
    ] {
        assert!(line.contains(part), "{part:?} not in {line:?}");
    }
}
