//! The ODB buffer agent's request loop (crates/tiers/odb, `Agent::conn`) fed any bytes as one
//! peer's stream: ALLOC, LEASE, FETCH with ids and bounds no one handed out, cut and
//! pipelined requests, unknown operations. It may refuse, never panic; every reply starts
//! with a status byte the protocol knows (or is the STATS reply's length).
#![no_main]

use std::io::{self, Read, Write};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use iolab_odb::agent::{Agent, AgentConfig};
use libfuzzer_sys::fuzz_target;

/// One agent for the whole run (its arena is a file in TMPDIR, which scripts/fuzz-tiers
/// makes private and removes).
fn agent() -> &'static Arc<Agent> {
    static AGENT: OnceLock<Arc<Agent>> = OnceLock::new();
    AGENT.get_or_init(|| {
        let cfg = AgentConfig {
            arena_bytes: 1 << 20,
            lifetime: Duration::from_secs(30),
            arena_dir: std::env::temp_dir(),
            ..Default::default()
        };
        Agent::bind(cfg).expect("an agent").0
    })
}

/// A peer's stream: the fuzzer's bytes in, the agent's replies out.
struct Peer<'a> {
    input: &'a [u8],
    output: Vec<u8>,
}

impl Read for Peer<'_> {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        // A few bytes at a time: requests are cut across reads.
        let n = b.len().min(self.input.len()).min(1 + self.input.len() % 37);
        b[..n].copy_from_slice(&self.input[..n]);
        self.input = &self.input[n..];
        Ok(n)
    }
}

impl iolab_odb::agent::Peer for Peer<'_> {}

impl Write for Peer<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.output.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let mut peer = Peer {
        input: data,
        output: Vec::new(),
    };
    let _ = agent().conn(&mut peer);
    if let Some(&first) = peer.output.first() {
        let stats = data.first() == Some(&iolab_odb::proto::OP_STATS);
        assert!(
            stats || first <= iolab_odb::proto::ST_DELIVERED,
            "reply status {first}"
        );
    }
});
