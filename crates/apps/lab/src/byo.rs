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

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::results::FileKind;
use crate::server::{Kind, Launch, Target};

/// The placeholders a `--target` command may use, and what each becomes.
pub const PLACEHOLDERS: [(&str, &str); 5] = [
    ("{addr}", "IP:PORT the lab chose for this start"),
    ("{ip}", "the IP alone"),
    ("{port}", "the port alone"),
    ("{root}", "the directory holding small.html and big.bin"),
    (
        "{dir}",
        "a scratch directory of this target (config, pid file)",
    ),
];

/// Longest target name: it names files and directories of the report.
pub const MAX_NAME: usize = 40;

/// Longest response the readiness check reads (the big file is 700 KB).
const MAX_RESPONSE: usize = 4 << 20;

/// A server already running, named by `--url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlTarget {
    /// As the user wrote it.
    pub url: String,
    pub addr: SocketAddr,
    /// The Host header: the URL's authority.
    pub host: String,
    /// The path the lab's files are under ("" for the root, else "/a/b").
    pub prefix: String,
}

impl UrlTarget {
    /// `http://IP[:PORT][/PREFIX]` (no query); the lab fetches PREFIX/small.html and
    /// PREFIX/big.bin.
    pub fn parse(url: &str) -> anyhow::Result<UrlTarget> {
        let t = iolab_load::parse_url(url)?;
        if t.path.contains('?') {
            bail!("{url:?}: no query string: the lab appends /small.html and /big.bin to the path");
        }
        Ok(UrlTarget {
            url: url.to_string(),
            addr: t.addr,
            host: t.host,
            prefix: t.path.trim_end_matches('/').to_string(),
        })
    }

    /// The paths the server must serve.
    pub fn paths(&self) -> [String; 2] {
        FileKind::ALL.map(|f| format!("{}{}", self.prefix, f.path()))
    }
}

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

/// A value as one shell word: as it is when it needs no quoting, else single-quoted.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._:,+-=@%".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The command of one start: the placeholders replaced by this launch's values (paths
/// quoted for the shell when they need it). Other braces are left to the shell.
pub fn substitute(template: &str, l: &Launch) -> String {
    template
        .replace("{addr}", &l.addr.to_string())
        .replace("{ip}", &l.addr.ip().to_string())
        .replace("{port}", &l.addr.port().to_string())
        .replace("{root}", &shell_word(&l.www.to_string_lossy()))
        .replace("{dir}", &shell_word(&l.run_dir.to_string_lossy()))
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

/// One HTTP/1.1 GET with `Connection: close`, read to the end: (status, body). Every step
/// is bounded by `deadline`.
pub fn get(
    addr: SocketAddr,
    host: &str,
    path: &str,
    deadline: Instant,
) -> anyhow::Result<(u16, Vec<u8>)> {
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let mut s = TcpStream::connect_timeout(&addr, left())?;
    s.set_write_timeout(Some(left()))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: iolab-lab\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    loop {
        s.set_read_timeout(Some(left()))?;
        let n = s
            .read(&mut chunk)
            .with_context(|| format!("reading the answer to GET {path}"))?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_RESPONSE {
            bail!("GET {path}: answer longer than {MAX_RESPONSE} bytes");
        }
        if let Some(len) = complete_length(&buf) {
            buf.truncate(len);
            break;
        }
    }
    parse_response(&buf).with_context(|| format!("GET {path}"))
}

/// The header end and the Content-Length of a response head, when both are there.
fn head_and_length(buf: &[u8]) -> Option<(usize, Option<usize>)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buf[..end]);
    let len = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse().ok())?
    });
    Some((end, len))
}

/// The whole response's length once it has all arrived (by Content-Length).
fn complete_length(buf: &[u8]) -> Option<usize> {
    let (end, len) = head_and_length(buf)?;
    let total = end + len?;
    (buf.len() >= total).then_some(total)
}

