//! Helpers shared by the tests and the bench: locating the built ODB artefacts, a minimal
//! HTTP/1.1 client that returns the exact bytes it received, payload files.

use crate::stack::{AgentProgram, Odb, Place, StackConfig};
use anyhow::{bail, Context};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};

/// `libiolab_odb.so` and the agent program, next to the running executable (target/<profile>
/// or target/<profile>/deps), built with cargo first (a fresh clone has none; an existing
/// one may be older than the source under test).
pub fn odb_artifacts() -> anyhow::Result<(PathBuf, AgentProgram)> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().context("exe dir")?.to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    if let Some(lib) = std::env::var_os("IOLAB_ODB_LIB") {
        return Ok((lib.into(), agent_cmd(&dir)));
    }
    let lib = dir.join("libiolab_odb.so");
    // Always through cargo (a no-op when up to date): a library left from an earlier build
    // would be preloaded into the tests' nginx while they claim to test this source.
    // (`cargo build` of the workspace does not rebuild the cdylib.)
    {
        let release = dir.ends_with("release");
        let mut c = std::process::Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()));
        c.args(["build", "-q", "-p", "iolab-odb", "-p", "iolab-odb-preload"]);
        if release {
            c.arg("--release");
        }
        let st = c
            .status()
            .context("running cargo build for the ODB library")?;
        if !st.success() || !lib.exists() {
            bail!(
                "cargo build of the ODB library failed (or made no {})",
                lib.display()
            );
        }
    }
    Ok((lib, agent_cmd(&dir)))
}

fn agent_cmd(dir: &Path) -> AgentProgram {
    let a = dir.join("iolab-odb-agent");
    if a.exists() {
        return AgentProgram::Standalone(a);
    }
    // the iolab binary itself: `iolab tiers agent`
    AgentProgram::Iolab(std::env::current_exe().unwrap_or_default())
}

/// A stack of the three tiers on loopback, for the tests: FE, IS and BE on `.11`, `.12`,
/// `.13` of a 127.x.y.0/24 of its own (x in 100..200), where a port (the FE's; IS +1, BE +2,
/// agent +3) was free; `odb_mib`: ODB with an agent of that many MiB (None: vanilla nginx).
pub fn loopback_stack(
    dir: PathBuf,
    root: &Path,
    odb_mib: Option<u64>,
) -> anyhow::Result<StackConfig> {
    let (net, port) = free_loopback_place();
    let at = |h: u8| Place {
        ns: None,
        addr: Ipv4Addr::new(net[0], net[1], net[2], h),
    };
    let odb = match odb_mib {
        Some(mib) => {
            let (lib, agent) = odb_artifacts()?;
            Some(Odb {
                lib,
                agent,
                agent_memory_mib: mib,
                threshold: 4096,
                file_refs: true,
            })
        }
        None => None,
    };
    Ok(StackConfig {
        fe: at(11),
        is: at(12),
        be: at(13),
        port,
        dir,
        root: root.to_path_buf(),
        odb,
        loopback: true,
        workers: 1,
        skip_be: false,
        fe_listen: None,
        domain: None,
        cpus: None,
        php: false,
    })
}

/// A loopback /24 picked at random (so that concurrent tests rarely meet) and a port free on
/// its `.11` below 65001 (the tiers take the three above it).
fn free_loopback_place() -> ([u8; 3], u16) {
    static DRAWS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = nanos
        ^ (u64::from(std::process::id()) << 32)
        ^ DRAWS
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        | 1;
    loop {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let net = [127, 100 + (x % 100) as u8, ((x >> 8) % 250) as u8];
        let fe = Ipv4Addr::new(net[0], net[1], net[2], 11);
        let Ok(l) = std::net::TcpListener::bind((fe, 0)) else {
            continue;
        };
        match l.local_addr() {
            Ok(a) if a.port() <= 65000 => return (net, a.port()),
            _ => continue,
        }
    }
}

/// A response as received.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// The body after de-chunking.
    pub body: Vec<u8>,
    pub chunked: bool,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one response (for `head`: no body) from a buffered connection.
pub fn read_response(r: &mut BufReader<TcpStream>, head: bool) -> anyhow::Result<Response> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        bail!("connection closed before a response");
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad status line {line:?}"))?;
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let mut resp = Response {
        status,
        headers,
        body: Vec::new(),
        chunked: false,
    };
    if head {
        return Ok(resp);
    }
    if resp
        .header("transfer-encoding")
        .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
    {
        resp.chunked = true;
        loop {
            let mut sz = String::new();
            r.read_line(&mut sz)?;
            let n = usize::from_str_radix(sz.trim().split(';').next().unwrap_or(""), 16)
                .with_context(|| format!("bad chunk size {sz:?}"))?;
            let mut chunk = vec![0u8; n + 2];
            r.read_exact(&mut chunk)?;
            if n == 0 {
                break;
            }
            resp.body.extend_from_slice(&chunk[..n]);
        }
    } else if let Some(cl) = resp.header("content-length") {
        let n: usize = cl.parse()?;
        resp.body = vec![0u8; n];
        r.read_exact(&mut resp.body)
            .with_context(|| format!("body of {n} bytes"))?;
    }
    Ok(resp)
}

