//! `iolab-odb-agent [--listen IP:PORT] [--memory MIB] [--lifetime SECS]`: the ODB buffer
//! agent as a process of its own (also `iolab tiers agent`).

fn main() {
    let mut cfg = iolab_odb::agent::AgentConfig::default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--listen" => {
                cfg.listen = v
                    .parse()
                    .unwrap_or_else(|e| die(&format!("--listen {v}: {e}")))
            }
            "--memory" => {
                cfg.arena_bytes = v
                    .parse::<u64>()
                    .unwrap_or_else(|e| die(&format!("--memory {v}: {e}")))
                    << 20
            }
            "--lifetime" => {
                cfg.lifetime = std::time::Duration::from_secs_f64(
                    v.parse()
                        .unwrap_or_else(|e| die(&format!("--lifetime {v}: {e}"))),
                )
            }
            "--drain" => {
                cfg.drain = std::time::Duration::from_secs_f64(
                    v.parse()
                        .unwrap_or_else(|e| die(&format!("--drain {v}: {e}"))),
                )
            }
            "--arena-user" => {
                cfg.arena_uid = Some(
                    iolab_odb::agent::user_uid(&v)
                        .unwrap_or_else(|| die(&format!("--arena-user {v}: no such user"))),
                )
            }
            "-h" | "--help" => {
                println!("usage: iolab-odb-agent [--listen IP:PORT] [--memory MIB] [--lifetime SECS] [--drain SECS] [--arena-user NAME]");
                return;
            }
            o => die(&format!("unknown argument {o}")),
        }
        i += 2;
    }
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
