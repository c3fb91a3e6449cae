//! Server CPU time per request at a fixed offered rate: the figure that still separates the
//! models when the client saturates its core first (on 2 cores, requests/s ranks clients).
//!
//! After the matrix, each server is started again and offered the same open-loop rate
//! (requests scheduled at i / rate, whatever the answers do), below every server's
//! saturation: by default half the lowest peak any server reached in this run (new
//! connection: the best small-file close-mode rate of each server; keep-alive: its
//! keep-alive rate), or a fixed `--efficiency-rate`. The server's CPU time is read from its
//! own counters before and after each repeat, summed over every process of its process
//! group (nginx's workers included) and every thread (exited ones included): the kernel's
//! per-process CPU clock (`clock_getcpuclockid`, nanoseconds), or `/proc/PID/stat`
//! utime + stime (clock ticks) where that clock cannot be read, plus the CPU of the
//! children each process has reaped (cutime + cstime: a server forking per connection,
//! such as busybox httpd under `--target`). CPU seconds over requests answered is the
//! figure; the spread is over the repeats.
//!
//! On loopback part of the kernel's TCP work (the receive path of a segment) runs in the
//! sender's context, so some of the server's network-stack cost is charged to the client:
//! the figure is the server process's own CPU, the same accounting for every server.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::options::{Options, Profile};
use crate::point::{settle, Client};
use iolab_sys::percentile::median;

use crate::results::{min_max, ConnMode, FileKind, Results};
use crate::server::{Launch, ServerProc, Target};

pub use crate::results::{EffRepeat, EffRow, Efficiency};

/// Half the lowest peak among the servers measured, per mode: (rate, which server set it,
/// its peak). None for a mode no server was measured in.
pub fn default_rates(r: &Results) -> BTreeMap<ConnMode, (f64, String, f64)> {
    let mut out = BTreeMap::new();
    for mode in ConnMode::REPORT_ORDER {
        let mut peaks: BTreeMap<&str, f64> = BTreeMap::new();
        for p in r
            .points
            .iter()
            .filter(|p| p.file == FileKind::Small && p.mode == mode)
        {
            let e = peaks.entry(p.model.as_str()).or_insert(0.0);
            *e = e.max(p.metrics.rps);
        }
        let slowest = peaks
            .into_iter()
            .filter(|(_, v)| *v > 0.0)
            .min_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((name, peak)) = slowest {
            out.insert(mode, ((peak * 0.5).max(50.0), name.to_string(), peak));
        }
    }
    out
}

/// The processes of a process group (from /proc).
pub fn group_pids(pgid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| stat_fields(&s).and_then(|f| f.get(2)?.parse::<i32>().ok()))
                == Some(pgid)
        })
        .collect()
}

/// The fields of /proc/PID/stat after the command name (which may hold spaces and ')'):
/// index 0 is `state` (field 3 of proc(5)).
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let close = stat.rfind(')')?;
    Some(stat[close + 1..].split_whitespace().collect())
}

/// Two fields of /proc/PID/stat summed, by their index in [`stat_fields`], in seconds
/// (the fields count clock ticks).
fn proc_stat_seconds(pid: i32, a: usize, b: usize) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f = stat_fields(&s)?;
    let x: u64 = f.get(a)?.parse().ok()?;
    let y: u64 = f.get(b)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as f64 } else { 100.0 };
    Some((x + y) as f64 / hz)
}

/// utime + stime of a whole process (all its threads, exited ones included), in seconds,
/// from /proc/PID/stat (proc(5) fields 14 and 15, in clock ticks).
pub fn proc_stat_cpu(pid: i32) -> Option<f64> {
    proc_stat_seconds(pid, 11, 12)
}

/// cutime + cstime of a process: the CPU of the children it has waited for (proc(5)
/// fields 16 and 17), which is where a server that forks per connection (busybox httpd)
/// spends its time.
pub fn proc_stat_children_cpu(pid: i32) -> Option<f64> {
    proc_stat_seconds(pid, 13, 14)
}

/// The CPU time of a whole process (all threads, exited ones included), in seconds, from
/// its kernel CPU clock: nanosecond resolution.
pub fn clock_cpu(pid: i32) -> Option<f64> {
    let mut clk: libc::clockid_t = 0;
    // SAFETY: clock_getcpuclockid writes the clock id into `clk`, which we own.
    if unsafe { libc::clock_getcpuclockid(pid, &mut clk) } != 0 {
        return None;
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec we own; `clk` came from the kernel.
    if unsafe { libc::clock_gettime(clk, &mut ts) } != 0 {
        return None;
    }
    Some(ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9)
}

/// Which counter `cpu_of` read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Clock,
    ProcStat,
}

