//! `iolab-odb-agent [--listen IP:PORT] [--memory MIB] [--lifetime SECS]`: the ODB buffer
//! agent as a process of its own (also `iolab tiers agent`).

use iolab_odb::spec::AgentSpec;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cfg = match AgentSpec::parse(&args).and_then(|s| s.map(|s| s.config()).transpose()) {
        Ok(Some(cfg)) => cfg,
        Ok(None) => {
            println!("usage: iolab-odb-agent [--listen IP:PORT] [--memory MIB] [--lifetime SECS] [--drain SECS] [--arena-user NAME]");
            return;
        }
        Err(e) => die(&e),
    };
    match iolab_odb::agent::run_foreground(cfg) {
        Ok(s) => eprintln!(
            "odb agent: exit after drain; {}",
            serde_json::to_string(&s).unwrap_or_default()
        ),
        Err(e) => die(&format!("odb agent: {e}")),
    }
}

fn die(msg: &str) -> ! {
    eprintln!("iolab-odb-agent: {msg}");
    std::process::exit(2)
}
