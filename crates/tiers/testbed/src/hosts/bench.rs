//! `iolab tiers bench` over the hosts of `up --hosts`: the vanilla and the ODB stack each a
//! node per tier host (ports `up`'s + 100 and + 110), wrk and curl on the client host, each
//! tier's CPU read on its host around every run (its node's cgroup, else its processes'
//! `/proc/PID/stat`), the IS host's interface bytes, the ODB counters from the nodes'
//! files. The measuring itself is the local bench's ([`crate::bench::measure`]).

use std::net::SocketAddrV4;
use std::time::Duration;

use anyhow::{bail, Context};
use iolab_hosts::ssh::{quote, shell_line};

use super::{Hosts, HostsStack, Node, STEP_LIMIT};
use crate::bench::{
    cpu_choice, cpu_times, measure, BenchHost, BenchOpts, BenchResult, Method, Rig, Snapshot,
};
use crate::cpu::TierCounters;
use crate::report::{Host, NginxConfig};
use crate::state::State;

/// How long a wrk run may take beyond its own duration (ssh, wrk's timeout).
const WRK_GRACE: Duration = Duration::from_secs(30);

struct HostsRig<'a> {
    hosts: &'a Hosts,
    /// vanilla, ODB
    stacks: [&'a HostsStack; 2],
}

/// The shell lines that print a node's CPU seconds so far: its cgroup's file, or (no
/// cgroup) CLK_TCK and the `/proc/PID/stat` of every process of its session.
fn cpu_script(n: &Node) -> String {
    match &n.status.cgroup {
        Some(cg) => {
            let file = if n.status.cgroup_v2 {
                "cpu.stat"
            } else {
                "cpuacct.usage"
            };
            format!("cat {}", quote(&cg.join(file).to_string_lossy()))
        }
        None => format!(
            "getconf CLK_TCK; for p in $(ps -o pid= -s {}); do cat /proc/$p/stat 2>/dev/null; echo; done",
            n.status.pid
        ),
    }
}

/// CPU seconds from [`cpu_script`]'s fallback: CLK_TCK, then `/proc/PID/stat` lines
/// (user + system time of each process and of the children it reaped).
pub fn proc_tree_cpu_seconds(text: &str) -> Option<f64> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let tck: f64 = lines.next()?.trim().parse().ok()?;
    if tck <= 0.0 {
        return None;
    }
    let mut ticks = 0.0;
    for l in lines {
        let after = l.rsplit_once(')')?.1;
        let f: Vec<&str> = after.split_whitespace().collect();
        // after the command: state, ppid, pgrp, session, tty, tpgid, flags, minflt,
        // cminflt, majflt, cmajflt, utime, stime, cutime, cstime
        for v in f.get(11..15)? {
            ticks += v.parse::<f64>().ok()?;
        }
    }
    Some(ticks / tck)
}

/// The sections of a snapshot's output: `@name` lines start each.
fn sections(text: &str) -> Vec<(&str, String)> {
    let mut out: Vec<(&str, String)> = Vec::new();
    for l in text.lines() {
        if let Some(name) = l.strip_prefix('@') {
            out.push((name.trim(), String::new()));
        } else if let Some((_, body)) = out.last_mut() {
            body.push_str(l);
            body.push('\n');
        }
    }
    out
}

/// The sum of concatenated ODB counter files (one JSON object each).
pub fn sum_counters(text: &[u8]) -> anyhow::Result<(iolab_odb::counters::OdbCounters, usize)> {
    let mut sum = iolab_odb::counters::OdbCounters::default();
    let mut n = 0;
    for v in serde_json::Deserializer::from_slice(text).into_iter() {
        sum += v.context("an ODB counter file")?;
        n += 1;
    }
    Ok((sum, n))
}

