//! The experiment: the micro-benchmarks, every server through the matrix
//! ([`crate::matrix`], each point a [`crate::point`] run), the efficiency pass, then the
//! report.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use iolab_servers::spec::ServeSpec;
use iolab_servers::{Config, Model};

use crate::matrix::Matrix;
pub use crate::plan::{budget_requests, hms, Plan, PointSpec, Profile};
use crate::point::{Bench, Client};
use crate::results::{FileKind, Results, Status, TargetInfo, TargetKind};
use crate::server::{Kind, Target};
use crate::stage::Stage;

/// The size of the small file, as the seed's small HTML page.
pub const SMALL_BYTES: usize = 300;
/// The seed's large file: 700 KB.
pub const BIG_BYTES: usize = 700 * 1024;

#[derive(Debug, Clone)]
pub struct Options {
    pub profile: Profile,
    pub models: Vec<String>,
    pub peers: Vec<String>,
    pub out: PathBuf,
    pub repeat: Option<usize>,
    /// Micro names to run (empty = none).
    pub micro: Vec<String>,
    pub workers: usize,
    pub backlog: u32,
    /// Whole-run time budget (quick); None = the profile's.
    pub budget: Option<Duration>,
    pub command: String,
    /// Measure server CPU time per request at a fixed offered rate (see [`crate::efficiency`]).
    pub efficiency: bool,
    /// The offered rate of the efficiency pass (requests/s, both modes); None = half the
    /// slowest server's peak in this run.
    pub efficiency_rate: Option<f64>,
    /// Run the server behind a shaped link instead of loopback (`--link`).
    pub link: Option<crate::link::LinkSpec>,
    /// `--seed-conditions`: the seed's method (new connection per request only).
    pub seed_conditions: bool,
    /// The user's servers (`--target`, `--url`), run after the built-in ones.
    pub targets: Vec<Target>,
}

