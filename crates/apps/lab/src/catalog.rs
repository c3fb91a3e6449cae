//! The servers the lab knows: every model and its variants, and the peers found on this
//! machine, in report order.

use iolab_servers::spec::ServeSpec;
use iolab_servers::{Config, Model};

use crate::results::{Status, TargetInfo, TargetKind};
use crate::server::{Kind, Target};

/// Every peer `--peers` accepts, in report order.
pub const PEERS: [&str; 4] = ["nginx", "tokio", "monoio", "glommio"];

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_peers_are_ignored_and_missing_ones_skipped() {
        let (t, s) = targets(&["epoll".into(), "nope".into()], &["bogus".into()]);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].name, "epoll");
        assert!(s.is_empty());
    }
}
