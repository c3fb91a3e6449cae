//! `iolab micro <name> [--quick] [--json FILE]`.

use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct MicroArgs {
    /// Which benchmark: runtime, ctxswitch, queue, syscalls, echo, limits, or all.
    pub name: String,
    /// Short run (seconds instead of minutes).
    #[arg(long)]
    pub quick: bool,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

pub fn run(args: MicroArgs) -> anyhow::Result<()> {
    let opts = iolab_micro::Opts { quick: args.quick };
    let value = if args.name == "all" {
        let mut all = serde_json::Map::new();
        for name in iolab_micro::NAMES {
            println!("== micro {name} ==");
            all.insert(name.to_string(), iolab_micro::run_named(name, &opts)?);
        }
        serde_json::Value::Object(all)
    } else {
        iolab_micro::run_named(&args.name, &opts)?
    };
    if let Some(path) = args.json {
        std::fs::write(&path, serde_json::to_string_pretty(&value)? + "\n")
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}
