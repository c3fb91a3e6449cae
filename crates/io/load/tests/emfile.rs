//! EMFILE: a process whose open-file limit is smaller than the connections asked for.
//! Its own test binary, because it lowers the limit of the whole process for good.
//!
//! The server runs in a child process (this same test binary, re-run in server mode): with
//! the server in-process, its accepted sockets would count against the lowered limit too,
//! and the server, not the client, would hit EMFILE.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

use common::{Mode, TestServer};
use iolab_load::{run, ErrorKind, LoadConfig};

const SERVER_ENV: &str = "IOLAB_LOAD_EMFILE_SERVER";

/// Not a test on its own: the server process of the test below (run with --ignored and
/// IOLAB_LOAD_EMFILE_SERVER set) serves slowly, prints its URL, and stays up until stdin
/// closes.
#[test]
#[ignore = "the server process of too_few_file_descriptors_are_counted_as_emfile"]
fn emfile_server_helper() {
    assert!(
        std::env::var_os(SERVER_ENV).is_some(),
        "only run as the server of too_few_file_descriptors_are_counted_as_emfile"
    );
    let server = TestServer::start(Mode::Slow(100));
    println!("URL {}", server.url("/"));
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn too_few_file_descriptors_are_counted_as_emfile() {
    let mut child = Child(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "emfile_server_helper",
                "--ignored",
                "--nocapture",
            ])
            .env(SERVER_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the server process"),
    );
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("server process ended before printing its URL")
            .unwrap();
        if let Some(url) = line.strip_prefix("URL ") {
            break url.to_string();
        }
    };
    // Lower the hard limit too, so run() cannot raise it back.
    let limit = libc::rlimit {
        rlim_cur: 48,
        rlim_max: 48,
    };
    // SAFETY: setrlimit with a valid struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    let mut c = LoadConfig::for_url(&url).unwrap();
    c.connections = 100;
    c.requests = Some(100);
    c.threads = 1;
    let r = run(&c).unwrap();
    assert_eq!(r.requests, 100);
    assert!(r.errors_of(ErrorKind::Emfile) > 0, "{:?}", r.errors);
    assert!(
        r.ok > 0,
        "some connections fit under the limit: {:?}",
        r.errors
    );
    assert_eq!(r.ok + r.errors_of(ErrorKind::Emfile), 100, "{:?}", r.errors);
    assert!(
        r.warnings.iter().any(|w| w.contains("open-file limit")),
        "{:?}",
        r.warnings
    );
}
