//! `iolab lab`.

#[derive(Debug, clap::Args)]
pub struct LabArgs {}

pub fn run(args: LabArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("iolab lab is not written yet")
}
