//! `iolab lab --hosts FILE`: the server on one host, the load from one or more client hosts,
//! all reached over OpenSSH ([`iolab_hosts`]).
//!
//! For every model asked for, the lab starts `iolab serve` (a [`ServeSpec`]) on the server
//! host; a `--target` command runs there too (`sh -c`, the placeholders naming the server
//! host's address and the run's directory there), a `--url` server is reached where it
//! is. For each point of the profile, `iolab load` (a [`LoadSpec`]) on every client
//! host at once, the point's connections split between them. Each agent writes its JSON
//! report and its per-request log on its host; the lab fetches both, builds one
//! HdrHistogram per host from the log and merges them (quantiles of all requests, not an
//! average of the hosts' quantiles), sums the hosts' rates and achieved concurrency, and
//! places every host's start on the controller's clock with the offset measured at the
//! start. The server's CPU time is read from `/proc` on the server host around each point:
//! every process of the server's session (a target's forked children and helpers too),
//! none for a `--url` server.
//!
//! Every remote process runs under a lease ([`iolab_hosts::Leased`]): it ends when the run
//! does, on error, on Ctrl-C, and when the controller is killed. The run's files on each
//! host (a directory under /tmp) are removed at the end.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use iolab_hosts::{Host, Inventory, Leased, Ssh};
use iolab_load::spec::LoadSpec;
use iolab_load::RequestRecord;
use iolab_servers::spec::ServeSpec;
use iolab_servers::Model;

use crate::options::{Options, Profile};
use crate::results::{FileKind, HostInfo, HostLoad, HostPoint, HostsRun, MergedLoad, Results};
use crate::server::probe::UrlTarget;
use crate::server::{Kind, Launch};

/// Longest a remote step other than a load run may take (copying the binary included).
const STEP_LIMIT: Duration = Duration::from_secs(60);
/// The line between an agent's JSON report and its log when both are fetched at once.
const LOG_MARKER: &str = "--- iolab lab: log follows";
/// What a load run may take beyond its duration before it is stopped.
const LOAD_GRACE: Duration = Duration::from_secs(20);

/// Each point's length by profile (every client host runs it at the same time).
pub fn point_duration(p: Profile) -> Duration {
    match p {
        Profile::Tiny => Duration::from_millis(500),
        Profile::Quick => Duration::from_secs(3),
        Profile::Full => Duration::from_secs(10),
    }
}

/// `total` connections split over `n` hosts as evenly as they go, every host at least one.
pub fn split(total: usize, n: usize) -> Vec<usize> {
    let n = n.max(1);
    let total = total.max(n);
    (0..n)
        .map(|i| total / n + usize::from(i < total % n))
        .collect()
}

/// A host with its ssh, the run's directory there and the iolab binary to run.
struct Remote {
    ssh: Ssh,
    /// Dropped after the directory's removal (see `Remotes`'s drop).
    _master: Option<iolab_hosts::Master>,
    dir: String,
    iolab: String,
}

impl Remote {
    fn run(&self, script: &str) -> anyhow::Result<Vec<u8>> {
        self.ssh.run(script, STEP_LIMIT)
    }

    fn put(&self, data: Vec<u8>, path: &str) -> anyhow::Result<()> {
        let q = iolab_hosts::ssh::quote(path);
        self.ssh
            .run_with_input(&format!("cat > {q}"), Some(data), STEP_LIMIT)
            .map(drop)
    }

    /// The CPU seconds (user + system, threads and reaped children) of every live process
    /// in session `sid` (a leased command's: its leader's pid).
    fn session_cpu_seconds(&self, sid: u32) -> anyhow::Result<f64> {
        let out = self.run("getconf CLK_TCK; cat /proc/[0-9]*/stat 2>/dev/null; true")?;
        let text = String::from_utf8_lossy(&out);
        let (tck, stats) = text.split_once('\n').context("no CLK_TCK")?;
        let tck: f64 = tck.trim().parse().context("CLK_TCK")?;
        let ticks = session_ticks(stats, sid);
        if tck <= 0.0 || ticks.is_none() {
            bail!(
                "{}: no process of session {sid} in /proc",
                self.ssh.host.name
            );
        }
        Ok(ticks.unwrap_or(0.0) / tck)
    }
}