/// Writes the two files every server serves: `small.html` and `big.bin`.
pub(crate) fn write_site(www: &Path) -> anyhow::Result<()> {
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

/// Every model target the lab knows, in report order: the models of `iolab models`, each
/// followed by its variants (`crate::server::MODEL_VARIANTS`).
pub fn target_names() -> Vec<String> {
    let mut v = Vec::new();
    for m in Model::ALL {
        v.push(m.name().to_string());
        for (name, base, _) in crate::server::MODEL_VARIANTS {
            if base == m {
                v.push(name.to_string());
            }
        }
    }
    v
}

/// The servers to run, in report order.
pub fn targets(models: &[String], peers: &[String]) -> (Vec<Target>, Vec<TargetInfo>) {
    let mut t = Vec::new();
    let mut skipped = Vec::new();
    for name in target_names() {
        if models.contains(&name) {
            let Some((model, accept)) = crate::server::model_of(&name) else {
                continue;
            };
            let (seed, what) = model.describe();
            // A variant names the flag it adds to `iolab serve`.
            let with = ServeSpec::accept_arg(accept).join(" ");
            let seed = match (name.as_str(), accept == Config::default().accept) {
                ("uring-callback", _) => "CR-iocp, accept async".to_string(),
                (_, true) => seed.to_string(),
                _ if model == Model::UringCallback => format!("CR, with {with}"),
                _ => format!("{seed}, with {with}"),
            };
            t.push(Target {
                name,
                kind: Kind::Model { model, accept },
                describe: format!("{what} (seed: {seed})"),
            });
        }
    }
    for p in peers {
        let (bin, describe) = match p.as_str() {
            "nginx" => ("nginx", "nginx (Debian), event loop per worker, sendfile"),
            "tokio" => (
                "iolab-tokio-server",
                "tokio + hyper, work-stealing async runtime",
            ),
            "monoio" => (
                "iolab-monoio-server",
                "monoio, io_uring thread-per-core runtime, iolab HTTP",
            ),
            "glommio" => (
                "iolab-glommio-server",
                "glommio, io_uring thread-per-core executor, iolab HTTP",
            ),
            _ => continue,
        };
        match crate::server::find_binary(bin) {
            Some(path) => t.push(Target {
                name: p.clone(),
                kind: match p.as_str() {
                    "nginx" => Kind::Nginx(path),
                    "monoio" => Kind::Monoio(path),
                    "glommio" => Kind::Glommio(path),
                    _ => Kind::Tokio(path),
                },
                describe: describe.into(),
            }),
            None => skipped.push(TargetInfo {
                name: p.clone(),
                kind: TargetKind::Peer,
                describe: describe.into(),
                status: Status::Skipped,
                failures: vec![format!("{bin} not found next to iolab or on PATH")],
                ..TargetInfo::default()
            }),
        }
    }
    (t, skipped)
}

/// Runs the whole lab and writes the report. Returns the results.
pub fn run(opts: &Options) -> anyhow::Result<Results> {
    let t0 = Instant::now();
    let mut reserved = target_names();
    reserved.extend(crate::select::PEERS.map(String::from));
    crate::byo::check_unique(&opts.targets, &reserved)?;
    check_urls(opts)?;
    let plan = Plan::for_run(opts);
    let stage = Stage::prepare(opts, true, "iolab lab")?;
    let nofile = iolab_sys::raise_nofile_limit().unwrap_or((0, 0));
    let machine = iolab_sys::host::Machine::collect();
    let cpus = iolab_sys::cpu::allowed_cpus().unwrap_or_default();
    let (server_cpu, client_cpu) = if cpus.len() >= 2 {
        (Some(cpus[0]), Some(cpus[1]))
    } else {
        (None, None)
    };
    let (settings, warnings) = settings(
        &plan,
        opts,
        &machine,
        stage.sources.len(),
        (server_cpu, client_cpu),
        nofile,
    );
    let (mut targets, skipped) = targets(&opts.models, &opts.peers);
    targets.extend(opts.targets.iter().cloned());
    for s in &skipped {
        tracing::warn!("peer {} skipped: {}", s.name, s.failures.join("; "));
    }
    announce(&plan, opts, targets.len());
    let mut results = Results {
        settings,
        warnings,
        ..crate::stage::results_header(opts, &machine)?
    };
    run_micros(opts, &plan, t0, &mut results);

    let bench = Bench {
        plan: &plan,
        out: &opts.out,
        client: Client {
            sources: stage.sources.clone(),
            cpu: client_cpu,
        },
    };
    // Reserve for writing the report and shutting servers down, and for the efficiency
    // pass after the matrix.
    let eff_plan = crate::efficiency::plan_for(opts.profile);
    let eff_reserve = if opts.efficiency {
        let (duration, repeats) = eff_plan;
        targets.len() as f64 * (2.0 * repeats as f64 * (duration.as_secs_f64() + 0.15) + 1.5)
    } else {
        0.0
    };
    let deadline = plan.budget.map(|b| {
        t0 + b.saturating_sub(Duration::from_secs(40) + Duration::from_secs_f64(eff_reserve))
    });
    let run_dir = opts.out.join("run");
    let launch = |t: &Target| {
        let workers = if t.is_peer() {
            opts.workers.max(1)
        } else {
            opts.workers
        };
        stage.launch(run_dir.join(&t.name), workers, server_cpu, Vec::new())
    };
    let mut infos = Matrix::new(&bench, &targets, &launch, t0, deadline).run(&mut results)?;
    if opts.efficiency {
        let eff =
            crate::efficiency::pass(&results, opts, &targets, &launch, &bench.client, eff_plan);
        results.efficiency = Some(eff);
    }
    infos.extend(skipped);
    results.targets = infos;
    results.method = crate::plan::method(&plan, &stage.sources, opts);
    stage.finish(&mut results)?;
    results.seed_vs_iolab = crate::seedtable::build(&results);
    results.elapsed_s = t0.elapsed().as_secs_f64();
    write_outputs(&results, &opts.out)?;
    tracing::info!(target: "progress",
        "iolab lab: done in {}; report: {}",
        hms(results.elapsed_s),
        opts.out.join("index.html").display()
    );
    Ok(results)
}

/// Every `--url` server serves the lab's files, or the run stops before it starts: the
/// site is written first (the same bytes every run) so that a server pointed at
/// `OUT/www` passes.
fn check_urls(opts: &Options) -> anyhow::Result<()> {
    let urls: Vec<(&str, &crate::byo::UrlTarget)> = opts
        .targets
        .iter()
        .filter_map(|t| match &t.kind {
            Kind::Url(u) => Some((t.name.as_str(), u)),
            _ => None,
        })
        .collect();
    if urls.is_empty() {
        return Ok(());
    }
    let www = opts.out.join("www");
    write_site(&www)?;
    for (name, u) in urls {
        crate::byo::check_url(u, &www).with_context(|| format!("--url {name}"))?;
    }
    Ok(())
}

/// The settings table and the warnings of this run (see [`crate::settings`]), which the
/// warnings also go to the log.
fn settings(
    plan: &Plan,
    opts: &Options,
    machine: &iolab_sys::host::Machine,
    source_addrs: usize,
    cpus: (Option<usize>, Option<usize>),
    (nofile_before, nofile_after): (u64, u64),
) -> (BTreeMap<String, String>, Vec<String>) {
    let demand = crate::settings::Demand {
        max_concurrency: plan.max_concurrency(),
        backlog: opts.backlog,
        max_requests_per_point: plan.small_requests.unwrap_or(50_000),
        source_addrs,
    };
    let (mut settings, warnings) = crate::settings::assess(machine, &demand, cpus);
    // The lab runs every model with `iolab serve`'s default buffers (the same for all).
    settings.insert(
        "read buffer, every model".into(),
        format!("{} B", iolab_stats::models::DEFAULT_READ_BUF),
    );
    settings.insert(
        "iovecs per send, every model".into(),
        iolab_stats::models::DEFAULT_MAX_IOV.to_string(),
    );
    if nofile_after != nofile_before {
        settings.insert(
            "ulimit -n".into(),
            format!("{nofile_after} (raised by the lab from {nofile_before})"),
        );
    }
    for w in &warnings {
        tracing::warn!("{w}");
    }
    (settings, warnings)
}

/// The first progress line: what the run will do and how long it should take.
fn announce(plan: &Plan, opts: &Options, servers: usize) {
    let micro_s = if opts.micro.is_empty() {
        0.0
    } else if opts.profile == Profile::Full {
        600.0
    } else {
        150.0
    };
    let points = plan.points().len();
    tracing::info!(target: "progress",
        "iolab lab --profile {}: {} servers x {} points x {} repeat(s) = {} runs, {} micro(s); estimate {}; output in {}",
        opts.profile.name(),
        servers,
        points,
        plan.repeats,
        servers * points * plan.repeats,
        opts.micro.len(),
        plan.estimate(servers, micro_s),
        opts.out.display()
    );
}

/// The micro-benchmarks, first and alone on the machine; the lab then sizes its points to
/// the time left. With a budget they share at most 35% of it (they take under a minute
/// when healthy; the limit only stops a stuck one from eating the servers' time).
fn run_micros(opts: &Options, plan: &Plan, t0: Instant, results: &mut Results) {
    let micro_end = plan.budget.map(|b| t0 + b.mul_f64(0.35));
    for name in &opts.micro {
        let limit = micro_end
            .map(|e| e.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::from_secs(1800))
            .max(Duration::from_secs(10));
        tracing::info!(target: "progress", "micro {name} (limit {})", hms(limit.as_secs_f64()));
        match crate::micro::run_one(name, &opts.out, opts.profile != Profile::Full, limit) {
            Ok(v) => {
                results.micro.insert(name.clone(), v);
            }
            Err(e) => {
                tracing::warn!("micro {name} failed: {e:#}");
                results
                    .micro_failures
                    .insert(name.clone(), format!("{e:#}"));
            }
        }
    }
}

/// results.json, index.html and Figure 1 as standalone SVGs (figure1-small.svg, figure1-big.svg).
pub fn write_outputs(results: &Results, out: &Path) -> anyhow::Result<()> {
    let json = out.join("results.json");
    // Compact: the traces make it megabytes when pretty-printed (`jq .` to read it).
    std::fs::write(&json, serde_json::to_string(results)? + "\n")
        .with_context(|| format!("writing {}", json.display()))?;
    // Figure 1 on its own, for a README or a slide.
    for file in FileKind::ALL {
        let svg_path = out.join(format!("figure1-{file}.svg"));
        let num = if file == FileKind::Small { 1 } else { 3 };
        let svg = crate::report::figure1(results, file, num);
        std::fs::write(&svg_path, svg)
            .with_context(|| format!("writing {}", svg_path.display()))?;
    }
    let html = out.join("index.html");
    std::fs::write(&html, crate::report::render(results))
        .with_context(|| format!("writing {}", html.display()))?;
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

    #[test]
    fn unknown_peers_are_ignored_and_missing_ones_skipped() {
        let (t, s) = targets(&["epoll".into(), "nope".into()], &["bogus".into()]);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].name, "epoll");
        assert!(s.is_empty());
    }
}
