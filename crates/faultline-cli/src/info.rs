//! `faultline info`.
pub fn run() -> anyhow::Result<()> {
    anyhow::bail!("not yet implemented")
}
