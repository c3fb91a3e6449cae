//! One host reached with OpenSSH: remote commands with deadlines, leased remote processes,
//! the host's clock offset and machine description.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};

use crate::inventory::Host;

/// Deadline of the TCP connect and SSH handshake of every session.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Keep-alives the client sends on a quiet session, and how many may go unanswered before
/// ssh gives up on a host that vanished: 2 s x 3.
pub const ALIVE_INTERVAL_S: u32 = 2;
pub const ALIVE_COUNT: u32 = 3;
/// Round trips of the clock-offset measurement (the one with the shortest round trip
/// counts, as NTP's clock filter keeps its best sample).
pub const CLOCK_SAMPLES: usize = 5;

/// The first lines a leased process's wrapper writes on its standard output.
const LEASE_START: &str = "iolab-lease start ";
const LEASE_PID: &str = "iolab-lease pid ";

/// How to reach one host.
#[derive(Debug, Clone)]
pub struct Ssh {
    pub host: Host,
    known_hosts: PathBuf,
    /// Accept a host's key the first time (into `known_hosts`, a file the lab owns);
    /// false: the key must already be in `known_hosts`.
    accept_new: bool,
    /// The socket of this host's master connection ([`Ssh::start_master`]): every later
    /// session goes over it instead of a new TCP connection and handshake each.
    control: Option<PathBuf>,
}

/// A master connection (`ssh -M -N`): killed when dropped, and with the controller
/// (PR_SET_PDEATHSIG), which ends every session over it.
#[derive(Debug)]
pub struct Master {
    child: Child,
    socket: PathBuf,
}