pub fn cpu_of(pid: i32) -> Option<(f64, Source)> {
    clock_cpu(pid)
        .map(|c| (c, Source::Clock))
        .or_else(|| proc_stat_cpu(pid).map(|c| (c, Source::ProcStat)))
}

/// CPU seconds of every process in a group, by pid: its own, and its reaped children's.
#[derive(Debug, Clone, Default)]
pub struct GroupCpu {
    pub by_pid: BTreeMap<i32, f64>,
    /// cutime + cstime by pid (children it waited for).
    pub children_by_pid: BTreeMap<i32, f64>,
    pub proc_stat_only: bool,
}

impl GroupCpu {
    pub fn read(pgid: i32) -> GroupCpu {
        let mut g = GroupCpu::default();
        for pid in group_pids(pgid) {
            if let Some((c, src)) = cpu_of(pid) {
                g.by_pid.insert(pid, c);
                g.proc_stat_only |= src == Source::ProcStat;
                let reaped = proc_stat_children_cpu(pid).unwrap_or(0.0);
                g.children_by_pid.insert(pid, reaped);
            }
        }
        g
    }

    /// Everything the group has spent: its live processes' own CPU and what they reaped.
    fn total(&self) -> f64 {
        self.by_pid.values().sum::<f64>() + self.children_by_pid.values().sum::<f64>()
    }

    /// CPU spent between `self` (earlier) and `later`: the difference of the totals. A
    /// process that started in between counts whole; one that ended in between counts
    /// through its parent's reaped-children time when a member of the group reaped it
    /// (a server forking per connection), and is lost otherwise. Never negative.
    pub fn since(&self, later: &GroupCpu) -> f64 {
        (later.total() - self.total()).max(0.0)
    }
}

/// Durations and repeats of the efficiency pass for a profile; `repeat` (`--repeat`), when
/// given, is the repeats here too, so that `lab --compare` has as many samples of Figure
/// 1b's rows as of the matrix's points.
pub fn plan_for(profile: Profile, repeat: Option<usize>) -> (Duration, usize) {
    let (duration, repeats) = match profile {
        Profile::Tiny => (Duration::from_millis(500), 2),
        Profile::Full => (Duration::from_secs(5), 3),
        Profile::Quick => (Duration::from_millis(1500), 3),
    };
    (duration, repeat.unwrap_or(repeats).max(1))
}

/// Open-loop connection cap.
pub const CONNECTIONS: usize = 50;

/// Measures the server `srv` at `rate` in `mode`: `repeats` runs of `duration` from
/// `client`; its CPU time is its process group's.
pub fn measure(
    srv: &ServerProc,
    mode: ConnMode,
    rate: f64,
    (duration, repeats): (Duration, usize),
    client: &Client,
) -> anyhow::Result<(EffRow, bool)> {
    let Some(pgid) = srv.pgid() else {
        anyhow::bail!(
            "{}: server CPU not measured (not the lab's child)",
            srv.name
        );
    };
    let mut reps = Vec::new();
    let mut proc_stat_only = false;
    for _ in 0..repeats {
        let mut cfg = client.load_on(srv, FileKind::Small, mode, CONNECTIONS);
        cfg.requests = None;
        cfg.duration = Some(duration);
        cfg.rate = Some(rate);
        cfg.timeout = Duration::from_secs(5);
        cfg.keep_records = false;
        let before = GroupCpu::read(pgid);
        let t0 = Instant::now();
        let report = iolab_load::run(&cfg)?;
        let elapsed = t0.elapsed().as_secs_f64();
        let after = GroupCpu::read(pgid);
        proc_stat_only |= before.proc_stat_only || after.proc_stat_only;
        if after.by_pid.is_empty() {
            anyhow::bail!(
                "{}: no process left in its group to read the CPU time of",
                srv.name
            );
        }
        let cpu = before.since(&after);
        let errors = report.error_count;
        reps.push(EffRepeat {
            ok: report.ok,
            errors,
            cpu_s: cpu,
            elapsed_s: elapsed,
            achieved_rps: report.ok as f64 / elapsed.max(1e-9),
            us_per_request: if report.ok > 0 {
                cpu * 1e6 / report.ok as f64
            } else {
                0.0
            },
            client_cpu_s: report.client_cpu_s,
            errors_by_kind: report.errors.clone(),
        });
        // Let the connections of this repeat close before the next one is measured.
        std::thread::sleep(Duration::from_millis(100));
    }
    let vals: Vec<f64> = reps
        .iter()
        .filter(|r| r.ok > 0)
        .map(|r| r.us_per_request)
        .collect();
    Ok((
        EffRow {
            server: srv.name.clone(),
            mode,
            rate,
            low: false,
            us_per_request: median(&vals).unwrap_or(0.0),
            spread: min_max(vals.iter().copied()),
            repeats: reps,
        },
        proc_stat_only,
    ))
}