/// The clock ticks (utime + stime + cutime + cstime) of the processes of session `sid`
/// in `stats` (lines of /proc/PID/stat); None when none is in it.
pub fn session_ticks(stats: &str, sid: u32) -> Option<f64> {
    let mut total = None;
    for line in stats.lines() {
        // After the command name (which may hold spaces and parentheses): state, ppid,
        // pgrp, session, tty, tpgid, flags, minflt, cminflt, majflt, cmajflt, utime,
        // stime, cutime, cstime.
        let Some((_, after)) = line.rsplit_once(')') else {
            continue;
        };
        let f: Vec<&str> = after.split_whitespace().collect();
        if f.len() < 15 || f[3].parse::<u32>().ok() != Some(sid) {
            continue;
        }
        let t: f64 = f[11..15].iter().filter_map(|x| x.parse::<f64>().ok()).sum();
        *total.get_or_insert(0.0) += t;
    }
    total
}

/// The run's directories on every host, removed when dropped.
struct Remotes {
    server: Remote,
    clients: Vec<Remote>,
}

impl Drop for Remotes {
    fn drop(&mut self) {
        for r in std::iter::once(&self.server).chain(&self.clients) {
            let _ = r.ssh.run(
                &format!("rm -rf {}", iolab_hosts::ssh::quote(&r.dir)),
                Duration::from_secs(10),
            );
        }
    }
}

/// The n-th host's own directory: two hosts may share one filesystem (one machine listed
/// twice, or namespaces on one machine), and each one's files and removal must not touch
/// another's.
fn host_dir(run: &str, n: usize) -> String {
    format!("{run}-h{n}")
}

fn connect(inv: &Inventory, out: &Path) -> anyhow::Result<(Remotes, Vec<HostInfo>)> {
    let (known_hosts, accept_new) = match &inv.known_hosts {
        Some(k) => (k.clone(), false),
        None => (out.join("known_hosts"), true),
    };
    let run = format!(
        "/tmp/iolab-lab-{}-{}",
        std::process::id(),
        iolab_sys::host::Machine::collect().collected_at_unix
    );
    let me = std::env::current_exe().context("finding the iolab binary")?;
    let mut infos = Vec::new();
    let mut n = 0;
    let mut open = |h: &Host, role: &str| -> anyhow::Result<Remote> {
        let mut ssh = Ssh::new(h, &known_hosts, accept_new);
        n += 1;
        let socket = PathBuf::from(format!("/tmp/iolab-ssh-{}-{n}", std::process::id()));
        let master = ssh.start_master(&socket)?;
        let dir = host_dir(&run, n);
        ssh.run(&format!("mkdir -p {dir}/www"), STEP_LIMIT)?;
        let iolab = match &h.iolab {
            Some(p) => p.to_string_lossy().into_owned(),
            None => format!("{dir}/iolab"),
        };
        let r = Remote {
            ssh,
            _master: Some(master),
            dir,
            iolab,
        };
        if h.copy {
            let bin = std::fs::read(&me).with_context(|| format!("reading {}", me.display()))?;
            r.put(bin, &r.iolab)?;
            r.run(&format!("chmod +x {}", r.iolab))?;
        }
        let (offset, rtt) = r.ssh.clock_offset()?;
        tracing::info!(target: "progress",
            "host {} ({role}, {}): clock offset {:+.3} ms (round trip {:.3} ms)",
            h.name, h.address, offset * 1e3, rtt * 1e3);
        infos.push(HostInfo {
            name: h.name.clone(),
            role: role.into(),
            address: h.address.to_string(),
            cpus: h.cpus.clone(),
            clock_offset_ms: offset * 1e3,
            clock_rtt_ms: rtt * 1e3,
            machine: r.ssh.machine()?,
        });
        Ok(r)
    };
    let server = open(&inv.server, "server")?;
    let mut remotes = Remotes {
        server,
        clients: Vec::new(),
    };
    for c in &inv.clients {
        remotes.clients.push(open(c, "client")?);
    }
    Ok((remotes, infos))
}

