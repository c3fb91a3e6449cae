//! The test policy for external tools and other things a test needs from the machine.
//!
//! A test that needs nginx, wrk, ab, curl, chromium (any program found on `PATH`):
//!
//! ```no_run
//! #[test]
//! fn against_nginx() {
//!     let Some(nginx) = iolab_sys::testing::require_tool("nginx", "nginx") else { return };
//!     // ... std::process::Command::new(nginx) ...
//! }
//! ```
//!
//! or, returning early by itself: `let nginx = iolab_sys::require_tool!("nginx", "nginx");`.
//!
//! - The tool is there: its path is returned and the test runs.
//! - It is missing, outside CI: one line on the terminal (not captured by the test harness),
//!   `SKIPPED <test>: needs \`nginx\` (Debian package nginx: sudo scripts/install-deps)`, and
//!   the test returns, passing.
//! - It is missing under `CI=true` (or `CI=1`): the test fails with the same text. CI installs
//!   every tool listed in `scripts/deps/*`, so a missing one there is a defect, not a skip.
//!
//! [`require`] applies the same policy to any other precondition (root, IPv6 loopback, ...).
//!
//! And what many tests need: [`free_port`], a scratch directory removed on drop
//! ([`tempdir`]), reproducible noise ([`random_bytes`]) and [`stop_child`].

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// True under CI: the environment variable `CI` is `true` or `1` (as CI services set it).
pub fn in_ci() -> bool {
    matches!(
        std::env::var("CI").as_deref().map(str::trim),
        Ok("true" | "TRUE" | "True" | "1" | "yes")
    )
}

