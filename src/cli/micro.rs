//! `iolab micro <name> [--quick] [--json FILE]`.

use std::path::PathBuf;

use iolab_lab::micro::MicroSpec;

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

impl MicroArgs {
    /// The run asked for, as the spec the lab launches `iolab micro` with.
    pub fn to_spec(&self) -> MicroSpec {
        MicroSpec {
            name: self.name.clone(),
            quick: self.quick,
            json: self.json.clone(),
        }
    }
}

pub fn run(args: MicroArgs) -> anyhow::Result<()> {
    let args = args.to_spec();
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

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use clap::Parser as _;

    use super::*;

    /// What the lab launches is what `iolab micro` runs: spec -> arguments -> the binary's
    /// parser -> spec.
    #[test]
    fn a_spec_survives_the_command_line() {
        for (name, quick, json) in [
            ("queue", true, Some("/r/micro/queue.json")),
            ("echo", false, None),
            ("all", false, Some("out dir/all.json")),
        ] {
            let spec = MicroSpec {
                name: name.into(),
                quick,
                json: json.map(PathBuf::from),
            };
            let argv = std::iter::once(OsString::from("iolab")).chain(spec.to_args());
            let cli = crate::Cli::try_parse_from(argv)
                .unwrap_or_else(|e| panic!("iolab micro refuses the spec's arguments: {e}"));
            let crate::Command::Micro(args) = cli.command else {
                panic!("not parsed as iolab micro");
            };
            assert_eq!(args.to_spec(), spec);
        }
    }
}