/// A server of a hosts run: started on the server host, or reached where it runs.
enum HostServer {
    Model(Model),
    /// `--target NAME=COMMAND`, run with `sh -c` on the server host.
    Command {
        name: String,
        template: String,
    },
    /// `--url NAME=URL`: already running; the lab neither starts nor measures it.
    Url {
        name: String,
        url: UrlTarget,
    },
}

impl HostServer {
    fn name(&self) -> &str {
        match self {
            HostServer::Model(m) => m.name(),
            HostServer::Command { name, .. } | HostServer::Url { name, .. } => name,
        }
    }

    /// The servers of `opts`: its models, then its `--target`s and `--url`s.
    fn of(opts: &Options) -> Vec<HostServer> {
        let models = opts
            .models
            .iter()
            .filter_map(|m| iolab_servers::spec::model_named(m))
            .map(HostServer::Model);
        let targets = opts.targets.iter().filter_map(|t| match &t.kind {
            Kind::Command(template) => Some(HostServer::Command {
                name: t.name.clone(),
                template: template.clone(),
            }),
            Kind::Url(url) => Some(HostServer::Url {
                name: t.name.clone(),
                url: url.clone(),
            }),
            _ => None,
        });
        models.chain(targets).collect()
    }

    /// The URL the load agents ask for `file` at.
    fn url(&self, addr: SocketAddr, file: FileKind) -> String {
        match self {
            HostServer::Url { url, .. } => {
                format!("http://{}{}{}", url.host, url.prefix, file.path())
            }
            _ => format!("http://{addr}{}", file.path()),
        }
    }
}

/// Runs the lab over the hosts of `inventory` and writes results.json and index.html.
pub fn run(opts: &Options, inventory: &Path) -> anyhow::Result<Results> {
    let t0 = Instant::now();
    let inv = Inventory::read(inventory)?;
    if !opts.peers.is_empty() || opts.link.is_some() {
        bail!("--hosts runs the built-in models, --target commands (on the server host) and --url servers (give --peers none, no --link)");
    }
    let servers = HostServer::of(opts);
    if servers.is_empty() {
        bail!("--hosts: no server to run (--models, --target or --url)");
    }
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("creating {}", opts.out.display()))?;
    crate::server::install_signal_handler()?;
    let www = opts.out.join("www");
    crate::site::write_site(&www)?;
    let (remotes, hosts) = connect(&inv, &opts.out)?;
    for f in FileKind::ALL {
        let name = f.path().trim_start_matches('/');
        let data = std::fs::read(www.join(name))?;
        remotes
            .server
            .put(data, &format!("{}/www/{name}", remotes.server.dir))?;
    }
    let machine = iolab_sys::host::Machine::collect();
    let mut results = crate::stage::results_header(opts, &machine)?;
    let mut run = HostsRun {
        inventory: inventory.display().to_string(),
        hosts,
        ..HostsRun::default()
    };
    let plan = crate::plan::Plan::for_profile(opts.profile);
    let port = 20_000 + (std::process::id() % 20_000) as u16;
    let addr = SocketAddr::new(inv.server.address, port);
    for server in &servers {
        if let Err(e) = run_server(opts, &remotes, &inv, server, addr, &www, &plan, &mut run) {
            tracing::warn!("{}: {e:#}", server.name());
            run.failures.push(format!("{}: {e:#}", server.name()));
        }
    }
    drop(remotes);
    results.hosts = Some(run);
    results.elapsed_s = t0.elapsed().as_secs_f64();
    crate::report::write_outputs(&results, &opts.out)?;
    Ok(results)
}

