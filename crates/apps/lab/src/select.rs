//! What a lab run measures, as the user names it: the models, peers and microbenchmarks of
//! comma-separated lists, checked against what exists; and the seeder bench JSON a report
//! may carry.

use anyhow::{bail, Context};

/// The seeder bench JSON of `path`: an object with a `summary` list, or a clear error.
pub fn read_seed_bench(path: &std::path::Path) -> anyhow::Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    if !v.get("summary").is_some_and(serde_json::Value::is_array) {
        bail!(
            "{} is not the JSON of `iolab seed bench --json` (no \"summary\" list)",
            path.display()
        );
    }
    Ok(v)
}

fn list(s: &str) -> Vec<String> {
    s.split(',')
        .map(|x| x.trim().to_string())
        .filter(|x| !x.is_empty())
        .collect()
}

/// The model names asked for, checked against `iolab models`.
pub fn parse_models(s: &str) -> anyhow::Result<Vec<String>> {
    let known = crate::catalog::target_names();
    let known: Vec<&str> = known.iter().map(String::as_str).collect();
    let asked = list(s);
    if asked.is_empty() {
        bail!(
            "--models is empty; give model names ({}) or \"all\"",
            known.join(", ")
        );
    }
    if asked.iter().any(|m| m == "none") {
        return Ok(Vec::new());
    }
    if asked.iter().any(|m| m == "all") {
        return Ok(known.iter().map(|s| s.to_string()).collect());
    }
    for m in &asked {
        if !known.contains(&m.as_str()) {
            bail!("unknown model {m:?}; known: {}", known.join(", "));
        }
    }
    Ok(asked)
}

pub use crate::catalog::PEERS;

pub fn parse_peers(s: &str) -> anyhow::Result<Vec<String>> {
    let asked = list(s);
    if asked.iter().any(|p| p == "none") {
        return Ok(Vec::new());
    }
    for p in &asked {
        if !PEERS.contains(&p.as_str()) {
            bail!("unknown peer {p:?}; known: {} (or none)", PEERS.join(", "));
        }
    }
    Ok(asked)
}

pub fn parse_micro(s: Option<&str>, none: bool) -> anyhow::Result<Vec<String>> {
    if none {
        return Ok(Vec::new());
    }
    let Some(s) = s else {
        return Ok(iolab_stats::microbenchmarks::NAMES
            .iter()
            .map(|s| s.to_string())
            .collect());
    };
    let asked = list(s);
    for m in &asked {
        if !iolab_stats::microbenchmarks::NAMES.contains(&m.as_str()) {
            bail!(
                "unknown microbenchmark {m:?}; known: {}",
                iolab_stats::microbenchmarks::NAMES.join(", ")
            );
        }
    }
    Ok(asked)
}

/// Rewrites `dir`/index.html from `dir`/results.json, with the seeder section from
/// `seed_bench` (or `dir`/seed-bench.json when that file is there); returns the page's path.
pub fn render(
    dir: &std::path::Path,
    seed_bench: Option<&std::path::Path>,
) -> anyhow::Result<std::path::PathBuf> {
    let p = dir.join("results.json");
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    let mut r: crate::results::Results =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
    // The seed table is a function of the results: rebuilt with this version's notes.
    r.seed_vs_iolab = crate::seedtable::build(&r);
    let bench = seed_bench.map_or_else(|| dir.join("seed-bench.json"), |b| b.to_path_buf());
    if seed_bench.is_some() || bench.exists() {
        r.seed_bench = Some(read_seed_bench(&bench)?);
    }
    crate::report::write_outputs(&r, dir)?;
    Ok(dir.join("index.html"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_lists() {
        assert_eq!(parse_models("all").unwrap().len(), 11);
        assert!(parse_models("uring-callback-sync").is_ok());
        assert_eq!(
            parse_models("threads, epoll").unwrap(),
            vec!["threads", "epoll"]
        );
        let e = parse_models("threads,nope").unwrap_err().to_string();
        assert!(
            e.contains("unknown model \"nope\"") && e.contains("uring-fixed"),
            "{e}"
        );
        assert!(parse_models(",").is_err());
        assert!(parse_models("none").unwrap().is_empty());
    }

    #[test]
    fn peer_and_micro_lists() {
        assert!(parse_peers("none").unwrap().is_empty());
        assert_eq!(parse_peers("nginx").unwrap(), vec!["nginx"]);
        assert_eq!(
            parse_peers("nginx,tokio,monoio,glommio").unwrap(),
            ["nginx", "tokio", "monoio", "glommio"]
        );
        let e = parse_peers("apache").unwrap_err().to_string();
        assert!(e.contains("known: nginx, tokio, monoio, glommio"), "{e}");
        assert!(parse_micro(None, true).unwrap().is_empty());
        assert_eq!(
            parse_micro(None, false).unwrap().len(),
            iolab_stats::microbenchmarks::NAMES.len()
        );
        assert_eq!(parse_micro(Some("queue"), false).unwrap(), vec!["queue"]);
        assert!(parse_micro(Some("bogus"), false).is_err());
    }
}
