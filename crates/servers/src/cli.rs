//! `iolab serve`, `iolab models`, `iolab stats`.

#[derive(Debug, clap::Args)]
pub struct ServeArgs {}

#[derive(Debug, clap::Args)]
pub struct ModelsArgs {
    /// Print the model names only, one per line.
    #[arg(long)]
    pub names: bool,
}

#[derive(Debug, clap::Args)]
pub struct StatsArgs {}

pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("iolab serve is not written yet")
}

pub fn models(args: ModelsArgs) -> anyhow::Result<()> {
    for m in crate::Model::ALL {
        if args.names {
            println!("{m}");
        } else {
            let (seed, what) = m.describe();
            println!("{:<18} {:<15} {}", m.name(), seed, what);
        }
    }
    Ok(())
}

pub fn stats(args: StatsArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("iolab stats is not written yet")
}