/// Starts `server` on the server host (nothing for a URL) and waits until it serves the
/// lab's files; returns its lease and the session whose CPU is its own.
fn start_server(
    opts: &Options,
    srv: &Remote,
    inv: &Inventory,
    server: &HostServer,
    addr: SocketAddr,
    www: &Path,
) -> anyhow::Result<Option<(Leased, u32)>> {
    let argv: Vec<OsString> = match server {
        HostServer::Url { url, .. } => {
            crate::server::probe::check_url(url, www)?;
            return Ok(None);
        }
        HostServer::Model(model) => {
            let spec = ServeSpec {
                workers: opts.workers,
                backlog: opts.backlog,
                ..ServeSpec::new(*model, PathBuf::from(format!("{}/www", srv.dir)), addr)
            };
            let mut argv: Vec<OsString> = vec![srv.iolab.clone().into()];
            argv.extend(spec.to_args());
            argv
        }
        HostServer::Command { name, template } => {
            let run_dir = format!("{}/run/{name}", srv.dir);
            srv.run(&format!("mkdir -p {}", iolab_hosts::ssh::quote(&run_dir)))?;
            let launch = Launch {
                iolab: PathBuf::from(&srv.iolab),
                www: PathBuf::from(format!("{}/www", srv.dir)),
                run_dir: PathBuf::from(run_dir),
                addr,
                workers: opts.workers,
                backlog: opts.backlog,
                cpu: None,
                cpus: inv.server.cpus.clone(),
                netns: None,
            };
            let line = crate::server::command::substitute(template, &launch);
            vec!["sh".into(), "-c".into(), line.into()]
        }
    };
    let log = format!("{}/serve-{}.log", srv.dir, server.name());
    let mut lease = srv.ssh.spawn_leased(&argv, &inv.server.cpus, &log)?;
    let sid = lease.remote_pid.context("no server pid")?;
    // An early exit says why with the end of the server's output.
    let exited = || {
        let status = lease.try_wait()?;
        let tail = srv
            .run(&format!("tail -n 5 {}", iolab_hosts::ssh::quote(&log)))
            .unwrap_or_default();
        Some(format!(
            "{status}: {}",
            String::from_utf8_lossy(&tail).trim()
        ))
    };
    crate::server::probe::wait_serving(addr, www, Duration::from_secs(10), exited)
        .with_context(|| format!("{} on {}", server.name(), inv.server.name))?;
    Ok(Some((lease, sid)))
}

#[allow(clippy::too_many_arguments)]
fn run_server(
    opts: &Options,
    remotes: &Remotes,
    inv: &Inventory,
    server: &HostServer,
    addr: SocketAddr,
    www: &Path,
    plan: &crate::plan::Plan,
    run: &mut HostsRun,
) -> anyhow::Result<()> {
    let srv = &remotes.server;
    let mut started = start_server(opts, srv, inv, server, addr, www)?;
    let name = server.name();
    match &started {
        Some(_) => {
            tracing::info!(target: "progress", "{name} serving on {addr} (host {})", inv.server.name)
        }
        None => tracing::info!(target: "progress", "{name}: already running, its CPU not measured"),
    }
    let sid = started.as_ref().map(|(_, sid)| *sid);
    let cpu = |sid: Option<u32>| sid.and_then(|s| srv.session_cpu_seconds(s).ok());
    let duration = point_duration(opts.profile);
    for (n, p) in plan.points().into_iter().enumerate() {
        let cpu0 = cpu(sid);
        let url = server.url(addr, p.file);
        let figure2 = plan.is_top_close(p);
        let point = one_point(
            remotes,
            inv,
            &url,
            (p, figure2),
            duration,
            plan.timeout,
            n,
            run,
        );
        let cpu1 = cpu(sid);
        let mut point = point.with_context(|| format!("{name} {p:?}"))?;
        point.server = name.into();
        if let (Some(a), Some(b)) = (cpu0, cpu1) {
            let cpu = (b - a).max(0.0);
            point.server_cpu_s = Some(cpu);
            if point.merged.ok > 0 {
                point.us_per_request = Some(cpu * 1e6 / point.merged.ok as f64);
            }
        }
        tracing::info!(target: "progress",
            "{name} {} {} c={}: {:.0} req/s over {} hosts, p99 {:.2} ms",
            p.file, p.mode, p.concurrency, point.merged.rps, point.per_host.len(), point.merged.p99_ms);
        run.points.push(point);
    }
    if let Some((lease, _)) = started.as_mut() {
        lease.stop();
    }
    Ok(())
}

