//! `iolab lab --scaling`: requests/s against server workers (issue 10 §3).
//!
//! For `epoll`, `uring-fixed`, `runtime`, nginx (`worker_processes N`) and the tokio,
//! monoio and glommio peers (`--workers N`), with 1, 2, 4, … workers up to the number of CPUs the server is given,
//! keep-alive and a new connection per request. The server is pinned to `--server-cpus`,
//! the load generator (as many threads as client CPUs) to `--client-cpus`; by default the
//! machine is split in half. On a 2-core machine that is 1 worker against 1 client core,
//! one point per server, and the report says so: the curve needs more cores.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::options::{Options, Profile};
use crate::plan::hms;
use crate::point::Client;
use crate::results::{min_max, ConnMode, FileKind, Results};
use crate::server::{ServerProc, Target};
use crate::stage::Stage;

/// The models the issue names; the peers are those of `--peers`.
pub const MODELS: [&str; 3] = ["epoll", "uring-fixed", "runtime"];
/// Client connections per mode.
pub const KEEPALIVE_CONNECTIONS: usize = 100;
pub const CLOSE_CONNECTIONS: usize = 50;

fn connections(mode: ConnMode) -> usize {
    match mode {
        ConnMode::KeepAlive => KEEPALIVE_CONNECTIONS,
        ConnMode::Close => CLOSE_CONNECTIONS,
    }
}

pub use crate::report::scaling::{render_page, section, table_rows, text_table, TABLE_HEAD};
pub use crate::results::{Scaling, ScalingRow};

/// 1, 2, 4, … up to `n`, and `n` itself.
pub fn worker_counts(n: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut k = 1;
    while k < n {
        v.push(k);
        k *= 2;
    }
    v.push(n.max(1));
    v
}

/// Server and client CPUs: as given, or the allowed CPUs split in half (server first).
/// Returns them with a note saying how they were chosen.
pub fn split_cpus(
    allowed: &[usize],
    server: Option<Vec<usize>>,
    client: Option<Vec<usize>>,
) -> anyhow::Result<(Vec<usize>, Vec<usize>, String)> {
    for (what, list) in [("--server-cpus", &server), ("--client-cpus", &client)] {
        if let Some(l) = list {
            if let Some(c) = l.iter().find(|c| !allowed.contains(c)) {
                bail!("{what}: CPU {c} is not one this process may use ({allowed:?})");
            }
        }
    }
    let half = (allowed.len() / 2).max(1);
    let (s, c, how) = match (server, client) {
        (Some(s), Some(c)) => (s, c, "as given".to_string()),
        (Some(s), None) => {
            let c: Vec<usize> = allowed.iter().copied().filter(|x| !s.contains(x)).collect();
            (s, c, "server as given, client the rest".into())
        }
        (None, Some(c)) => {
            let s: Vec<usize> = allowed.iter().copied().filter(|x| !c.contains(x)).collect();
            (s, c, "client as given, server the rest".into())
        }
        (None, None) => (
            allowed[..half.min(allowed.len())].to_vec(),
            allowed[half.min(allowed.len())..].to_vec(),
            format!("the machine's {} CPUs split in half", allowed.len()),
        ),
    };
    if s.is_empty() || c.is_empty() {
        bail!(
            "scaling needs at least one CPU for the server and one for the client (server {s:?}, client {c:?})"
        );
    }
    if s.iter().any(|x| c.contains(x)) {
        bail!("--server-cpus and --client-cpus overlap ({s:?} and {c:?}): the client would measure its own scheduling");
    }
    let mut note = format!(
        "server on CPU {} ({} worker counts: {:?}), client on CPU {} ({how})",
        cpu_list(&s),
        worker_counts(s.len()).len(),
        worker_counts(s.len()),
        cpu_list(&c)
    );
    if s.len() == 1 {
        let _ = write!(
            note,
            "; with one server core this is one point per server (1 worker vs {} client core{}): the curve needs a machine with more cores (on 16 cores the same command splits 8/8)",
            c.len(),
            if c.len() == 1 { "" } else { "s" }
        );
    }
    Ok((s, c, note))
}