fn parse_response(buf: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
    let Some((end, len)) = head_and_length(buf) else {
        bail!(
            "no complete HTTP response head ({} bytes received)",
            buf.len()
        );
    };
    let status_line = String::from_utf8_lossy(&buf[..end]);
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|_| status_line.starts_with("HTTP/1."))
        .with_context(|| {
            format!(
                "not an HTTP/1.x status line: {:?}",
                status_line.lines().next().unwrap_or("")
            )
        })?;
    let body = buf[end..].to_vec();
    if let Some(len) = len {
        if body.len() < len {
            bail!("body cut short: {} of {len} bytes", body.len());
        }
    }
    Ok((status, body))
}

/// Why a check failed: the server is not there (yet), or it answered wrongly.
#[derive(Debug)]
pub enum SiteError {
    /// No answer: refused, reset, timed out. Worth retrying while a server starts.
    Unreachable(anyhow::Error),
    /// An answer that is not the lab's file: retrying will not help.
    Wrong(String),
}

impl std::fmt::Display for SiteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SiteError::Unreachable(e) => write!(f, "no answer: {e:#}"),
            SiteError::Wrong(s) => f.write_str(s),
        }
    }
}

/// Checks that the server at `addr` serves the lab's two files of `www` under `prefix`,
/// byte for byte.
pub fn check_site(
    addr: SocketAddr,
    host: &str,
    prefix: &str,
    www: &Path,
    deadline: Instant,
) -> Result<(), SiteError> {
    for file in FileKind::ALL {
        let want = std::fs::read(www.join(file.path().trim_start_matches('/')))
            .map_err(|e| SiteError::Wrong(format!("reading the lab's {file} file: {e}")))?;
        let path = format!("{prefix}{}", file.path());
        let (status, body) = get(addr, host, &path, deadline).map_err(SiteError::Unreachable)?;
        if status != 200 {
            return Err(SiteError::Wrong(format!(
                "GET {path} on {addr} answered {status}, not 200"
            )));
        }
        if body != want {
            return Err(SiteError::Wrong(format!(
                "GET {path} on {addr} answered {} bytes that are not the lab's {} ({} bytes)",
                body.len(),
                file.path().trim_start_matches('/'),
                want.len()
            )));
        }
    }
    Ok(())
}