/// The second rate of a mode: a tenth of the lowest peak (at least 20 requests/s, so a
/// short run still answers a few dozen).
pub fn low_rate(peak: f64) -> f64 {
    (peak * 0.1).max(20.0).round()
}

/// Rates measured per mode: the main one and, unless the rate is fixed, the low one. The
/// time the pass needs is reserved from the profile's budget with it.
pub const RATES_PER_MODE: usize = 2;

/// The offered rates of each mode: `--efficiency-rate`, or half and a tenth of the lowest
/// peak in this run; with the sentence saying which.
fn rates(results: &Results, fixed: Option<f64>, e: &mut Efficiency) {
    let defaults = default_rates(results);
    let mut basis = Vec::new();
    for mode in ConnMode::REPORT_ORDER {
        let label = mode.label();
        match (fixed, defaults.get(&mode)) {
            (Some(r), _) => {
                e.rates.insert(mode, r);
                basis.push(format!("{label}: {r:.0} req/s (fixed, --efficiency-rate)"));
            }
            (None, Some((r, who, peak))) => {
                let low = low_rate(*peak);
                e.rates.insert(mode, r.round());
                e.low_rates.insert(mode, low);
                basis.push(format!(
                    "{label}: {:.0} and {low:.0} req/s, half and a tenth of the lowest peak in this run ({who}: {peak:.0} req/s)",
                    r.round()
                ));
            }
            (None, None) => e.failures.push(format!(
                "{label}: no point measured in this mode to set a rate from"
            )),
        }
    }
    e.rate_basis = basis.join("; ");
}

