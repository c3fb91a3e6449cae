//! iolab-monoio-server on the wire (tests/peer_http.rs), and its start line naming the
//! configuration in force.

mod peer_http;

const BIN: &str = env!("CARGO_BIN_EXE_iolab-monoio-server");

#[test]
fn serves_like_the_models() {
    peer_http::serves_like_the_models(BIN, &[]);
}

#[test]
fn the_start_line_gives_the_configuration() {
    let dir = iolab_sys::testing::tempdir("monoio-line").unwrap();
    let peer = peer_http::start(BIN, dir.path(), &["--entries", "100"]);
    let line = &peer.start_line;
    // monoio raises rings below 256 entries to 256: the line says what runs.
    for part in [
        "with monoio (2 threads",
        "io_uring driver",
        "256-entry rings",
        "idle timeout 1 s",
    ] {
        assert!(line.contains(part), "{part:?} not in {line:?}");
    }
}
