//! `iolab load`.

#[derive(Debug, clap::Args)]
pub struct LoadArgs {}

pub fn run(args: LoadArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("iolab load is not written yet")
}
