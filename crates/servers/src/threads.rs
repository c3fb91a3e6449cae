//! (model not written yet)

pub fn run(ctx: &crate::Ctx) -> std::io::Result<()> {
    let _ = ctx;
    Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "model threads is not written yet"))
}
