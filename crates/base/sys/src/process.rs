//! Process plumbing the lab, tiers, disksim and the tests share: privilege, signals, stopping
//! a child, a process group, and what a child does between `fork` and `exec`.

use std::io;
use std::os::fd::AsRawFd as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// `s` as one word of a POSIX shell command line: as it is when it holds only characters
/// no shell treats specially, else in single quotes (a quote inside as `'\''`). For the
/// commands the lab hands to `sh -c` and to ssh, which runs them through the remote shell.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._:,+-=@%".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// True when this process runs with effective uid 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Sends `sig` to process `pid` (`pid > 0`: one process, never a group or "everyone").
pub fn signal(pid: u32, sig: i32) -> io::Result<()> {
    let pid = positive_pid(pid)?;
    // SAFETY: kill(2) with a positive pid targets that one process.
    crate::cvt(unsafe { libc::kill(pid, sig) }).map(drop)
}

/// Sends `sig` to every process of group `pgid` (`pgid > 1`: one we created, e.g. with
/// `Command::process_group(0)`; 0 and 1 would widen the target to our own group or to all).
pub fn signal_group(pgid: u32, sig: i32) -> io::Result<()> {
    let pgid = positive_pid(pgid)?;
    if pgid == 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to signal process group 1",
        ));
    }
    // SAFETY: kill(2) with a negative pid signals exactly the process group -pid (> 1).
    crate::cvt(unsafe { libc::kill(-pgid, sig) }).map(drop)
}

/// True while process `pid` exists, a zombie (exited, not yet reaped) included: its parent
/// may still act on it. A process of another user counts (EPERM).
pub fn exists(pid: u32) -> bool {
    let Ok(pid) = positive_pid(pid) else {
        return false;
    };
    // SAFETY: kill(2) with signal 0 sends nothing; it only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// True while process `pid` runs: it exists (a process of another user counts, EPERM) and
/// is not a zombie (it has exited and only waits to be reaped).
pub fn is_alive(pid: u32) -> bool {
    if !exists(pid) {
        return false;
    }
    // The state follows the command name, which ends with the last ')'.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    state != Some("Z") && state != Some("X")
}

fn positive_pid(pid: u32) -> io::Result<libc::pid_t> {
    match libc::pid_t::try_from(pid) {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{pid} is not a process id"),
        )),
    }
}

/// Stops `child`: SIGTERM, then up to `grace` for it to exit, then SIGKILL; waits for it
/// and returns how it ended. A child that already exited is only reaped.
pub fn terminate(child: &mut Child, grace: Duration) -> io::Result<ExitStatus> {
    if let Some(status) = child.try_wait()? {
        return Ok(status);
    }
    // It may exit between try_wait and here: ESRCH is then the expected answer.
    let _ = signal(child.id(), libc::SIGTERM);
    if let Some(status) = wait_until(child, Instant::now() + grace)? {
        return Ok(status);
    }
    let _ = child.kill();
    child.wait()
}

/// Waits for `child` to exit until `deadline`; `None` if it is still running then.
pub fn wait_until(child: &mut Child, deadline: Instant) -> io::Result<Option<ExitStatus>> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Stops the process group `leader` leads (it was started with `Command::process_group(0)`):
/// SIGTERM to the group, up to `grace` for the leader to exit, then SIGKILL to whatever is
/// left of the group (members the leader did not take down with it); reaps the leader.
pub fn terminate_group(leader: &mut Child, grace: Duration) -> io::Result<ExitStatus> {
    let pgid = leader.id();
    let _ = signal_group(pgid, libc::SIGTERM);
    let exited = wait_until(leader, Instant::now() + grace)?;
    // ESRCH when every member is gone: the expected answer.
    let _ = signal_group(pgid, libc::SIGKILL);
    match exited {
        Some(status) => Ok(status),
        None => leader.wait(),
    }
}

/// Makes the child `cmd` starts receive `sig` when the thread that spawned it exits
/// (`PR_SET_PDEATHSIG`), so that a killed parent, which runs no destructor, leaves no child
/// behind. If the parent is already gone when the child gets there, the child raises `sig`
/// itself. Other `pre_exec` hooks of `cmd` still run.
pub fn die_with_parent(cmd: &mut Command, sig: i32) {
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the hook runs in the forked child before exec, where only async-signal-safe
    // calls are allowed: prctl, getppid and raise are, and the closure allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, sig) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent died between fork and prctl: no signal will come.
            if libc::getppid() != parent {
                libc::raise(sig);
            }
            Ok(())
        });
    }
}

