//! Bring your own server: `--target NAME='CMD ARGS'` (a command the lab starts and stops for
//! each point, like its own models) and `--url NAME=URL` (a server already running).
//!
//! A command runs under `sh -c` in its own process group, pinned to the server CPU like
//! the built-in models, with `{addr}`, `{ip}`, `{port}`, `{root}` and `{dir}` replaced by
//! the address the lab chose for this start, its IP, its port, the directory holding the
//! lab's files (`small.html`, `big.bin`) and a scratch directory of its own. It is ready
//! when `GET /small.html` and `GET /big.bin` return the lab's bytes; its stdout and
//! stderr are appended to `run/NAME/stdout.log` and `stderr.log` in the report folder.
//!
//! A URL's server is not the lab's child: its CPU time and open connections cannot be read,
//! and results.json says so (`not_measured`). It must serve the lab's two files under the
//! URL's path; the lab checks that before every start and fails with the paths it wants.

use anyhow::{bail, Context};

use crate::server::{Kind, Target};

pub use crate::server::command::{substitute, PLACEHOLDERS};
pub use crate::server::logs::{log_tail, open_logs, START_MARKER};
pub use crate::server::probe::{check_site, check_url, get, wait_serving, SiteError, UrlTarget};

/// Longest target name: it names files and directories of the report.
pub const MAX_NAME: usize = 40;

/// Checks a name given to `--target` or `--url`: it names files of the report.
fn check_name(name: &str, flag: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !ok {
        bail!(
            "{flag} {name:?}: a name is 1-{MAX_NAME} of A-Z a-z 0-9 . _ - (not starting with . or -): it names the target's files in the report"
        );
    }
    if ["all", "none"].contains(&name) {
        bail!("{flag} {name:?}: \"all\" and \"none\" are reserved");
    }
    Ok(())
}

fn split_spec<'a>(spec: &'a str, flag: &str, what: &str) -> anyhow::Result<(&'a str, &'a str)> {
    let (name, rest) = spec
        .split_once('=')
        .with_context(|| format!("{flag} {spec:?}: expected NAME={what}"))?;
    let (name, rest) = (name.trim(), rest.trim());
    check_name(name, flag)?;
    if rest.is_empty() {
        bail!("{flag} {name}: empty {what}");
    }
    Ok((name, rest))
}

/// `NAME=COMMAND` of `--target`. The command must say where to listen (`{port}` or
/// `{addr}`): the lab picks a free port for every start.
pub fn parse_command_target(spec: &str) -> anyhow::Result<Target> {
    let (name, cmd) = split_spec(spec, "--target", "COMMAND")?;
    if !cmd.contains("{port}") && !cmd.contains("{addr}") {
        bail!(
            "--target {name}: the command must contain {{port}} or {{addr}} (the lab picks a free port for each start); placeholders: {}",
            placeholder_help()
        );
    }
    Ok(Target {
        name: name.to_string(),
        kind: Kind::Command(cmd.to_string()),
        describe: format!("command: {cmd}"),
    })
}

/// `NAME=URL` of `--url`.
pub fn parse_url_target(spec: &str) -> anyhow::Result<Target> {
    let (name, url) = split_spec(spec, "--url", "URL")?;
    let u = UrlTarget::parse(url).with_context(|| format!("--url {name}"))?;
    Ok(Target {
        name: name.to_string(),
        describe: format!(
            "already running at {url} (serving {})",
            u.paths().join(", ")
        ),
        kind: Kind::Url(u),
    })
}

/// One line naming every placeholder.
pub fn placeholder_help() -> String {
    PLACEHOLDERS
        .iter()
        .map(|(p, what)| format!("{p} = {what}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every target name once, none a built-in server's (`reserved`).
pub fn check_unique(targets: &[Target], reserved: &[String]) -> anyhow::Result<()> {
    for (i, t) in targets.iter().enumerate() {
        if reserved.contains(&t.name) {
            bail!(
                "target name {:?} is a built-in server's; choose another",
                t.name
            );
        }
        if targets[..i].iter().any(|u| u.name == t.name) {
            bail!("target name {:?} given twice", t.name);
        }
    }
    Ok(())
}

/// What the lab cannot measure of a target, as results.json and the report say it.
pub fn not_measured(kind: &Kind) -> Vec<String> {
    let counters = "server open connections (no iolab counters): achieved concurrency from the client only, Figure 2 without the server's curve";
    match kind {
        Kind::Command(_) => vec![counters.into()],
        Kind::Url(_) => vec![
            "server CPU: not measured (the lab did not start this server; Figure 1b has no row for it)".into(),
            counters.into(),
        ],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_specs_parse_and_bad_ones_say_why() {
        let t = parse_command_target("py = python3 -m http.server {port}").unwrap();
        assert_eq!(t.name, "py");
        assert!(matches!(&t.kind, Kind::Command(c) if c == "python3 -m http.server {port}"));
        for (bad, why) in [
            ("py", "expected NAME=COMMAND"),
            ("=x {port}", "a name is"),
            ("a/b=x {port}", "a name is"),
            ("none=x {port}", "reserved"),
            ("py=", "empty COMMAND"),
            (
                "py=python3 -m http.server 8000",
                "must contain {port} or {addr}",
            ),
        ] {
            let e = format!("{:#}", parse_command_target(bad).unwrap_err());
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        let u = parse_url_target("mine=http://127.0.0.1:8080/site/").unwrap();
        let Kind::Url(u) = &u.kind else {
            panic!("a URL target")
        };
        assert_eq!(u.prefix, "/site");
        assert_eq!(u.host, "127.0.0.1:8080");
        assert_eq!(u.paths(), ["/site/small.html", "/site/big.bin"]);
        let root = UrlTarget::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(root.paths()[0], "/small.html");
        for bad in [
            "mine=https://x",
            "mine=http://example.com/",
            "mine=http://127.0.0.1/?a",
        ] {
            assert!(parse_url_target(bad).is_err(), "{bad}");
        }
        let two = [t.clone(), t];
        assert!(format!("{}", check_unique(&two, &[]).unwrap_err()).contains("twice"));
        assert!(check_unique(&two[..1], &["py".into()]).is_err());
        assert!(check_unique(&two[..1], &["epoll".into()]).is_ok());
    }
}