/// One point: every client host's agent at once, then their logs fetched and merged.
#[allow(clippy::too_many_arguments)]
fn one_point(
    remotes: &Remotes,
    inv: &Inventory,
    url: &str,
    (p, figure2): (crate::plan::PointSpec, bool),
    duration: Duration,
    timeout: Duration,
    n: usize,
    run: &HostsRun,
) -> anyhow::Result<HostPoint> {
    let shares = split(p.concurrency, remotes.clients.len());
    let mut agents: Vec<(Leased, String, String)> = Vec::new();
    for ((r, h), &c) in remotes.clients.iter().zip(&inv.clients).zip(&shares) {
        let (json, log) = (
            format!("{}/p{n}.json", r.dir),
            format!("{}/p{n}.csv", r.dir),
        );
        let spec = LoadSpec {
            connections: c,
            duration,
            keepalive: p.mode.keepalive(),
            timeout,
            threads: 1,
            json: Some(json.clone().into()),
            log: Some(log.clone().into()),
            quiet: true,
            ..LoadSpec::new(url.to_string())
        };
        let mut argv: Vec<OsString> = vec![r.iolab.clone().into()];
        argv.extend(spec.to_args());
        let agent_log = format!("{}/agent.log", r.dir);
        agents.push((r.ssh.spawn_leased(&argv, &h.cpus, &agent_log)?, json, log));
    }
    let mut per_host = Vec::new();
    let mut hists = Vec::new();
    let mut starts = Vec::new();
    let mut logs = Vec::new();
    for ((mut agent, json, log), (r, &c)) in
        agents.into_iter().zip(remotes.clients.iter().zip(&shares))
    {
        let status = agent.wait(duration + LOAD_GRACE)?;
        if !status.success() {
            let tail = r
                .run(&format!("tail -n 5 {}/agent.log", r.dir))
                .unwrap_or_default();
            bail!(
                "{}: iolab load {status}: {}",
                r.ssh.host.name,
                String::from_utf8_lossy(&tail).trim()
            );
        }
        // Both files in one session, a marker line between them.
        let both = r.run(&format!("cat {json}; echo; echo {LOG_MARKER}; cat {log}"))?;
        let text = String::from_utf8_lossy(&both);
        let marker = format!("\n{LOG_MARKER}\n");
        let (json_text, log_text) = text
            .split_once(&marker)
            .with_context(|| format!("{}: no log after {json}", r.ssh.host.name))?;
        let report: iolab_load::LoadReport = serde_json::from_str(json_text)
            .with_context(|| format!("{}: parsing {json}", r.ssh.host.name))?;
        let records = iolab_load::read_csv(log_text)
            .with_context(|| format!("{}: {log}", r.ssh.host.name))?;
        let offset_ms = run
            .hosts
            .iter()
            .find(|h| h.name == r.ssh.host.name)
            .map_or(0.0, |h| h.clock_offset_ms);
        starts.push(agent.remote_start_unix.unwrap_or(0.0) * 1e3 - offset_ms);
        let (hist, concurrency) = histogram(&records, report.elapsed_s)?;
        per_host.push(HostLoad {
            host: r.ssh.host.name.clone(),
            connections: c,
            achieved_concurrency: concurrency,
            ok: report.ok,
            errors: report.error_count,
            errors_by_kind: report.errors.clone(),
            rps: report.rps,
            p50_ms: report.p50_ms,
            p99_ms: report.p99_ms,
            start_ms: 0.0,
        });
        hists.push(hist);
        if figure2 {
            logs.push(records);
        }
    }
    let first = starts.iter().copied().fold(f64::INFINITY, f64::min);
    for (h, s) in per_host.iter_mut().zip(&starts) {
        h.start_ms = s - first;
    }
    let trace = figure2.then(|| {
        let shifts: Vec<f64> = per_host.iter().map(|h| h.start_ms).collect();
        crate::point::trace(&on_one_time_axis(logs, &shifts), None)
    });
    let merged = merge(&per_host, &hists)?;
    Ok(HostPoint {
        server: String::new(),
        file: p.file,
        mode: p.mode,
        concurrency: shares.iter().sum(),
        duration_s: duration.as_secs_f64(),
        per_host,
        merged,
        server_cpu_s: None,
        us_per_request: None,
        trace,
    })
}

