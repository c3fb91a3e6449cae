//! End to end: `iolab lab --target` and `--url` with servers nobody here wrote (nginx as a
//! plain command, busybox httpd, python3 -m http.server), found in results.json and in
//! the report; a URL that does not serve the lab's files and a command that dies at start
//! fail with what they said.

use std::path::Path;
use std::process::{Child, Command, Stdio};

mod common;
use common::run_ok;

fn lab(out: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_iolab"));
    c.args(["lab", "--profile", "tiny", "--no-micro", "--out"])
        .arg(out)
        .args(args);
    c
}

/// Processes whose command line holds `needle`, but for `ps` itself.
fn processes_with(needle: &str) -> Vec<String> {
    common::processes(|l| l.contains(needle))
}

/// nginx from its own configuration, which the command fills in per start: the lab only
/// gives the address, the site and a scratch directory.
fn nginx_command(conf_in: &Path) -> String {
    format!(
        "sed -e 's|@ADDR@|{{addr}}|' -e 's|@ROOT@|{{root}}|' {} > {{dir}}/nginx.conf && exec nginx -p {{dir}} -e {{dir}}/error.log -c {{dir}}/nginx.conf -g 'daemon off;'",
        conf_in.display()
    )
}

const NGINX_CONF: &str = "worker_processes 1;
pid nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  server { listen @ADDR@; root @ROOT@; }
}
";

/// `iolab lab --target` with nginx and busybox httpd: both measured at every point, their
/// CPU counted (busybox's is in the children it forks per connection), their output kept,
/// both in the report, nothing left running.
#[test]
fn two_servers_not_written_here_are_measured_and_reported() {
    let (Some(_), Some(_)) = (
        iolab_sys::testing::require_tool("nginx", "nginx"),
        iolab_sys::testing::require_tool("busybox", "busybox"),
    ) else {
        return;
    };
    // Not a private temporary directory: nginx's workers (user nobody, when root) read the
    // site through it.
    let out = std::env::temp_dir().join(format!("iolab-lab-target-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let conf_in = out.join("nginx.conf.in");
    std::fs::write(&conf_in, NGINX_CONF).unwrap();
    let ngx = format!("ngx={}", nginx_command(&conf_in));
    run_ok(&mut lab(
        &out,
        &[
            "--target",
            &ngx,
            "--target",
            "bb=busybox httpd -f -p {addr} -h {root}",
        ],
    ));
    let r = iolab_lab::validate::load_results(&out).unwrap();
    let names: Vec<&str> = r.targets.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["ngx", "bb"], "only the targets (no --models given)");
    let e = r.efficiency.as_ref().expect("efficiency block");
    for t in &r.targets {
        assert_eq!(t.kind, iolab_lab::results::TargetKind::Command);
        assert_eq!(t.status, iolab_lab::results::Status::Ok, "{:?}", t.failures);
        assert!(t.command.as_deref().unwrap().contains("{addr}"));
        let points: Vec<_> = r.points.iter().filter(|p| p.model == t.name).collect();
        assert!(points.len() >= 7, "{}: {} points", t.name, points.len());
        assert!(points.iter().all(|p| p.repeats[0].ok > 0), "{}", t.name);
        for row in e.rows.iter().filter(|x| x.server == t.name) {
            assert!(
                row.repeats.iter().all(|x| x.cpu_s > 0.0),
                "{} {}: no server CPU counted",
                t.name,
                row.mode
            );
        }
        // Both modes, each at half and at a tenth of the lowest peak.
        let rows = |low: bool| {
            e.rows
                .iter()
                .filter(|x| x.server == t.name && x.low == low)
                .count()
        };
        assert_eq!((rows(false), rows(true)), (2, 2));
        // Every start's output is kept, each after its marker.
        let stderr = std::fs::read_to_string(out.join(&t.logs[1])).unwrap();
        assert!(
            stderr.matches("--- iolab lab: start").count() >= 2,
            "{stderr}"
        );
    }
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    for s in [
        "<td>ngx</td><td>command</td>",
        "<td>bb</td><td>command</td>",
        "busybox httpd -f -p {addr} -h {root}",
        "output: run/bb/stdout.log",
    ] {
        assert!(html.contains(s), "index.html lacks {s:?}");
    }
    iolab_lab::validate::check_report(&out).unwrap();
    // The page as Chromium builds it has both servers' rows.
    if let Some(dom) = iolab_sys::testing::chromium_renders(&out.join("index.html")) {
        assert!(dom.contains("<td>ngx</td>") && dom.contains("<td>bb</td>"));
    }
    let left = processes_with(out.to_str().unwrap());
    assert!(left.is_empty(), "left running: {left:?}");
    std::fs::remove_dir_all(&out).unwrap();
}

/// python3's http.server twice: started by the lab (`--target`), and already running
/// (`--url`, serving the lab's own directory), whose CPU the report says it cannot
/// measure.
#[test]
fn python_as_a_target_and_as_a_running_server() {
    let Some(_) = iolab_sys::testing::require_tool("python3", "python3") else {
        return;
    };
    let scratch = iolab_sys::testing::tempdir("lab-url").unwrap();
    let out = scratch.path().join("report");
    let www = out.join("www");
    std::fs::create_dir_all(&www).unwrap();
    let mut server = python_server(&www);
    let url = format!("mine=http://127.0.0.1:{}/", server.1);
    let res = lab(
        &out,
        &[
            "--url",
            &url,
            "--target",
            "py=python3 -m http.server {port} --bind {ip} --directory {root}",
        ],
    )
    .output()
    .unwrap();
    iolab_sys::testing::stop_child(&mut server.0);
    assert!(
        res.status.success(),
        "{}",
        String::from_utf8_lossy(&res.stderr)
    );
    let r = iolab_lab::validate::load_results(&out).unwrap();
    let mine = r.targets.iter().find(|t| t.name == "mine").unwrap();
    assert_eq!(mine.kind, iolab_lab::results::TargetKind::Url);
    assert!(
        mine.not_measured[0].starts_with("server CPU: not measured"),
        "{:?}",
        mine.not_measured
    );
    let e = r.efficiency.as_ref().unwrap();
    assert!(e.rows.iter().all(|x| x.server == "py"));
    assert!(e
        .failures
        .iter()
        .any(|f| f.starts_with("mine: server CPU not measured")));
    for name in ["mine", "py"] {
        assert!(
            r.points.iter().filter(|p| p.model == name).count() >= 7,
            "{name}"
        );
    }
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains("<td>mine</td><td>url</td>"));
    assert!(html.contains("not measured: server CPU"));
    assert!(String::from_utf8_lossy(&res.stderr).contains("its CPU time is not measured"));
}

