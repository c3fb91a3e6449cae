//! The two files every server serves, the seed's small page and large file.

use std::path::Path;

use anyhow::Context;

use crate::results::FileKind;

/// The size of the small file, as the seed's small HTML page.
pub const SMALL_BYTES: usize = 300;
/// The seed's large file: 700 KB.
pub const BIG_BYTES: usize = 700 * 1024;

/// Writes the two files every server serves: `small.html` and `big.bin`.
pub fn write_site(www: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(www).with_context(|| format!("creating {}", www.display()))?;
    let head = "<!DOCTYPE html>\n<html><head><title>iolab</title></head><body>\n<p>";
    let tail = "</p>\n</body></html>\n";
    let fill = SMALL_BYTES - head.len() - tail.len();
    let mut small = String::from(head);
    small.extend(std::iter::repeat_n('x', fill));
    small.push_str(tail);
    std::fs::write(
        www.join(FileKind::Small.path().trim_start_matches('/')),
        &small,
    )?;
    // Deterministic, incompressible-looking bytes (nothing compresses them anyway).
    let mut big = vec![0u8; BIG_BYTES];
    let mut x: u32 = 0x9e37_79b9;
    for b in &mut big {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    std::fs::write(www.join(FileKind::Big.path().trim_start_matches('/')), &big)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn site_files_have_the_seed_sizes() {
        let d = std::env::temp_dir().join(format!("iolab-lab-site-{}", std::process::id()));
        write_site(&d).unwrap();
        assert_eq!(
            std::fs::metadata(d.join("small.html")).unwrap().len(),
            SMALL_BYTES as u64
        );
        assert_eq!(
            std::fs::metadata(d.join("big.bin")).unwrap().len(),
            BIG_BYTES as u64
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