impl Rig for HostsRig<'_> {
    fn url(&self, odb: bool, path: &str) -> String {
        self.stacks[usize::from(odb)].url(path)
    }

    fn fetch(&self, url: &str) -> anyhow::Result<Vec<u8>> {
        self.hosts.get("client").fetch(url)
    }

    fn wrk(&self, args: &[String]) -> anyhow::Result<String> {
        let client = self.hosts.get("client");
        let cpus = &client.ssh.host.cpus;
        let pin = if cpus.is_empty() {
            String::new()
        } else {
            let l: Vec<String> = cpus.iter().map(usize::to_string).collect();
            format!("taskset -c {} ", l.join(","))
        };
        let argv: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
        let secs: u64 = args
            .iter()
            .find_map(|a| a.strip_prefix("-d")?.strip_suffix('s')?.parse().ok())
            .unwrap_or(1);
        let out = client
            .run(
                &format!("{pin}{}", shell_line(&argv)),
                Duration::from_secs(secs) + WRK_GRACE,
            )
            .context("wrk on the client host (Debian package wrk)")?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    fn snapshot(&self, odb: bool) -> anyhow::Result<Snapshot> {
        let stack = self.stacks[usize::from(odb)];
        let mut snap = Snapshot {
            cpu_s: [0.0; 3],
            is_bytes: 0,
            cpu_times: Some(iolab_sys::cpu::CpuTimes { steal: 0, total: 0 }),
        };
        for (i, tier) in crate::stack::TIERS.iter().enumerate() {
            let node = stack.node(tier);
            let r = self.hosts.get(tier);
            let mut script = format!(
                "echo @cpu; {}; echo @stat; grep '^cpu' /proc/stat",
                cpu_script(node)
            );
            if *tier == "is" {
                script += "; echo @ip; ip -s -j link show";
            }
            let out = r.run(&script, STEP_LIMIT)?;
            let text = String::from_utf8_lossy(&out);
            for (name, body) in sections(&text) {
                match name {
                    "cpu" => {
                        snap.cpu_s[i] = match &node.status.cgroup {
                            Some(_) => crate::cpu::cgroup_cpu_seconds(&body, node.status.cgroup_v2),
                            None => proc_tree_cpu_seconds(&body),
                        }
                        .with_context(|| format!("CPU of the {tier} on its host: {body:?}"))?;
                    }
                    "stat" => {
                        let cpus = cpu_choice(Some(
                            &r.ssh
                                .host
                                .cpus
                                .iter()
                                .map(usize::to_string)
                                .collect::<Vec<_>>()
                                .join(","),
                        ));
                        snap.cpu_times = match (snap.cpu_times, cpu_times(&body, &cpus)) {
                            (Some(a), Some(b)) => Some(iolab_sys::cpu::CpuTimes {
                                steal: a.steal + b.steal,
                                total: a.total + b.total,
                            }),
                            _ => None,
                        };
                    }
                    "ip" => {
                        snap.is_bytes = crate::cpu::parse_iface_bytes(body.as_bytes())?
                            .iter()
                            .map(|(_, rx, tx)| rx + tx)
                            .sum();
                    }
                    _ => {}
                }
            }
        }
        Ok(snap)
    }

    fn odb_counters(&self) -> anyhow::Result<TierCounters> {
        let stack = self.stacks[1];
        let mut out = TierCounters::default();
        for (tier, sum) in [
            ("fe", &mut out.fe),
            ("is", &mut out.is),
            ("be", &mut out.be),
        ] {
            let dir = stack.node(tier).spec.dir.join("stack/odb").join(tier);
            let text = self.hosts.get(tier).run(
                &format!(
                    "cat {}/odb-*.json 2>/dev/null || true",
                    quote(&dir.to_string_lossy())
                ),
                STEP_LIMIT,
            )?;
            let (s, files) =
                sum_counters(&text).with_context(|| format!("ODB counters of the {tier}"))?;
            if files == 0 {
                bail!(
                    "ODB counters of the {tier}: no odb-*.json in {}",
                    dir.display()
                );
            }
            *sum = s;
        }
        Ok(out)
    }
}