fn cpu_list(v: &[usize]) -> String {
    v.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

struct Params {
    duration: Duration,
    repeats: usize,
    warmup: Duration,
}

fn params(p: Profile) -> Params {
    match p {
        Profile::Tiny => Params {
            duration: Duration::from_millis(700),
            repeats: 1,
            warmup: Duration::from_millis(200),
        },
        Profile::Quick => Params {
            duration: Duration::from_secs(2),
            repeats: 3,
            warmup: Duration::from_millis(500),
        },
        Profile::Full => Params {
            duration: Duration::from_secs(5),
            repeats: 5,
            warmup: Duration::from_secs(1),
        },
    }
}

/// Pins the calling thread to `cpus` (the load generator's threads inherit it).
fn pin_thread(cpus: &[usize]) -> std::io::Result<()> {
    let set = crate::server::cpu_set(cpus);
    // SAFETY: pid 0 is the calling thread; the kernel reads the set we own.
    iolab_sys::cvt(unsafe {
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    })?;
    Ok(())
}

/// One load measurement from `client`, in a thread pinned to the client CPUs `cpus`.
fn measure(
    addr: SocketAddr,
    mode: ConnMode,
    duration: Duration,
    client: &Client,
    cpus: &[usize],
) -> anyhow::Result<(f64, u64)> {
    let mut cfg = client.load(addr, FileKind::Small, mode, connections(mode));
    cfg.requests = None;
    cfg.duration = Some(duration);
    cfg.timeout = Duration::from_secs(5);
    cfg.threads = cpus.len();
    cfg.keep_records = false;
    let cpus = cpus.to_vec();
    let r = std::thread::spawn(move || -> anyhow::Result<iolab_load::LoadReport> {
        pin_thread(&cpus).context("pinning the client")?;
        iolab_load::run(&cfg)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the client thread panicked"))??;
    // Requests still in flight when the time is up are not failures.
    Ok((r.rps, r.error_count.saturating_sub(r.unfinished)))
}

/// The servers to scale: the three models and the peers (as asked with
/// --models / --peers: a model list other than "all" narrows the three).
fn targets(opts: &Options) -> (Vec<Target>, Vec<String>) {
    let all_models = opts.models.len() == iolab_stats::models::MODELS.len();
    let models: Vec<String> = MODELS
        .iter()
        .filter(|m| all_models || opts.models.iter().any(|x| x == *m))
        .map(|m| m.to_string())
        .collect();
    let (t, skipped) = crate::catalog::targets(&models, &opts.peers);
    (
        t,
        skipped
            .into_iter()
            .map(|s| format!("{}: {}", s.name, s.failures.join("; ")))
            .collect(),
    )
}

/// Runs the scaling experiment and writes results.json and index.html.
pub fn run(
    opts: &Options,
    server_cpus: Option<Vec<usize>>,
    client_cpus: Option<Vec<usize>>,
) -> anyhow::Result<Results> {
    let t0 = Instant::now();
    let allowed = iolab_sys::cpu::allowed_cpus().context("reading the CPU affinity")?;
    let (scpus, ccpus, note) = split_cpus(&allowed, server_cpus, client_cpus)?;
    let stage = Stage::prepare(opts, false, "iolab lab --scaling")?;
    let _ = iolab_sys::raise_nofile_limit();
    let p = params(opts.profile);
    let workers = worker_counts(scpus.len());
    let (targets, skipped) = targets(opts);
    for s in &skipped {
        tracing::warn!("peer skipped: {s}");
    }
    let total = targets.len() * workers.len();
    tracing::info!(target: "progress",
        "iolab lab --scaling --profile {}: {} servers x {} worker counts x 2 modes x {} repeat(s) of {} s; {note}",
        opts.profile.name(),
        targets.len(),
        workers.len(),
        p.repeats,
        p.duration.as_secs_f64()
    );
    let mut sc = Scaling {
        server_cpus: scpus.clone(),
        client_cpus: ccpus.clone(),
        note,
        workers: workers.clone(),
        duration_s: p.duration.as_secs_f64(),
        repeats: p.repeats,
        connections: ConnMode::REPORT_ORDER
            .into_iter()
            .map(|m| (m, connections(m)))
            .collect(),
        failures: skipped,
        ..Scaling::default()
    };
    // The client's threads are pinned to the client CPUs, not to one.
    let client = Client {
        sources: stage.sources.clone(),
        cpu: None,
    };
    let mut done = 0;
    for &w in &workers {
        for t in &targets {
            done += 1;
            let launch = stage.launch(
                opts.out.join("run").join(format!("{}-w{w}", t.name)),
                w,
                None,
                scpus[..w.min(scpus.len())].to_vec(),
            )?;
            let mut srv = match ServerProc::start(t, &launch) {
                Ok(s) => s,
                Err(e) => {
                    let msg = format!("{} with {w} workers failed to start: {e:#}", t.name);
                    tracing::info!(target: "progress", "[{done}/{total}] {msg}");
                    sc.failures.push(msg);
                    continue;
                }
            };
            let mut line = format!(
                "[{done}/{total} {}] {} w={w}:",
                hms(t0.elapsed().as_secs_f64()),
                t.name
            );
            let rows = measure_server(&mut srv, w, &p, (&client, &ccpus), &mut sc.failures);
            for row in rows {
                let _ = write!(
                    line,
                    " {} {:.0} req/s ({:.0}..{:.0}, {} errors)",
                    row.mode, row.rps, row.rps_spread[0], row.rps_spread[1], row.errors
                );
                sc.rows.push(row);
            }
            tracing::info!(target: "progress", "{line}");
            srv.stop();
        }
    }
    let machine = iolab_sys::host::Machine::collect();
    let mut settings = BTreeMap::new();
    settings.insert("server CPUs".into(), cpu_list(&scpus));
    settings.insert("client CPUs".into(), cpu_list(&ccpus));
    let mut results = Results {
        settings,
        method: method(&p, &sc, opts.backlog),
        ..crate::stage::results_header(opts, &machine)?
    };
    stage.finish(&mut results)?;
    results.scaling = Some(sc);
    results.elapsed_s = t0.elapsed().as_secs_f64();
    write_outputs(&results, &opts.out)?;
    tracing::info!(target: "progress",
        "iolab lab --scaling: done in {}; report: {}",
        hms(results.elapsed_s),
        opts.out.join("index.html").display()
    );
    Ok(results)
}

/// One server at `workers` workers: a warm-up (both modes, not recorded), then
/// `p.repeats` runs in each mode from `client` on its CPUs; a row per mode measured.
fn measure_server(
    srv: &mut ServerProc,
    workers: usize,
    p: &Params,
    (client, cpus): (&Client, &[usize]),
    failures: &mut Vec<String>,
) -> Vec<ScalingRow> {
    for mode in ConnMode::REPORT_ORDER {
        let _ = measure(srv.addr, mode, p.warmup, client, cpus);
    }
    let mut rows = Vec::new();
    for mode in ConnMode::REPORT_ORDER {
        let mut runs = Vec::new();
        let mut errors = 0;
        for _ in 0..p.repeats {
            match measure(srv.addr, mode, p.duration, client, cpus) {
                Ok((rps, e)) => {
                    runs.push(rps);
                    errors += e;
                }
                Err(e) => failures.push(format!(
                    "{} w={workers} {mode}: load failed: {e:#}",
                    srv.name
                )),
            }
            if let Some(crash) = srv.crash_report() {
                failures.push(format!("{} w={workers} {mode}: {crash}", srv.name));
                break;
            }
        }
        if runs.is_empty() {
            continue;
        }
        rows.push(ScalingRow {
            server: srv.name.clone(),
            mode,
            workers,
            rps: iolab_sys::percentile::median(&runs).unwrap_or(0.0),
            rps_spread: min_max(runs.iter().copied()),
            runs,
            errors,
        });
    }
    rows
}

/// The Method table of a scaling run.
fn method(p: &Params, sc: &Scaling, backlog: u32) -> BTreeMap<String, String> {
    let mut method = BTreeMap::new();
    method.insert(
        "scaling".into(),
        format!(
            "requests/s of the small file ({} B) over {} s, median of {} (min..max), after a warm-up; keep-alive with {} connections, a new connection per request with {}; the load generator runs {} thread(s) on the client CPUs",
            crate::site::SMALL_BYTES,
            p.duration.as_secs_f64(),
            p.repeats,
            KEEPALIVE_CONNECTIONS,
            CLOSE_CONNECTIONS,
            sc.client_cpus.len()
        ),
    );
    method.insert("CPUs".into(), sc.note.clone());
    method.insert(
        "workers".into(),
        "models: --workers N (epoll, uring-fixed: N loops or rings; runtime: N worker threads); nginx: worker_processes N; tokio: --workers N runtime threads".into(),
    );
    method.insert("listen backlog".into(), backlog.to_string());
    method.insert(
        "read buffer and iovecs per send, every model".into(),
        format!(
            "{} B, {}",
            iolab_stats::models::DEFAULT_READ_BUF,
            iolab_stats::models::DEFAULT_MAX_IOV
        ),
    );
    method
}

/// Writes only the files a scaling run has (results.json, index.html).
pub fn write_outputs(r: &Results, out: &Path) -> anyhow::Result<()> {
    std::fs::write(out.join("results.json"), serde_json::to_string(r)? + "\n")
        .with_context(|| format!("writing {}", out.join("results.json").display()))?;
    std::fs::write(out.join("index.html"), crate::report::render(r))
        .with_context(|| format!("writing {}", out.join("index.html").display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_steps() {
        assert_eq!(worker_counts(1), vec![1]);
        assert_eq!(worker_counts(2), vec![1, 2]);
        assert_eq!(worker_counts(8), vec![1, 2, 4, 8]);
        assert_eq!(worker_counts(6), vec![1, 2, 4, 6]);
    }

    #[test]
    fn default_split_halves_the_machine() {
        let (s, c, note) = split_cpus(&[0, 1], None, None).unwrap();
        assert_eq!((s, c), (vec![0], vec![1]));
        assert!(note.contains("one point per server"), "{note}");
        let all: Vec<usize> = (0..16).collect();
        let (s, c, note) = split_cpus(&all, None, None).unwrap();
        assert_eq!(s, (0..8).collect::<Vec<_>>());
        assert_eq!(c, (8..16).collect::<Vec<_>>());
        assert!(!note.contains("one point"), "{note}");
        let (s, c, _) = split_cpus(&all, Some(vec![0, 1, 2]), None).unwrap();
        assert_eq!(s, vec![0, 1, 2]);
        assert_eq!(c.len(), 13);
        assert!(split_cpus(&[0, 1], Some(vec![0]), Some(vec![0])).is_err());
        assert!(split_cpus(&[0, 1], Some(vec![5]), None).is_err());
        assert!(split_cpus(&[0], None, None).is_err());
    }
}