/// The readiness check of a started command: `check_site` until it passes, answers
/// wrongly, or `limit` runs out; `exited` says whether the command is gone (then no
/// point in waiting).
pub fn wait_serving(
    addr: SocketAddr,
    www: &Path,
    limit: Duration,
    mut exited: impl FnMut() -> Option<String>,
) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let host = addr.to_string();
    loop {
        if let Some(status) = exited() {
            bail!("exited at start ({status})");
        }
        let attempt = (Instant::now() + Duration::from_secs(2)).min(t0 + limit);
        match check_site(addr, &host, "", www, attempt) {
            Ok(()) => return Ok(()),
            Err(SiteError::Wrong(why)) => {
                bail!("answers, but not with the lab's files: {why} (it must serve {{root}})")
            }
            Err(SiteError::Unreachable(e)) if t0.elapsed() >= limit => bail!(
                "did not serve GET /small.html on {addr} within {:.0} s (last try: {e:#})",
                limit.as_secs_f64()
            ),
            Err(SiteError::Unreachable(_)) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Checks a `--url` server before a start: what it must serve is in the error.
pub fn check_url(u: &UrlTarget, www: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    check_site(u.addr, &u.host, &u.prefix, www, deadline).map_err(|e| {
        anyhow::anyhow!(
            "{} does not serve the lab's files ({e}): it must answer {} with the bytes of {}/small.html and {}/big.bin (the same every run: serve that directory, or copy it)",
            u.url,
            u.paths().join(" and "),
            www.display(),
            www.display()
        )
    })
}

/// The tail of a target's stderr (else its stdout) since its last start marker.
pub fn log_tail(stderr: &Path, stdout: &Path) -> String {
    let since_marker = |p: &Path| {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        match text.rfind(START_MARKER) {
            Some(i) => text[i..].lines().skip(1).collect::<Vec<_>>().join("\n"),
            None => text,
        }
    };
    let err = since_marker(stderr);
    let (which, text) = if err.trim().is_empty() {
        ("stdout", since_marker(stdout))
    } else {
        ("stderr", err)
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    match lines.len() {
        0 => "(nothing on stderr or stdout)".into(),
        n => format!("{which}: {}", lines[n.saturating_sub(5)..].join(" | ")),
    }
}

/// The line the lab writes into a target's logs before each start.
pub const START_MARKER: &str = "--- iolab lab: start ";

/// Appends the start marker and the command to both logs; returns the open files.
pub fn open_logs(
    stdout: &Path,
    stderr: &Path,
    command: &str,
) -> anyhow::Result<(std::fs::File, std::fs::File)> {
    let open = |p: &Path| -> anyhow::Result<std::fs::File> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .with_context(|| format!("opening {}", p.display()))?;
        writeln!(f, "{START_MARKER}(unix {}): sh -c {command:?}", unix_now())?;
        Ok(f)
    };
    Ok((open(stdout)?, open(stderr)?))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch() -> Launch {
        Launch {
            iolab: "/x/iolab".into(),
            www: "/r/my www".into(),
            run_dir: "/r/run/py".into(),
            addr: "127.0.0.1:8099".parse().unwrap(),
            workers: 1,
            backlog: 128,
            cpu: None,
            cpus: Vec::new(),
            netns: None,
        }
    }

    #[test]
    fn placeholders_become_this_starts_values() {
        let c = substitute(
            "python3 -m http.server {port} --bind {ip} --directory {root} # {addr} {dir} ${HOME} {x}",
            &launch(),
        );
        assert_eq!(
            c,
            "python3 -m http.server 8099 --bind 127.0.0.1 --directory '/r/my www' # 127.0.0.1:8099 /r/run/py ${HOME} {x}"
        );
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }

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

    #[test]
    fn responses_are_framed_by_length() {
        let r = b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nabcdef";
        assert_eq!(complete_length(r), Some(r.len() - 3));
        assert_eq!(
            parse_response(&r[..r.len() - 3]).unwrap(),
            (200, b"abc".to_vec())
        );
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab").is_err());
        assert!(parse_response(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        // Without a length: to the end of the stream.
        assert_eq!(
            parse_response(b"HTTP/1.1 404 Not Found\r\n\r\nno").unwrap(),
            (404, b"no".to_vec())
        );
    }

    /// A server that answers with something else is told apart from one not there yet.
    #[test]
    fn the_site_check_wants_the_labs_bytes() {
        let dir = iolab_sys::testing::tempdir("lab-byo-site").unwrap();
        let www = dir.path().join("www");
        crate::lab::write_site(&www).unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let srv = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut b = [0u8; 1024];
            let _ = s.read(&mut b);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        let e = check_site(addr, "h", "", &www, deadline).unwrap_err();
        srv.join().unwrap();
        assert!(
            matches!(&e, SiteError::Wrong(w) if w.contains("5 bytes that are not the lab's small.html")),
            "{e}"
        );
        // Nobody listening: unreachable, retried until the limit.
        let e = wait_serving(addr, &www, Duration::from_millis(300), || None).unwrap_err();
        assert!(format!("{e:#}").contains("within"), "{e:#}");
        let u = UrlTarget::parse(&format!("http://{addr}/x")).unwrap();
        let e = format!("{:#}", check_url(&u, &www).unwrap_err());
        assert!(e.contains("/x/small.html and /x/big.bin"), "{e}");
    }

    #[test]
    fn the_log_tail_is_of_the_last_start() {
        let dir = iolab_sys::testing::tempdir("lab-byo-logs").unwrap();
        let (out, err) = (dir.path().join("o"), dir.path().join("e"));
        let (_, mut e) = open_logs(&out, &err, "a").unwrap();
        writeln!(e, "old failure").unwrap();
        let (_, mut e) = open_logs(&out, &err, "b").unwrap();
        assert_eq!(log_tail(&err, &out), "(nothing on stderr or stdout)");
        writeln!(e, "bind: address in use").unwrap();
        assert_eq!(log_tail(&err, &out), "stderr: bind: address in use");
        // Both starts are kept.
        let text = std::fs::read_to_string(&err).unwrap();
        assert_eq!(text.matches(START_MARKER).count(), 2);
    }
}