/// Runs the ODB bench over the hosts of a testbed that `up --hosts` brought up.
pub fn run(state: &State, o: &BenchOpts, progress: &dyn Fn(&str)) -> anyhow::Result<BenchResult> {
    let hs = state
        .hosts
        .as_ref()
        .context("the testbed is not on hosts")?;
    if o.php {
        bail!("--php runs on the namespaces testbed only (no php-fpm node on hosts yet)");
    }
    let mut hosts = Hosts::open(
        &hs.inventory,
        (&hs.known_hosts, hs.accept_new),
        &state.dir,
        &format!("b{}", std::process::id()),
    )?;
    hosts.use_dirs(&hs.dirs);
    let base = state.up.port + 100;
    let name = |mode: &str| format!("bench{}-{mode}", std::process::id());
    let vanilla = HostsStack::start(&hosts, &name("vanilla"), base, None, &o.sizes)
        .context("starting the vanilla stack on the hosts")?;
    let odb_params = (o.odb.threshold, o.odb.agent_memory_mib);
    let odb = HostsStack::start(&hosts, &name("odb"), base + 10, Some(odb_params), &o.sizes)
        .context("starting the ODB stack on the hosts")?;
    let rig = HostsRig {
        hosts: &hosts,
        stacks: [&vanilla, &odb],
    };
    let sizes = measure(&rig, o, progress)?;
    let agent = SocketAddrV4::new(state.be.addr, base + 10 + 3);
    let agent_stats = iolab_odb::agent::client::stats(agent).ok();
    let counters = rig.odb_counters()?;
    let configs = odb.configs();
    drop(odb);
    drop(vanilla);
    let machines = hosts
        .remotes
        .iter()
        .map(|r| BenchHost {
            role: r.role.into(),
            name: r.ssh.host.name.clone(),
            address: r.ssh.host.address.to_string(),
            cpus: r.ssh.host.cpus.clone(),
            machine: hs
                .machines
                .iter()
                .find(|(role, _)| role == r.role)
                .map(|(_, m)| m.clone())
                .unwrap_or_default(),
        })
        .collect();
    let cpus_of = |role: &str| {
        let c = &hosts.get(role).ssh.host.cpus;
        (!c.is_empty()).then(|| c.iter().map(usize::to_string).collect::<Vec<_>>().join(","))
    };
    Ok(BenchResult {
        bench: "tiers",
        machine: Host::probe(),
        method: Method {
            client_cpus: cpus_of("client"),
            ..Method::of(o, "wrk -t1 (client host, over ssh)")
        },
        nginx_configs: NginxConfig::list(&configs),
        php_fpm_config: None,
        sizes,
        odb_counters_last_run: counters,
        agent_stats_last_run: agent_stats,
        hosts: Some(machines),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_trees_cpu_is_its_processes_user_and_system_time() {
        // CLK_TCK 100; two processes ("nginx: worker" has a space and a ')' in its name)
        let fields = |u: u32, s: u32, cu: u32, cs: u32| {
            format!("S 1 2 2 0 -1 4194560 10 0 0 0 {u} {s} {cu} {cs} 20 0 1 0 5 100 7")
        };
        let text = format!(
            "100\n12 (nginx: master) {}\n\n13 (a) b) {}\n",
            fields(10, 5, 100, 50),
            fields(1, 2, 0, 0)
        );
        let s = proc_tree_cpu_seconds(&text).unwrap();
        assert!((s - 1.68).abs() < 1e-9, "{s}");
        assert!(
            proc_tree_cpu_seconds("100\n12 (x) S 1\n").is_none(),
            "short stat"
        );
        assert!(proc_tree_cpu_seconds("0\n").is_none());
        assert_eq!(proc_tree_cpu_seconds("100\n"), Some(0.0));
    }

    #[test]
    fn snapshot_sections_and_counter_files_are_read_apart() {
        let s = sections("junk\n@cpu\nusage_usec 5\n@stat\ncpu 1 2\ncpu0 1 2\n@ip\n[]\n");
        let names: Vec<&str> = s.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["cpu", "stat", "ip"]);
        assert_eq!(s[1].1, "cpu 1 2\ncpu0 1 2\n");
        let one = serde_json::to_string(&iolab_odb::counters::OdbCounters::default()).unwrap();
        let (_, n) = sum_counters(format!("{one}\n{one}").as_bytes()).unwrap();
        assert_eq!(n, 2);
        assert_eq!(sum_counters(b"").unwrap().1, 0);
        assert!(sum_counters(b"{\"nope\"").is_err());
    }
}
