//! Nothing is left behind: a stack run that ends normally, one that fails (a panic while the
//! stack is up), and a process killed with SIGKILL while its stack is up (no destructor runs,
//! as with Ctrl-C of `cargo test`) leave no scratch directory, no arena file and no process.
//! Its own binary: the check "nothing with my pid remains" needs no other test running.

use iolab_tiers::stack::{Stack, StackConfig};
use iolab_tiers::testutil::*;
use std::io::BufRead;
use std::path::Path;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "IOLAB_TIERS_LEAK_CHILD";

fn config(scratch: &ScratchDir, root: &Path) -> StackConfig {
    loopback_stack(scratch.join("stack"), root, Some(16)).expect("ODB artefacts")
}

/// Starts a stack, checks one 1 MiB response through it; returns the stack and the pids of
/// its processes.
fn run_one(scratch: &ScratchDir) -> (Stack, Vec<u32>) {
    let root = scratch.join("www");
    write_payloads(&root, &[1 << 20]).unwrap();
    let st = Stack::start(config(scratch, &root), None).unwrap();
    let r = Client::connect(st.cfg.listen("fe"))
        .unwrap()
        .request("GET", "/f1048576")
        .unwrap();
    assert!(r.body == payload(1 << 20));
    let pids = st.procs.iter().map(|(_, c)| c.id()).collect();
    (st, pids)
}

fn alive(pid: u32) -> bool {
    iolab_sys::process::exists(pid)
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
}

fn wait_gone(pids: &[u32]) {
    let t0 = Instant::now();
    while pids.iter().any(|&p| alive(p)) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "processes still running: {:?}",
            pids.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Run only as the child of `nothing_is_left_behind`: holds a stack until killed.
#[test]
#[ignore = "the child process of nothing_is_left_behind"]
fn child_holding_a_stack() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let scratch = scratch_dir("leak-child").unwrap();
    let (_st, pids) = run_one(&scratch);
    println!(
        "READY {}",
        pids.iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn nothing_is_left_behind() {
    if iolab_sys::testing::require_tool("nginx", "nginx").is_none() {
        return;
    }
    let me = std::process::id();
    let mut pids = Vec::new();

    // a normal run
    {
        let scratch = scratch_dir("leak-ok").unwrap();
        let (st, p) = run_one(&scratch);
        pids.extend(p);
        drop(st);
    }

    // a failing run: the test panics while the stack is up
    let failed = std::panic::catch_unwind(|| {
        let scratch = scratch_dir("leak-fail").unwrap();
        let (_st, p) = run_one(&scratch);
        std::fs::write(
            scratch.join("pids"),
            p.iter().map(|x| format!("{x}\n")).collect::<String>(),
        )
        .unwrap();
        let kept = std::env::temp_dir().join(format!("iolab-tiers-leakcheck-{me}"));
        std::fs::copy(scratch.join("pids"), &kept).unwrap();
        panic!("a failing test");
    });
    assert!(failed.is_err());
    let kept = std::env::temp_dir().join(format!("iolab-tiers-leakcheck-{me}"));
    pids.extend(
        std::fs::read_to_string(&kept)
            .unwrap()
            .lines()
            .map(|l| l.parse::<u32>().unwrap()),
    );
    std::fs::remove_file(&kept).unwrap();

    // a process SIGKILLed with its stack up: its nginx and agent die with it (parent-death
    // signal), what its destructors would have removed goes at the next scratch_dir
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_holding_a_stack",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let child_pid = child.id();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let child_pids: Vec<u32> = loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!(
                "the child exited before its stack was up: {:?}",
                child.wait()
            );
        }
        if let Some(p) = line.trim().strip_prefix("READY ") {
            break p.split(',').map(|x| x.parse().unwrap()).collect();
        }
    };
    assert!(
        !leftovers_of(child_pid).is_empty(),
        "the child made its scratch dir"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    wait_gone(&child_pids);
    let removed = cleanup_stale_scratch();
    assert!(
        removed
            .iter()
            .any(|p| p.to_string_lossy().contains(&format!("-{child_pid}-"))),
        "the stale sweep removed the killed child's scratch dir: {removed:?}"
    );

    wait_gone(&pids);
    for pid in pids.iter().chain(&child_pids).chain([&me, &child_pid]) {
        let left = leftovers_of(*pid);
        assert!(left.is_empty(), "pid {pid} left {left:?}");
    }
}
