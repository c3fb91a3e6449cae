//! (benchmark not written yet)

pub fn run(opts: &crate::Opts) -> anyhow::Result<serde_json::Value> {
    let _ = opts;
    anyhow::bail!("micro runtime is not written yet")
}