/// python3 -m http.server on a free port serving `dir`, once it answers.
fn python_server(dir: &Path) -> (Child, u16) {
    let port = iolab_sys::testing::free_port().unwrap();
    let child = Command::new("python3")
        .args([
            "-m",
            "http.server",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .arg("--directory")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed().as_secs() < 10, "python3 http.server not up");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    (child, port)
}

/// A URL whose server does not have the lab's files stops the run before it starts, naming
/// the paths it wants; a command that dies at start is reported with its stderr.
#[test]
fn wrong_servers_fail_with_what_they_said() {
    let Some(_) = iolab_sys::testing::require_tool("python3", "python3") else {
        return;
    };
    let scratch = iolab_sys::testing::tempdir("lab-url-bad").unwrap();
    let empty = scratch.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let mut server = python_server(&empty);
    let out = scratch.path().join("report");
    let url = format!("mine=http://127.0.0.1:{}/site", server.1);
    let res = lab(&out, &["--url", &url]).output().unwrap();
    iolab_sys::testing::stop_child(&mut server.0);
    let err = String::from_utf8_lossy(&res.stderr);
    assert!(!res.status.success());
    assert!(
        err.contains("answered 404") && err.contains("/site/small.html and /site/big.bin"),
        "{err}"
    );
    assert!(!out.join("results.json").exists());

    let res = lab(
        &out,
        &[
            "--no-efficiency",
            "--target",
            "dies=echo cannot listen on {port} >&2; exit 3",
        ],
    )
    .output()
    .unwrap();
    // Nothing measured: an error, with the report written and the server's words in both.
    let err = String::from_utf8_lossy(&res.stderr);
    assert!(!res.status.success(), "{err}");
    assert!(
        err.contains("nothing measured") && err.contains("cannot listen on"),
        "{err}"
    );
    let r = iolab_lab::validate::load_results(&out).unwrap();
    let t = &r.targets[0];
    assert_eq!(t.status, iolab_lab::results::Status::Failed);
    assert!(
        t.failures[0].contains("exited at start") && t.failures[0].contains("cannot listen on"),
        "{:?}",
        t.failures
    );
}

/// Ctrl-C stops a command target's whole group (sh and the server it started) before the
/// lab exits.
#[test]
fn ctrl_c_stops_a_command_target() {
    let Some(_) = iolab_sys::testing::require_tool("busybox", "busybox") else {
        return;
    };
    let scratch = iolab_sys::testing::tempdir("lab-target-sigint").unwrap();
    let out = scratch.path().join("report");
    // Not `exec`: sh stays as the group's leader, with busybox its child.
    let mut run = lab(
        &out,
        &[
            "--repeat",
            "50",
            "--target",
            "bb=busybox httpd -f -p {addr} -h {root}; echo after",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let needle = out.join("www");
    let needle = needle.to_str().unwrap();
    let t0 = std::time::Instant::now();
    while processes_with(needle).len() < 2 {
        assert!(t0.elapsed().as_secs() < 60, "busybox did not start");
        assert!(run.try_wait().unwrap().is_none(), "the lab ended early");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    iolab_sys::process::signal(run.id(), libc::SIGINT).unwrap();
    assert_eq!(run.wait().unwrap().code(), Some(130));
    let t1 = std::time::Instant::now();
    while !processes_with(needle).is_empty() && t1.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        processes_with(needle).is_empty(),
        "left running: {:?}",
        processes_with(needle)
    );
}

/// A server that answers the lab's readiness check and then, for every other request of
/// the load generator, sends the response head and closes: Figure 1b's table shows those
/// failures as short answers and warns that its CPU per request is not comparable.
const CLOSES_AFTER_THE_HEAD: &str = r#"
import itertools, os, socketserver, sys
port, root = int(sys.argv[1]), sys.argv[2]
files = {p: open(os.path.join(root, p[1:]), "rb").read() for p in ("/small.html", "/big.bin")}
count = itertools.count()
class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        while True:
            line = self.rfile.readline()
            if not line:
                return
            agent = b""
            while True:
                h = self.rfile.readline()
                if h in (b"\r\n", b"\n", b""):
                    break
                if h.lower().startswith(b"user-agent:"):
                    agent = h
            body = files.get(line.split()[1].decode(), b"")
            head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
            if b"iolab-load" in agent and next(count) % 2:
                self.wfile.write(head)
                self.wfile.flush()
                return
            self.wfile.write(head + body)
            self.wfile.flush()
class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
Server(("127.0.0.1", port), Handler).serve_forever()
"#;

#[test]
fn figure_1b_breaks_errors_down_by_kind() {
    let Some(_) = iolab_sys::testing::require_tool("python3", "python3") else {
        return;
    };
    let scratch = iolab_sys::testing::tempdir("lab-errors-by-kind").unwrap();
    let script = scratch.path().join("closes_after_the_head.py");
    std::fs::write(&script, CLOSES_AFTER_THE_HEAD).unwrap();
    let out = scratch.path().join("report");
    let target = format!(
        "halfdead=exec python3 {} {{port}} {{root}}",
        script.display()
    );
    let res = lab(&out, &["--efficiency-rate", "200", "--target", &target])
        .output()
        .unwrap();
    assert!(
        res.status.success(),
        "{}",
        String::from_utf8_lossy(&res.stderr)
    );
    let r = iolab_lab::validate::load_results(&out).unwrap();
    let e = r.efficiency.as_ref().expect("efficiency block");
    assert!(!e.rows.is_empty(), "{:?}", e.failures);
    for row in &e.rows {
        let kinds = row.errors_by_kind();
        assert!(
            kinds.get("short_response").copied().unwrap_or(0) > 0,
            "{} {:?}: {kinds:?}",
            row.server,
            row.mode
        );
    }
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains("<th>short or malformed answers</th>"));
    assert!(
        html.contains("requests failed (") && html.contains(" short or malformed answers)"),
        "no warning for the server that drops requests"
    );
    let left = processes_with(script.to_str().unwrap());
    assert!(left.is_empty(), "left running: {left:?}");
}