/// Starts each server again and measures its CPU time per request at a fixed offered rate
/// in each mode (the rates from `results`' points unless `opts` fixes one).
pub fn pass(
    results: &Results,
    opts: &Options,
    targets: &[Target],
    launch: &dyn Fn(&Target) -> anyhow::Result<Launch>,
    client: &Client,
    (duration, repeats): (Duration, usize),
) -> Efficiency {
    let mut e = Efficiency {
        duration_s: duration.as_secs_f64(),
        repeats,
        connections: CONNECTIONS,
        cpu_source: "the kernel's CPU clock of each process of the server's group (clock_getcpuclockid: user + system, every thread, exited ones included; ns)".into(),
        ..Efficiency::default()
    };
    rates(results, opts.efficiency_rate, &mut e);
    tracing::info!(target: "progress", "efficiency: server CPU per request at {}", e.rate_basis);
    for t in targets {
        if let crate::server::Kind::Url(u) = &t.kind {
            e.failures.push(format!(
                "{}: server CPU not measured ({} is a server the lab did not start)",
                t.name, u.url
            ));
            continue;
        }
        let launch = match launch(t) {
            Ok(l) => l,
            Err(err) => {
                e.failures.push(format!("{}: {err:#}", t.name));
                continue;
            }
        };
        let mut srv = match ServerProc::start(t, &launch) {
            Ok(s) => s,
            Err(err) => {
                e.failures
                    .push(format!("{}: failed to start: {err:#}", t.name));
                continue;
            }
        };
        for (mode, low) in e.levels() {
            let Some(rate) = e.rate_of(mode, low) else {
                continue;
            };
            // A short closed-loop warm-up: caches filled, the server's threads started.
            let mut w = client.load_on(&srv, FileKind::Small, mode, 10);
            w.requests = Some(200);
            w.keep_records = false;
            let _ = iolab_load::run(&w);
            settle(&srv);
            match measure(&srv, mode, rate, (duration, repeats), client) {
                Ok((mut row, proc_stat_only)) => {
                    if proc_stat_only {
                        e.cpu_source = "/proc/PID/stat utime + stime of each process of the server's group (clock ticks; the CPU clock was not readable)".into();
                    }
                    tracing::info!(target: "progress",
                        "efficiency {} {mode} at {rate:.0} req/s: {:.1} us CPU per request ({:.1}..{:.1})",
                        t.name, row.us_per_request, row.spread[0], row.spread[1]
                    );
                    row.low = low;
                    e.rows.push(row);
                }
                Err(err) => e
                    .failures
                    .push(format!("{} {mode} at {rate:.0}/s: {err:#}", t.name)),
            }
            if let Some(crash) = srv.crash_report() {
                e.failures.push(format!("{} {mode}: {crash}", t.name));
                break;
            }
        }
        srv.stop();
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_survive_odd_command_names() {
        let s = "1234 (a b) c) S 1 1234 1234 0 -1 4194304 10 0 0 0 7 3 0 0 20 0 1 0 5 1000 10";
        let f = stat_fields(s).unwrap();
        assert_eq!(f[0], "S");
        assert_eq!(f[2], "1234"); // pgrp
        assert_eq!(f[11], "7"); // utime
        assert_eq!(f[12], "3"); // stime
    }

    /// A busy child's CPU time grows by about what it burned, on both counters, and the
    /// group listing finds it.
    #[test]
    fn counters_see_a_busy_process_group() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done; sleep 5",
            ])
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id() as i32;
        let before = GroupCpu::read(pgid);
        assert!(group_pids(pgid).contains(&pgid));
        std::thread::sleep(Duration::from_millis(600));
        let after = GroupCpu::read(pgid);
        let burned = before.since(&after);
        let stat = proc_stat_cpu(pgid).unwrap();
        let clock = clock_cpu(pgid).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(burned > 0.05, "the busy loop burned {burned} s");
        assert!(burned < 1.0, "{burned}");
        // The two counters agree to within a few clock ticks.
        assert!((stat - clock).abs() < 0.05, "stat {stat} clock {clock}");
    }

    /// A group whose leader forks short-lived busy children (as busybox httpd forks per
    /// connection): their CPU counts once they are reaped, though none is alive at the
    /// second reading.
    #[test]
    fn reaped_children_count() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "sleep 0.3; for k in 1 2 3; do sh -c 'i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done'; done; sleep 5",
            ])
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id() as i32;
        let before = GroupCpu::read(pgid);
        // Until the busy children are gone (only the leader and its sleep are left).
        let t0 = Instant::now();
        let mut after = GroupCpu::read(pgid);
        while t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(100));
            after = GroupCpu::read(pgid);
            if t0.elapsed() > Duration::from_millis(400)
                && after.children_by_pid.get(&pgid).copied().unwrap_or(0.0) > 0.05
                && after.by_pid.len() <= 2
            {
                break;
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        let burned = before.since(&after);
        let own: f64 = after.by_pid.values().sum::<f64>() - before.by_pid.values().sum::<f64>();
        assert!(burned > 0.05, "the reaped children's CPU: {burned} s");
        assert!(
            burned > own + 0.04,
            "counted beyond the live processes' {own} s"
        );
    }

    #[test]
    fn default_rates_take_half_the_slowest_peak() {
        let r = crate::report::tests::synthetic();
        let rates = default_rates(&r);
        let (ka, who, peak) = rates[&ConnMode::KeepAlive].clone();
        assert_eq!(who, "b");
        assert_eq!(peak, 20_000.0);
        assert_eq!(ka, 10_000.0);
        let (close, who, _) = rates[&ConnMode::Close].clone();
        // The synthetic close rates peak at c = 1.
        assert_eq!(who, "b");
        assert!(close > 0.0);
    }

    /// Figure 1b's two rates per mode: half and a tenth of the lowest peak; one fixed
    /// rate when `--efficiency-rate` gives it.
    #[test]
    fn two_rates_per_mode_unless_one_is_fixed() {
        let r = crate::report::tests::synthetic();
        let mut e = Efficiency::default();
        rates(&r, None, &mut e);
        assert_eq!(e.rates[&ConnMode::KeepAlive], 10_000.0);
        assert_eq!(e.low_rates[&ConnMode::KeepAlive], 2_000.0);
        assert_eq!(e.levels().len(), 4);
        assert!(
            e.rate_basis.contains("10000 and 2000 req/s"),
            "{}",
            e.rate_basis
        );
        let mut fixed = Efficiency::default();
        rates(&r, Some(500.0), &mut fixed);
        assert!(fixed.low_rates.is_empty());
        assert_eq!(
            fixed.levels(),
            [(ConnMode::KeepAlive, false), (ConnMode::Close, false)]
        );
        assert_eq!(low_rate(100.0), 20.0);
    }
}