/// A keep-alive client connection.
pub struct Client {
    pub r: BufReader<TcpStream>,
}

impl Client {
    pub fn connect(addr: SocketAddrV4) -> anyhow::Result<Client> {
        let s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(20)))?;
        Ok(Client {
            r: BufReader::with_capacity(1 << 16, s),
        })
    }
    pub fn send(&mut self, raw: &[u8]) -> anyhow::Result<()> {
        self.r.get_mut().write_all(raw)?;
        Ok(())
    }
    pub fn request(&mut self, method: &str, path: &str) -> anyhow::Result<Response> {
        self.send(format!("{method} {path} HTTP/1.1\r\nHost: tiers\r\n\r\n").as_bytes())?;
        read_response(&mut self.r, method == "HEAD")
    }
}

/// Deterministic payload bytes for a size (the same in every run, different per size).
pub fn payload(size: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ size as u64;
    let mut v = Vec::with_capacity(size);
    while v.len() < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(size);
    v
}

/// Writes `f<size>` files into `root`.
pub fn write_payloads(root: &Path, sizes: &[usize]) -> anyhow::Result<()> {
    std::fs::create_dir_all(root)?;
    for &s in sizes {
        let p = root.join(format!("f{s}"));
        if std::fs::metadata(&p)
            .map(|m| m.len() as usize != s)
            .unwrap_or(true)
        {
            std::fs::write(&p, payload(s))?;
        }
    }
    Ok(())
}

/// Prefix of the scratch directories tests and runs make in the temp dir:
/// `iolab-tiers-test-<pid>-<tag>`.
pub const SCRATCH_PREFIX: &str = "iolab-tiers-test-";

/// A directory in the temp dir owned by this process, removed with everything in it when
/// the guard is dropped (also while a failing test unwinds). A process killed before that
/// (Ctrl-C of `cargo test`, SIGKILL) leaves it behind: `cleanup_stale_scratch`, called by
/// `scratch_dir`, removes those of dead pids at the next run.
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh `iolab-tiers-test-<pid>-<tag>` directory (emptied if it exists), after removing
/// the scratch directories of dead processes.
pub fn scratch_dir(tag: &str) -> anyhow::Result<ScratchDir> {
    cleanup_stale_scratch();
    let d = std::env::temp_dir().join(format!("{SCRATCH_PREFIX}{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    Ok(ScratchDir(d))
}

/// Removes `iolab-tiers-test-<pid>-*` directories (temp dir) and `iolab-tiers-odb-<pid>-*`
/// arena files (temp dir and /dev/shm) whose pid is dead; returns what it removed. Never
/// touches another live process's files or names without our prefixes.
pub fn cleanup_stale_scratch() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for (dir, prefix) in [
        (std::env::temp_dir(), SCRATCH_PREFIX),
        (std::env::temp_dir(), ARENA_PREFIX),
        (PathBuf::from("/dev/shm"), ARENA_PREFIX),
    ] {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = n
                .strip_prefix(prefix)
                .and_then(|r| r.split('-').next())
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if iolab_sys::process::exists(pid) {
                continue;
            }
            let p = e.path();
            let gone = if e.file_type().is_ok_and(|t| t.is_dir()) {
                std::fs::remove_dir_all(&p).is_ok()
            } else {
                std::fs::remove_file(&p).is_ok()
            };
            if gone {
                out.push(p);
            }
        }
    }
    out
}

pub use crate::stack::ARENA_PREFIX;

/// Everything in the temp dir and /dev/shm whose name carries one of our prefixes and
/// `pid` (what a process with that pid left behind).
pub fn leftovers_of(pid: u32) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in [std::env::temp_dir(), PathBuf::from("/dev/shm")] {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            for prefix in [SCRATCH_PREFIX, ARENA_PREFIX] {
                if n.strip_prefix(prefix)
                    .and_then(|r| r.split('-').next())
                    .is_some_and(|p| p == pid.to_string())
                {
                    out.push(e.path());
                }
            }
        }
    }
    out
}

/// The response sizes `tiers bench` measures, and those of `--quick`.
pub const FULL_SIZES: [usize; 7] = [1024, 3072, 4096, 16384, 65536, 262144, 1 << 20];
pub const QUICK_SIZES: [usize; 4] = [1024, 3072, 65536, 1 << 20];

/// Every size either bench may ask for (the payloads `tiers up` writes).
pub fn all_sizes() -> Vec<usize> {
    let mut v: Vec<usize> = FULL_SIZES.to_vec();
    v.extend(QUICK_SIZES);
    v.sort_unstable();
    v.dedup();
    v
}
