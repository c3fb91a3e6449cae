//! The experiment: the micro-benchmarks, every server through the matrix
//! ([`crate::matrix`], each point a [`crate::point`] run), the efficiency pass, then the
//! report.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::matrix::Matrix;
pub use crate::plan::{budget_requests, hms, Plan, PointSpec, Profile};
use crate::point::{Bench, Client};
use crate::results::Results;
use crate::server::{Kind, Target};
use crate::stage::Stage;

pub use crate::catalog::{target_names, targets};
pub use crate::options::Options;
pub use crate::report::write_outputs;
pub use crate::site::{write_site, BIG_BYTES, SMALL_BYTES};

/// Runs the whole lab and writes the report. Returns the results.
pub fn run(opts: &Options) -> anyhow::Result<Results> {
    let t0 = Instant::now();
    let mut reserved = target_names();
    reserved.extend(crate::catalog::PEERS.map(String::from));
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
    let eff_plan = crate::efficiency::plan_for(opts.profile, opts.repeat);
    let eff_reserve = if opts.efficiency {
        let (duration, repeats) = eff_plan;
        let runs = 2 * crate::efficiency::RATES_PER_MODE * repeats;
        targets.len() as f64 * (runs as f64 * (duration.as_secs_f64() + 0.15) + 1.5)
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