/// Every host's requests on one time axis, for Figure 2: each host's times (µs from its
/// own start) moved by its start on the controller's clock (`shifts_ms`, from the first
/// host's), connection ids kept apart per host, in order of start.
pub fn on_one_time_axis(logs: Vec<Vec<RequestRecord>>, shifts_ms: &[f64]) -> Vec<RequestRecord> {
    let mut all = Vec::new();
    for (host, (records, shift_ms)) in logs.into_iter().zip(shifts_ms).enumerate() {
        let d = (shift_ms.max(0.0) * 1e3).round() as u64;
        let conn_base = (host as u64) << 40;
        all.extend(records.into_iter().map(|mut r| {
            r.scheduled_us += d;
            r.start_us += d;
            r.connected_us = r.connected_us.map(|t| t + d);
            r.first_byte_us = r.first_byte_us.map(|t| t + d);
            r.end_us += d;
            if r.conn_id != 0 {
                r.conn_id += conn_base;
            }
            r
        }));
    }
    all.sort_by_key(|r| (r.start_us, r.end_us));
    all
}

/// One host's latency histogram (µs, successful requests, the load generator's bounds and
/// latency, so merged quantiles are of the same measure as each host's report) and its
/// achieved concurrency: the requests' summed time in flight over the run's length.
pub fn histogram(
    records: &[RequestRecord],
    elapsed_s: f64,
) -> anyhow::Result<(Histogram<u64>, f64)> {
    let mut h = Histogram::new_with_bounds(1, 3_600_000_000, 3)?;
    let mut busy_us = 0u64;
    for r in records {
        busy_us += r.end_us.saturating_sub(r.start_us);
        if r.error.is_none() {
            h.saturating_record(r.latency_us().max(1));
        }
    }
    let concurrency = if elapsed_s > 0.0 {
        busy_us as f64 / 1e6 / elapsed_s
    } else {
        0.0
    };
    Ok((h, concurrency))
}