impl Drop for Master {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// A word quoted for a POSIX shell.
pub use iolab_sys::process::shell_quote as quote;

/// `argv` as one shell command line.
pub fn shell_line(argv: &[OsString]) -> String {
    argv.iter()
        .map(|a| quote(&a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ")
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Runs `cmd` (its stdin fed `input`) to its end or until `limit`, then kills it: (status,
/// stdout, stderr). Both outputs are read while it runs, so a large one cannot block it.
pub fn output_within(
    mut cmd: Command,
    input: Option<Vec<u8>>,
    limit: Duration,
) -> anyhow::Result<(ExitStatus, Vec<u8>, String)> {
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    iolab_sys::process::die_with_parent(&mut cmd, libc::SIGKILL);
    let mut child = cmd.spawn().context("starting ssh")?;
    if let (Some(mut stdin), Some(data)) = (child.stdin.take(), input) {
        std::thread::spawn(move || stdin.write_all(&data));
    }
    let reader = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = reader(Box::new(child.stdout.take().expect("piped")));
    let err = reader(Box::new(child.stderr.take().expect("piped")));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("no answer within {:.0} s", limit.as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = out.join().unwrap_or_default();
    let err = String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned();
    Ok((status, out, err))
}

impl Ssh {
    pub fn new(host: &Host, known_hosts: &Path, accept_new: bool) -> Ssh {
        Ssh {
            host: host.clone(),
            known_hosts: known_hosts.to_path_buf(),
            accept_new,
            control: None,
        }
    }

    /// Opens the master connection with its socket at `socket` (keep the path short: a
    /// Unix socket's is at most 107 bytes) and sends every later session over it.
    pub fn start_master(&mut self, socket: &Path) -> anyhow::Result<Master> {
        let mut cmd = self.base();
        cmd.args(["-M", "-N", "-o", "ControlPersist=no", "-o"])
            .arg(format!("ControlPath={}", socket.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        iolab_sys::process::die_with_parent(&mut cmd, libc::SIGKILL);
        let child = cmd
            .spawn()
            .with_context(|| format!("ssh to {}", self.host.name))?;
        let mut master = Master {
            child,
            socket: socket.to_path_buf(),
        };
        let deadline = Instant::now() + CONNECT_TIMEOUT * 2;
        while !socket.exists() {
            if let Some(status) = master.child.try_wait()? {
                let mut err = String::new();
                if let Some(mut e) = master.child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                bail!(
                    "ssh {}@{} ({}): {status}: {}",
                    self.host.user,
                    self.host.address,
                    self.host.name,
                    err.trim()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{}: no SSH connection within {:?}",
                    self.host.name,
                    CONNECT_TIMEOUT * 2
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.control = Some(socket.to_path_buf());
        Ok(master)
    }

    /// `ssh` with the options every session uses, up to the destination.
    fn base(&self) -> Command {
        let mut c = Command::new("ssh");
        let opt = |c: &mut Command, o: String| {
            c.arg("-o").arg(o);
        };
        opt(&mut c, "BatchMode=yes".into());
        opt(
            &mut c,
            format!("ConnectTimeout={}", CONNECT_TIMEOUT.as_secs()),
        );
        opt(&mut c, format!("ServerAliveInterval={ALIVE_INTERVAL_S}"));
        opt(&mut c, format!("ServerAliveCountMax={ALIVE_COUNT}"));
        opt(
            &mut c,
            format!("UserKnownHostsFile={}", self.known_hosts.display()),
        );
        opt(
            &mut c,
            format!(
                "StrictHostKeyChecking={}",
                if self.accept_new { "accept-new" } else { "yes" }
            ),
        );
        opt(&mut c, "LogLevel=ERROR".into());
        if let Some(socket) = &self.control {
            opt(&mut c, format!("ControlPath={}", socket.display()));
            opt(&mut c, "ControlMaster=no".into());
        }
        if let Some(id) = &self.host.identity {
            c.arg("-i").arg(id);
            opt(&mut c, "IdentitiesOnly=yes".into());
        }
        c.arg("-p")
            .arg(self.host.port.to_string())
            .arg("-l")
            .arg(&self.host.user)
            .arg(self.host.address.to_string());
        c
    }

    /// `ssh HOST -- SCRIPT` (the remote login shell runs `script`).
    pub fn command(&self, script: &str) -> Command {
        let mut c = self.base();
        c.arg("--").arg(script);
        c
    }

    /// Runs `script` on the host within `limit`: its standard output, or an error with
    /// the host, the exit status and ssh's or the script's stderr.
    pub fn run(&self, script: &str, limit: Duration) -> anyhow::Result<Vec<u8>> {
        self.run_with_input(script, None, limit)
    }

    /// As [`Ssh::run`], with `input` on the script's standard input.
    pub fn run_with_input(
        &self,
        script: &str,
        input: Option<Vec<u8>>,
        limit: Duration,
    ) -> anyhow::Result<Vec<u8>> {
        let what = || {
            format!(
                "ssh {}@{} ({})",
                self.host.user, self.host.address, self.host.name
            )
        };
        let (status, out, err) =
            output_within(self.command(script), input, limit).with_context(what)?;
        if !status.success() {
            bail!("{}: {script:?} failed ({status}): {}", what(), err.trim());
        }
        Ok(out)
    }

    /// The host's clock minus ours, seconds, and the round trip it was measured over: over
    /// one session, `CLOCK_SAMPLES` times "send a line, read the host's time", keeping the
    /// sample with the shortest round trip (its midpoint is the best estimate).
    pub fn clock_offset(&self) -> anyhow::Result<(f64, f64)> {
        let mut cmd = self.command(&format!(
            "i=0; while [ $i -lt {CLOCK_SAMPLES} ] && read -r _; do date +%s.%N; i=$((i+1)); done"
        ));
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        iolab_sys::process::die_with_parent(&mut cmd, libc::SIGKILL);
        let mut child = cmd.spawn().context("starting ssh")?;
        let mut stdin = child.stdin.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut best: Option<(f64, f64)> = None;
        let mut result = Ok(());
        for _ in 0..CLOCK_SAMPLES {
            let t0 = unix_now();
            if let Err(e) = stdin.write_all(b"x\n").and_then(|_| stdin.flush()) {
                result = Err(anyhow::anyhow!("writing to ssh: {e}"));
                break;
            }
            // The first answer also waits for the session to be set up.
            let line = match rx.recv_timeout(CONNECT_TIMEOUT * 2) {
                Ok(Ok(l)) => l,
                _ => {
                    result = Err(anyhow::anyhow!(
                        "no time from the host within {:?}",
                        CONNECT_TIMEOUT * 2
                    ));
                    break;
                }
            };
            let t1 = unix_now();
            let Ok(remote) = line.trim().parse::<f64>() else {
                result = Err(anyhow::anyhow!("the host's `date +%s.%N` said {line:?}"));
                break;
            };
            let rtt = t1 - t0;
            if best.is_none_or(|(_, r)| rtt < r) {
                best = Some((remote - (t0 + t1) / 2.0, rtt));
            }
        }
        drop(stdin);
        let _ = child.kill();
        let _ = child.wait();
        result.with_context(|| format!("clock offset of {}", self.host.name))?;
        best.context("no clock sample")
    }

    /// What the host is: kernel, CPUs, CPU model, memory, hostname (as its own tools say).
    pub fn machine(&self) -> anyhow::Result<BTreeMap<String, String>> {
        let out = self.run(
            "echo \"kernel=$(uname -srm)\"; echo \"cpus=$(nproc)\"; echo \"cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)\"; echo \"mem_total=$(sed -n 's/^MemTotal:[[:space:]]*//p' /proc/meminfo)\"; echo \"hostname=$(uname -n)\"",
            CONNECT_TIMEOUT * 2,
        )?;
        Ok(String::from_utf8_lossy(&out)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect())
    }

    /// Starts `argv` on the host under a lease (see the crate's docs), pinned to `cpus`
    /// when given, its stdout and stderr appended to the remote file `log`.
    pub fn spawn_leased(
        &self,
        argv: &[OsString],
        cpus: &[usize],
        log: &str,
    ) -> anyhow::Result<Leased> {
        let pin = if cpus.is_empty() {
            String::new()
        } else {
            let list: Vec<String> = cpus.iter().map(usize::to_string).collect();
            format!("taskset -c {} ", list.join(","))
        };
        // fd 3 is the session's stdin: it reaches end-of-file when the controller (or its
        // ssh) is gone, and the watcher then ends the command's whole session.
        let script = format!(
            "exec 3<&0 </dev/null; echo \"{LEASE_START}$(date +%s.%N)\"; setsid {pin}{} >>{} 2>&1 & p=$!; echo \"{LEASE_PID}$p\"; (cat <&3 >/dev/null 2>&1; kill -TERM -$p 2>/dev/null; sleep 1; kill -KILL -$p 2>/dev/null) >/dev/null 2>&1 & w=$!; wait $p; rc=$?; kill $w 2>/dev/null; exit $rc",
            shell_line(argv),
            quote(log)
        );
        let mut cmd = self.command(&script);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        iolab_sys::process::die_with_parent(&mut cmd, libc::SIGKILL);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("ssh to {}", self.host.name))?;
        let stdin = child.stdin.take();
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut err = child.stderr.take().expect("piped");
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let mut l = Leased {
            host: self.host.name.clone(),
            child,
            stdin,
            remote_pid: None,
            remote_start_unix: None,
            stderr: Some(stderr),
        };
        let deadline = Instant::now() + CONNECT_TIMEOUT * 2;
        while l.remote_pid.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(t) = line.strip_prefix(LEASE_START) {
                        l.remote_start_unix = t.trim().parse().ok();
                    } else if let Some(p) = line.strip_prefix(LEASE_PID) {
                        l.remote_pid = p.trim().parse().ok();
                    }
                }
                Err(_) => {
                    let why = l.stop_and_stderr();
                    bail!(
                        "{}: the remote command did not start within {:?}: {}",
                        self.host.name,
                        CONNECT_TIMEOUT * 2,
                        why.trim()
                    );
                }
            }
        }
        Ok(l)
    }
}

/// A process on a host that lives at most as long as this value and its controller.
#[derive(Debug)]
pub struct Leased {
    pub host: String,
    child: Child,
    stdin: Option<ChildStdin>,
    /// Its pid on the host (the leader of its own session there).
    pub remote_pid: Option<u32>,
    /// The host's clock when it started, Unix seconds.
    pub remote_start_unix: Option<f64>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Leased {
    /// The remote command's exit status if it has ended (its ssh session has), without
    /// waiting.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits for the remote command to end by itself, at most `limit` (then stops it):
    /// its exit status.
    pub fn wait(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait()? {
                return Ok(s);
            }
            if Instant::now() > deadline {
                let why = self.stop_and_stderr();
                bail!(
                    "{}: still running after {:.0} s; stopped ({})",
                    self.host,
                    limit.as_secs_f64(),
                    why.trim()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Ends the lease: the remote side sees end-of-file and ends the command's session;
    /// ssh itself is killed if it has not gone within a few seconds. Returns ssh's stderr.
    pub fn stop_and_stderr(&mut self) -> String {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(3);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }

    pub fn stop(&mut self) {
        let _ = self.stop_and_stderr();
    }
}

impl Drop for Leased {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_quoted_for_the_shell() {
        assert_eq!(quote("/usr/bin/iolab"), "/usr/bin/iolab");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
        assert_eq!(
            shell_line(&["a b".into(), "-c".into(), "$x".into()]),
            "'a b' -c '$x'"
        );
    }

    #[test]
    fn the_ssh_command_is_batch_mode_with_the_labs_known_hosts() {
        let h = Host {
            name: "c1".into(),
            address: "10.0.0.3".parse().unwrap(),
            user: "bench".into(),
            port: 2222,
            identity: Some("/k/id".into()),
            cpus: vec![],
            iolab: None,
            copy: true,
        };
        let c = Ssh::new(&h, Path::new("/run/kh"), true).command("true");
        let args: Vec<String> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let joined = args.join(" ");
        for want in [
            "-o BatchMode=yes",
            "-o UserKnownHostsFile=/run/kh",
            "-o StrictHostKeyChecking=accept-new",
            "-i /k/id",
            "-p 2222 -l bench 10.0.0.3 -- true",
        ] {
            assert!(joined.contains(want), "{want} in {joined}");
        }
    }

    /// A command that takes too long is killed at its deadline.
    #[test]
    fn output_within_kills_at_the_deadline() {
        let mut c = Command::new("sh");
        c.args(["-c", "sleep 5"]);
        let t0 = Instant::now();
        let e = output_within(c, None, Duration::from_millis(200)).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert!(format!("{e}").contains("within"), "{e}");
        let mut c = Command::new("sh");
        c.args(["-c", "cat; echo err >&2"]);
        let (s, out, err) = output_within(c, Some(b"in".to_vec()), Duration::from_secs(5)).unwrap();
        assert!(s.success());
        assert_eq!(out, b"in");
        assert_eq!(err.trim(), "err");
    }
}