/// Where `command` would run from: itself if it contains a `/` and is an executable file, else
/// the first executable file of that name on `PATH`.
pub fn find_tool(command: &str) -> Option<PathBuf> {
    if command.contains('/') {
        let p = PathBuf::from(command);
        return is_executable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(command))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The path of `command` if it is installed. If not: under CI, panics; outside CI, prints one
/// line naming the Debian `package` and returns `None` (the caller returns: the test skips).
pub fn require_tool(command: &str, package: &str) -> Option<PathBuf> {
    require_any_tool(&[command], package)
}

/// As [`require_tool`], for a tool known under several names (the first found is returned):
/// `require_any_tool(&["chromium", "chromium-browser", "google-chrome"], "chromium")`.
pub fn require_any_tool(commands: &[&str], package: &str) -> Option<PathBuf> {
    if let Some(p) = commands.iter().find_map(|c| find_tool(c)) {
        return Some(p);
    }
    let names: Vec<String> = commands.iter().map(|c| format!("`{c}`")).collect();
    let reason = format!(
        "needs {} (Debian package {package}: sudo scripts/install-deps)",
        names.join(" or ")
    );
    if require(false, &reason) {
        unreachable!()
    }
    None
}

/// The policy for any precondition: returns `ok`. When `ok` is false: under CI, panics with
/// `reason`; outside CI, prints `SKIPPED <test>: <reason>` as one line and returns false.
pub fn require(ok: bool, reason: &str) -> bool {
    if ok {
        return true;
    }
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("test");
    if in_ci() {
        panic!("{test}: {reason} (CI=true: a missing requirement is a failure)");
    }
    // Straight to the process's stderr, not through eprintln!: the test harness captures
    // eprintln! output of passing tests, and a skip must be seen.
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {reason}");
    false
}

/// Headless Chromium, under whichever name the distribution installs it (Debian package
/// `chromium`); `None` once the skip line is printed, a failure under CI (see
/// [`require_any_tool`]).
pub fn chromium() -> Option<PathBuf> {
    require_any_tool(
        &["chromium", "chromium-browser", "google-chrome"],
        "chromium",
    )
}

/// Runs headless `chromium` on the local file `page` with extra `args` (`--dump-dom`,
/// `--screenshot=PATH`, `--window-size=W,H`, ...) in a fresh profile directory, removed
/// afterwards; returns its stdout. Panics with chromium's stderr if it fails.
pub fn headless_chromium(chromium: &Path, args: &[&str], page: &Path) -> Vec<u8> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let profile = std::env::temp_dir().join(format!(
        "iolab-chromium-profile-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let out = std::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output();
    let _ = std::fs::remove_dir_all(&profile);
    let out = out.unwrap_or_else(|e| panic!("running {}: {e}", chromium.display()));
    assert!(
        out.status.success(),
        "chromium {args:?} {} failed: {}",
        page.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The DOM of the local HTML file `page` after headless Chromium loaded it (scripts run,
/// inline SVG parsed): `None` when chromium is missing outside CI (the test skips, see
/// [`chromium`]). Panics if chromium fails.
pub fn chromium_renders(page: &Path) -> Option<String> {
    let chromium = chromium()?;
    let dom = headless_chromium(&chromium, &["--dump-dom"], page);
    Some(String::from_utf8_lossy(&dom).into_owned())
}

/// A free loopback TCP port: bound on 127.0.0.1:0 and released, for a server the test starts
/// right after (another process may take it in between; rare enough for tests).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A scratch directory, removed (with its contents) when dropped; [`TempDir::keep`] keeps it.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
    keep: bool,
}

impl TempDir {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keeps the directory (to look at after the test) and returns its path.
    pub fn keep(mut self) -> PathBuf {
        self.keep = true;
        self.path.clone()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A new empty directory `<temp dir>/iolab-<tag>-<pid>-<n>` (`n` counts up within the
/// process, so two calls with one tag never share it); a leftover of that name, which only
/// this very process can have made, is removed first.
pub fn tempdir(tag: &str) -> std::io::Result<TempDir> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "iolab-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    if path.exists() {
        std::fs::remove_dir_all(&path)?;
    }
    std::fs::create_dir_all(&path)?;
    Ok(TempDir { path, keep: false })
}

/// `n` bytes of xorshift64* noise from `seed` (nonzero): the same bytes for the same seed,
/// every byte value present and no repeating pattern (content a server must not alter).
pub fn random_bytes(n: usize, mut seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        out.extend_from_slice(&seed.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(n);
    out
}

/// Stops a child a test started: SIGTERM, up to 5 s to exit, then SIGKILL; reaps it and
/// returns how it ended (see [`crate::process::terminate`]).
pub fn stop_child(child: &mut std::process::Child) -> std::process::ExitStatus {
    crate::process::terminate(child, std::time::Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("stopping child {}: {e}", child.id()))
}

/// `let path = require_tool!("nginx", "nginx");` — the tool's path, or the enclosing test
/// returns (skips) outside CI / fails under CI (see [`require_tool`]).
#[macro_export]
macro_rules! require_tool {
    ($command:expr, $package:expr) => {
        match $crate::testing::require_tool($command, $package) {
            Some(path) => path,
            None => return,
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_is_on_path_and_nothing_else() {
        let sh = find_tool("sh").expect("sh on PATH");
        assert!(sh.is_absolute() && sh.ends_with("sh"));
        assert_eq!(find_tool("/bin/sh"), Some(PathBuf::from("/bin/sh")));
        assert_eq!(find_tool("iolab-no-such-tool-xyz"), None);
        assert_eq!(find_tool("/etc/passwd"), None, "not executable");
        assert_eq!(find_tool("/etc"), None, "a directory");
        assert_eq!(require_tool("sh", "dash"), Some(sh));
    }

    /// Both sides of the policy, in a child process each (the environment is per process).
    #[test]
    fn missing_tool_skips_outside_ci_and_fails_under_ci() {
        if std::env::var_os("IOLAB_SYS_POLICY_CHILD").is_some() {
            // The child: require a tool that does not exist.
            let got = require_tool("iolab-no-such-tool-xyz", "iolab-nothing");
            assert!(got.is_none());
            return;
        }
        let exe = std::env::current_exe().unwrap();
        let run = |ci: &str| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "testing::tests::missing_tool_skips_outside_ci_and_fails_under_ci",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("IOLAB_SYS_POLICY_CHILD", "1")
                .env("CI", ci)
                .output()
                .unwrap()
        };
        let out = run("false");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "outside CI: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| l.contains("SKIPPED")).collect();
        assert_eq!(lines.len(), 1, "{err}");
        assert!(
            lines[0].contains("`iolab-no-such-tool-xyz`")
                && lines[0].contains("Debian package iolab-nothing"),
            "{}",
            lines[0]
        );
        let out = run("true");
        let all = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "under CI the test must fail: {all}");
        assert!(all.contains("CI=true"), "{all}");
    }

    #[test]
    fn scratch_dirs_are_fresh_and_removed_unless_kept() {
        let a = tempdir("sys-test").unwrap();
        let b = tempdir("sys-test").unwrap();
        assert_ne!(a.path(), b.path());
        assert!(a.path().is_dir());
        std::fs::write(a.path().join("f"), b"x").unwrap();
        let gone = a.path().to_path_buf();
        drop(a);
        assert!(!gone.exists());
        let kept = b.keep();
        assert!(kept.is_dir());
        std::fs::remove_dir_all(kept).unwrap();
    }

    #[test]
    fn random_bytes_are_reproducible_and_varied() {
        let a = random_bytes(1000, 42);
        assert_eq!(a.len(), 1000);
        assert_eq!(a, random_bytes(1000, 42));
        assert_ne!(a, random_bytes(1000, 43));
        assert_eq!(
            &random_bytes(13, 42)[..],
            &a[..13],
            "a prefix of the longer run"
        );
        let distinct: std::collections::BTreeSet<u8> =
            random_bytes(1 << 16, 7).into_iter().collect();
        assert_eq!(distinct.len(), 256);
    }

    #[test]
    fn a_free_port_can_be_bound() {
        let port = free_port().unwrap();
        assert_ne!(port, 0);
        std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    }

    #[test]
    fn stop_child_ends_a_running_child() {
        use std::os::unix::process::ExitStatusExt as _;
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert_eq!(stop_child(&mut child).signal(), Some(libc::SIGTERM));
    }
}