/// Makes the child `cmd` starts enter the network namespace at `ns_path` (e.g.
/// `/var/run/netns/<name>`) before exec. The namespace file is opened here, in the parent
/// (an error if it cannot be), close-on-exec: the program does not inherit it.
pub fn enter_net_namespace(cmd: &mut Command, ns_path: &Path) -> io::Result<()> {
    let f = std::fs::File::open(ns_path)?;
    // SAFETY: the hook runs in the forked child before exec: setns(2) on a descriptor the
    // parent opened (moved into the closure, so it stays open as long as the Command) is
    // async-signal-safe, and the closure allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

/// Moves the calling thread into the network namespace at `ns_path`; `setns(2)` changes this
/// thread only, and every socket it creates afterwards lives there.
pub fn enter_net_namespace_this_thread(ns_path: &Path) -> io::Result<()> {
    let f = std::fs::File::open(ns_path)?;
    // SAFETY: setns(2) on a descriptor we hold open; it moves only the calling thread.
    crate::cvt(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt as _;
    use std::process::Stdio;

    /// What sh reads back is the word given: plain words as they are, the rest quoted.
    #[test]
    fn shell_quote_gives_back_the_word() {
        assert_eq!(shell_quote("/usr/bin/iolab"), "/usr/bin/iolab");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        for word in ["a b", "it's", "$HOME", "x;y", "", "tab\there", "*"] {
            let out = Command::new("sh")
                .args(["-c", &format!("printf %s {}", shell_quote(word))])
                .output()
                .unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), word);
        }
    }

    fn sleeper(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]).stdin(Stdio::null());
        c
    }

    #[test]
    fn terminate_stops_a_child_that_obeys_sigterm() {
        let mut child = sleeper("exec sleep 30").spawn().unwrap();
        let t0 = Instant::now();
        let status = terminate(&mut child, Duration::from_secs(10)).unwrap();
        assert_eq!(status.signal(), Some(libc::SIGTERM));
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        // Reaped: a second call only reports the same end.
        assert!(terminate(&mut child, Duration::ZERO).is_ok());
    }

    #[test]
    fn terminate_kills_a_child_that_ignores_sigterm() {
        let mut child = sleeper("trap '' TERM; echo ready; while :; do sleep 0.05; done")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // Wait until the trap is installed, or SIGTERM would end the shell at once.
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "ready");
        let status = terminate(&mut child, Duration::from_millis(200)).unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn signals_only_real_targets() {
        assert!(signal(0, 0).is_err(), "pid 0 is our own group");
        assert!(signal(u32::MAX, 0).is_err(), "would be -1: everyone");
        assert!(signal_group(1, 0).is_err());
        assert!(is_alive(std::process::id()));
        assert!(!is_alive(0));
        assert!(exists(std::process::id()) && !exists(0) && !exists(u32::MAX));
        let mut child = sleeper("exit 0").spawn().unwrap();
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        while is_alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!is_alive(pid), "exited child {pid} still seen running");
        assert!(
            exists(pid),
            "an exited child not yet reaped is a zombie: it exists"
        );
        child.wait().unwrap();
        assert!(!exists(pid), "reaped child {pid} still exists");
        let _ = is_root(); // either answer is right; it must not panic
    }

    #[test]
    fn terminate_group_stops_every_member() {
        let mut leader = sleeper("sleep 30 & echo $!; wait")
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(leader.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let member: u32 = line.trim().parse().unwrap();
        assert!(is_alive(member));
        let t0 = Instant::now();
        terminate_group(&mut leader, Duration::from_secs(10)).unwrap();
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        // The member is init's child now: dead once it is a zombie (or reaped).
        let deadline = Instant::now() + Duration::from_secs(5);
        while is_alive(member) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!is_alive(member), "group member {member} survived");
    }

    #[test]
    fn die_with_parent_keeps_the_child_running_while_the_parent_lives() {
        let mut cmd = sleeper("exit 3");
        die_with_parent(&mut cmd, libc::SIGKILL);
        assert_eq!(cmd.status().unwrap().code(), Some(3));
    }

    #[test]
    fn entering_a_missing_namespace_fails_in_the_parent() {
        let mut cmd = sleeper("exit 0");
        let e = enter_net_namespace(&mut cmd, Path::new("/nonexistent/netns/x")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(enter_net_namespace_this_thread(Path::new("/nonexistent/netns/x")).is_err());
    }
}