/// The hosts' shares together: histograms added (so the quantiles are of every request),
/// counts, rates and concurrency summed.
pub fn merge(per_host: &[HostLoad], hists: &[Histogram<u64>]) -> anyhow::Result<MergedLoad> {
    let mut all = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)?;
    for h in hists {
        all.add(h).context("merging histograms")?;
    }
    let ms = |q: f64| all.value_at_quantile(q) as f64 / 1e3;
    let empty = all.is_empty();
    Ok(MergedLoad {
        connections: per_host.iter().map(|h| h.connections).sum(),
        achieved_concurrency: per_host.iter().map(|h| h.achieved_concurrency).sum(),
        ok: per_host.iter().map(|h| h.ok).sum(),
        errors: per_host.iter().map(|h| h.errors).sum(),
        rps: per_host.iter().map(|h| h.rps).sum(),
        mean_ms: if empty { 0.0 } else { all.mean() / 1e3 },
        p50_ms: if empty { 0.0 } else { ms(0.5) },
        p90_ms: if empty { 0.0 } else { ms(0.9) },
        p99_ms: if empty { 0.0 } else { ms(0.99) },
        max_ms: if empty { 0.0 } else { all.max() as f64 / 1e3 },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sessions_cpu_is_its_processes_ticks() {
        let stats = "10 (sh -c x) S 1 10 10 0 -1 0 0 0 0 0 5 6 7 8 0\n\
                     11 (odd ) name) R 10 10 10 0 -1 0 0 0 0 0 1 1 0 0 0\n\
                     12 (other) S 1 12 12 0 -1 0 0 0 0 0 100 100 0 0 0\n";
        assert_eq!(session_ticks(stats, 10), Some(28.0));
        assert_eq!(session_ticks(stats, 12), Some(200.0));
        assert_eq!(session_ticks(stats, 99), None);
    }

    fn record(start_us: u64, end_us: u64, conn_id: u64) -> RequestRecord {
        RequestRecord {
            scheduled_us: start_us,
            start_us,
            connected_us: Some(start_us + 10),
            first_byte_us: Some(end_us.saturating_sub(1)),
            end_us,
            status: Some(200),
            bytes: 300,
            error: None,
            conn_id,
        }
    }

    /// Figure 2 over hosts: a host that started 0.5 s after the first has its requests
    /// 0.5 s later on the common axis, its connections distinct from the first host's.
    #[test]
    fn hosts_requests_share_one_time_axis() {
        let a = vec![record(0, 1000, 1), record(600_000, 601_000, 1)];
        let b = vec![record(100_000, 102_000, 1), record(0, 0, 0)];
        let all = on_one_time_axis(vec![a, b], &[0.0, 500.0]);
        let times: Vec<(u64, u64)> = all.iter().map(|r| (r.start_us, r.end_us)).collect();
        assert_eq!(
            times,
            [
                (0, 1000),
                (500_000, 500_000),
                (600_000, 601_000),
                (600_000, 602_000)
            ]
        );
        let b0 = &all[3];
        assert_eq!((b0.scheduled_us, b0.connected_us), (600_000, Some(600_010)));
        assert_eq!(b0.first_byte_us, Some(601_999));
        assert_ne!(b0.conn_id, all[2].conn_id);
        // "no connection" stays 0 on every host
        assert_eq!(all[1].conn_id, 0);
        // the two hosts' requests overlap on the common axis: two in flight at once
        let t = crate::point::trace(&all, None);
        assert!(t.client.iter().any(|x| x[1] >= 2.0), "{:?}", t.client);
    }

    #[test]
    fn connections_split_evenly_at_least_one_each() {
        assert_eq!(split(10, 2), [5, 5]);
        assert_eq!(split(7, 2), [4, 3]);
        assert_eq!(split(1, 2), [1, 1]);
        assert_eq!(split(5, 0), [5]);
    }

    /// Quantiles come from every request of every host, not from the hosts' quantiles.
    #[test]
    fn histograms_are_merged_not_averaged() {
        let rec = |ms: u64| RequestRecord {
            scheduled_us: 0,
            start_us: 0,
            connected_us: None,
            first_byte_us: None,
            end_us: ms * 1000,
            status: Some(200),
            bytes: 1,
            error: None,
            conn_id: 0,
        };
        // Host a: 99 fast requests; host b: one slow one. The average of the two hosts'
        // medians would be 50.5 ms; the merged median is 1 ms and the max 100 ms.
        let a: Vec<_> = (0..99).map(|_| rec(1)).collect();
        let b = vec![rec(100)];
        let (ha, ca) = histogram(&a, 1.0).unwrap();
        let (hb, cb) = histogram(&b, 1.0).unwrap();
        assert!((ca - 0.099).abs() < 1e-9 && (cb - 0.1).abs() < 1e-9);
        let load = |ok| HostLoad {
            ok,
            connections: 1,
            rps: ok as f64,
            ..HostLoad::default()
        };
        let m = merge(&[load(99), load(1)], &[ha, hb]).unwrap();
        assert!((m.p50_ms - 1.0).abs() < 0.01, "{m:?}");
        assert!((m.max_ms - 100.0).abs() < 0.1, "{m:?}");
        assert_eq!((m.ok, m.connections), (100, 2));
        assert!((m.rps - 100.0).abs() < 1e-9);
    }

    #[test]
    fn a_hosts_histogram_measures_latency_as_its_report_does() {
        // Due at 0, sent at 3 ms (its connection was busy), done at 4 ms: the report counts
        // 4 ms, and so must the merge, or merged quantiles fall below every host's own.
        let r = RequestRecord {
            scheduled_us: 0,
            start_us: 3000,
            connected_us: None,
            first_byte_us: None,
            end_us: 4000,
            status: Some(200),
            bytes: 1,
            error: None,
            conn_id: 1,
        };
        let (h, concurrency) = histogram(&[r], 1.0).unwrap();
        assert_eq!(h.value_at_quantile(0.5), h.highest_equivalent(4000));
        assert!((concurrency - 0.001).abs() < 1e-9);
    }
}
