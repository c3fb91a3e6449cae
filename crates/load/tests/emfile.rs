//! EMFILE: a process whose open-file limit is smaller than the connections asked for.
//! Its own test binary, because it lowers the limit of the whole process for good.

mod common;

use common::{Mode, TestServer};
use iolab_load::{run, ErrorKind, LoadConfig};

#[test]
fn too_few_file_descriptors_are_counted_as_emfile() {
    let server = TestServer::start(Mode::Slow(100));
    // Lower the hard limit too, so run() cannot raise it back.
    let limit = libc::rlimit {
        rlim_cur: 48,
        rlim_max: 48,
    };
    // SAFETY: setrlimit with a valid struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    let mut c = LoadConfig::for_url(&server.url("/")).unwrap();
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
