//! Static files: every way out of the root, symlinks, special files, and cache freshness.

mod common;

use std::os::unix::fs::symlink;
use std::time::Duration;

use common::*;
use iolab_http::{CacheConfig, Limits, Site};

/// Asserts that a target is refused with `status` and that no byte of the secret leaks.
fn refused(f: &Fixture, target: &str, status: u16) {
    let mut s = f.session();
    s.feed(
        format!("GET {target} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes(),
        |_| {},
    );
    let raw = drain(&mut s);
    assert!(
        !raw.windows(SECRET.len()).any(|w| w == SECRET),
        "{target} leaked the secret"
    );
    let rs = parse_responses(&raw, &[false]);
    assert_eq!(rs[0].status, status, "{target}");
}

#[test]
fn every_traversal_variant_is_refused() {
    let f = Fixture::new();
    // The secret is reachable by a naive join: make sure the test means something.
    assert!(f.www().join("../secret.txt").exists());
    for target in [
        "/../secret.txt",
        "/./../secret.txt",
        "/sub/../../secret.txt",
        "/sub/../index.html",
        "/%2e%2e/secret.txt",
        "/%2E%2E/secret.txt",
        "/.%2e/secret.txt",
        "/%2e./secret.txt",
        "/%2E%2E%2Fsecret.txt",
        "/..%2Fsecret.txt",
        "/%2e%2e%2fsecret.txt",
        "/sub%2F..%2F..%2Fsecret.txt",
        "/..",
        "/../",
        "http://host/../secret.txt",
        "/index.html%00.txt",
        "/%00",
    ] {
        refused(&f, target, 404);
    }
    // Absolute paths are taken relative to the root.
    let abs = f.outside().join("secret.txt");
    refused(&f, &abs.display().to_string(), 404);
    refused(&f, &format!("/{}", abs.display()), 404);
    refused(&f, "//etc/passwd", 404);
    refused(&f, "/etc/passwd", 404);
    // Not even a status that reveals the file exists outside.
    refused(&f, "/../secret.txt/", 404);
    // Backslashes are ordinary file-name bytes on Linux, not separators.
    refused(&f, "/..\\secret.txt", 404);
    refused(&f, "/%5c..%5csecret.txt", 404);
}

#[test]
fn symlinks_pointing_outside_are_refused() {
    let f = Fixture::new();
    let www = f.www();
    symlink(f.outside().join("secret.txt"), www.join("leak.txt")).unwrap();
    symlink(f.outside(), www.join("updir")).unwrap();
    symlink("../secret.txt", www.join("relleak.txt")).unwrap();
    symlink("/etc", www.join("etc")).unwrap();
    for target in [
        "/leak.txt",
        "/updir/secret.txt",
        "/updir/",
        "/updir",
        "/updir/www/index.html/../../secret.txt",
        "/relleak.txt",
        "/etc/passwd",
        "/etc/",
        "/etc",
    ] {
        refused(&f, target, 404);
    }
}

#[test]
fn symlinks_inside_the_root_are_followed() {
    let f = Fixture::new();
    let www = f.www();
    symlink("index.html", www.join("alias.html")).unwrap();
    symlink(www.join("sub"), www.join("subalias")).unwrap();
    let r = get(&f, "GET /alias.html HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!((r.status, &r.body[..]), (200, SMALL));
    let r = get(&f, "GET /subalias/data.json HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!((r.status, &r.body[..]), (200, &b"{}"[..]));
}

#[test]
fn symlink_swapped_after_caching_is_rechecked() {
    let f = Fixture::new();
    let www = f.www();
    std::fs::write(www.join("inner.txt"), b"inner").unwrap();
    symlink("inner.txt", www.join("link.txt")).unwrap();
    assert_eq!(
        get(&f, "GET /link.txt HTTP/1.1\r\nHost: t\r\n\r\n").body,
        b"inner"
    );
    std::fs::remove_file(www.join("link.txt")).unwrap();
    symlink(f.outside().join("secret.txt"), www.join("link.txt")).unwrap();
    refused(&f, "/link.txt", 404);
    // And a cached directory index whose directory becomes a link outside.
    std::fs::create_dir(www.join("d")).unwrap();
    std::fs::write(www.join("d/index.html"), b"d").unwrap();
    assert_eq!(get(&f, "GET /d/ HTTP/1.1\r\nHost: t\r\n\r\n").body, b"d");
    std::fs::create_dir(f.outside().join("o")).unwrap();
    std::fs::write(f.outside().join("o/index.html"), SECRET).unwrap();
    std::fs::remove_dir_all(www.join("d")).unwrap();
    symlink(f.outside().join("o"), www.join("d")).unwrap();
    refused(&f, "/d/", 404);
}

#[test]
fn special_files_are_not_served() {
    let f = Fixture::new();
    let fifo = f.www().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: c is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    // Opening a FIFO for reading would block without O_NONBLOCK: this must return at once.
    refused(&f, "/fifo", 404);
    std::fs::create_dir(f.www().join("dirindex")).unwrap();
    std::fs::create_dir(f.www().join("dirindex/index.html")).unwrap();
    refused(&f, "/dirindex/", 404);
}

#[test]
fn open_errors_map_to_404() {
    let f = Fixture::new();
    // A path component that is a file: ENOTDIR.
    assert_eq!(
        get(&f, "GET /index.html/x HTTP/1.1\r\nHost: t\r\n\r\n").status,
        404
    );
    // A name longer than NAME_MAX: ENAMETOOLONG.
    let long = "a".repeat(300);
    assert_eq!(
        get(&f, &format!("GET /{long} HTTP/1.1\r\nHost: t\r\n\r\n")).status,
        404
    );
    // A symlink loop: ELOOP.
    symlink("loop2", f.www().join("loop1")).unwrap();
    symlink("loop1", f.www().join("loop2")).unwrap();
    assert_eq!(
        get(&f, "GET /loop1 HTTP/1.1\r\nHost: t\r\n\r\n").status,
        404
    );
}

#[test]
fn changed_file_is_served_fresh() {
    let f = Fixture::new();
    let p = f.www().join("page.txt");
    std::fs::write(&p, b"version one").unwrap();
    assert_eq!(
        get(&f, "GET /page.txt HTTP/1.1\r\nHost: t\r\n\r\n").body,
        b"version one"
    );
    assert_eq!(f.site.cache_usage().0, 1);
    // Same length, and the mtime forced back to its old value: ctime still changes.
    let old = std::fs::metadata(&p).unwrap().modified().unwrap();
    std::fs::write(&p, b"version two").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&p)
        .unwrap()
        .set_modified(old)
        .unwrap();
    assert_eq!(
        get(&f, "GET /page.txt HTTP/1.1\r\nHost: t\r\n\r\n").body,
        b"version two"
    );
    // Different length.
    std::fs::write(&p, b"three, longer").unwrap();
    let r = get(&f, "GET /page.txt HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r.body, b"three, longer");
    assert_eq!(r.header("content-length"), Some("13"));
    // Replaced by rename (new inode).
    let tmp = f.www().join("page.tmp");
    std::fs::write(&tmp, b"four").unwrap();
    std::fs::rename(&tmp, &p).unwrap();
    assert_eq!(
        get(&f, "GET /page.txt HTTP/1.1\r\nHost: t\r\n\r\n").body,
        b"four"
    );
    // Deleted: 404, and dropped from the cache.
    std::fs::remove_file(&p).unwrap();
    assert_eq!(
        get(&f, "GET /page.txt HTTP/1.1\r\nHost: t\r\n\r\n").status,
        404
    );
    assert_eq!(
        get(&f, "GET /page.txt HTTP/1.1\r\nHost: t\r\n\r\n").status,
        404
    );
}

#[test]
fn revalidation_interval() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f.txt");
    std::fs::write(&p, b"old").unwrap();
    let site_with = |every: Duration| {
        let cache = CacheConfig {
            revalidate_after: every,
            ..CacheConfig::default()
        };
        Site::with_cache(dir.path(), Limits::default(), cache).unwrap()
    };
    let body = |site: &std::sync::Arc<Site>| {
        let mut s = iolab_http::Session::new(site.clone());
        s.feed(b"GET /f.txt HTTP/1.1\r\nHost: t\r\n\r\n", |_| {});
        let out = drain(&mut s);
        parse_responses(&out, &[false]).remove(0).body
    };
    let hour = site_with(Duration::from_secs(3600));
    let short = site_with(Duration::from_millis(50));
    assert_eq!(body(&hour), b"old");
    assert_eq!(body(&short), b"old");
    std::fs::write(&p, b"new!").unwrap();
    // Within the interval the cached bytes are served without looking at the disk...
    assert_eq!(body(&hour), b"old");
    // ...and once it has passed, the change is seen.
    std::thread::sleep(Duration::from_millis(120));
    assert_eq!(body(&short), b"new!");
}

#[test]
fn cached_bodies_are_shared() {
    let f = Fixture::new();
    let take_body = |s: &mut iolab_http::Session| {
        s.feed(b"GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n", |_| {});
        let body = s.pending()[1].clone();
        drain(s);
        body
    };
    let a = take_body(&mut f.session());
    let b = take_body(&mut f.session());
    assert_eq!(a.len(), 700 * 1024);
    assert_eq!(
        a.as_ptr(),
        b.as_ptr(),
        "one copy of the file for all connections"
    );
    let (files, bytes) = f.site.cache_usage();
    assert_eq!((files, bytes), (1, 700 * 1024));
}

#[test]
fn large_files_bypass_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big"), vec![7u8; 5000]).unwrap();
    std::fs::write(dir.path().join("small"), vec![1u8; 100]).unwrap();
    let site = Site::with_cache(
        dir.path(),
        Limits::default(),
        CacheConfig {
            max_cached_file: 1000,
            capacity: 150,
            revalidate_after: Duration::ZERO,
        },
    )
    .unwrap();
    for _ in 0..2 {
        let mut s = iolab_http::Session::new(site.clone());
        s.feed(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n", |st| {
            assert_eq!(st, 200)
        });
        assert_eq!(drain(&mut s).len() - 5000, s_head_len(&site, "/big"));
        assert_eq!(site.cache_usage(), (0, 0));
    }
    let mut s = iolab_http::Session::new(site.clone());
    s.feed(b"GET /small HTTP/1.1\r\nHost: t\r\n\r\n", |st| {
        assert_eq!(st, 200)
    });
    assert_eq!(site.cache_usage(), (1, 100));
    // A modified large file is of course read fresh too.
    std::fs::write(dir.path().join("big"), vec![8u8; 6000]).unwrap();
    let mut s = iolab_http::Session::new(site.clone());
    s.feed(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n", |_| {});
    let out = drain(&mut s);
    assert!(out.ends_with(&[8u8; 6000]));
}

fn s_head_len(site: &std::sync::Arc<Site>, path: &str) -> usize {
    let mut s = iolab_http::Session::new(site.clone());
    s.feed(
        format!("HEAD {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes(),
        |_| {},
    );
    drain(&mut s).len()
}

#[test]
fn cache_capacity_is_respected() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..10 {
        std::fs::write(dir.path().join(format!("f{i}")), vec![b'x'; 100]).unwrap();
    }
    let site = Site::with_cache(
        dir.path(),
        Limits::default(),
        CacheConfig {
            max_cached_file: 1000,
            capacity: 350,
            ..CacheConfig::default()
        },
    )
    .unwrap();
    for i in 0..10 {
        let mut s = iolab_http::Session::new(site.clone());
        s.feed(
            format!("GET /f{i} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes(),
            |st| assert_eq!(st, 200),
        );
        let (n, bytes) = site.cache_usage();
        assert!(bytes <= 350 && bytes == n as u64 * 100, "{n} {bytes}");
    }
}

#[test]
fn site_errors_name_the_path() {
    let err = Site::new("/definitely/not/here", Limits::default())
        .err()
        .unwrap();
    assert!(err.to_string().contains("/definitely/not/here"), "{err}");
    let f = tempfile::NamedTempFile::new().unwrap();
    let err = Site::new(f.path(), Limits::default()).err().unwrap();
    assert!(err.to_string().contains("not a directory"), "{err}");
}

#[test]
fn root_given_through_a_symlink_works() {
    let f = Fixture::new();
    let link = f.outside().join("wwwlink");
    symlink(f.www(), &link).unwrap();
    let site = Site::new(&link, Limits::default()).unwrap();
    assert_eq!(site.root(), std::fs::canonicalize(f.www()).unwrap());
    let mut s = iolab_http::Session::new(site);
    let mut st = Vec::new();
    s.feed(b"GET /index.html HTTP/1.1\r\nHost: t\r\n\r\n", |x| {
        st.push(x)
    });
    assert_eq!(st, vec![200]);
}

/// Runs a `FileReads::Caller` session to the end of its output, doing each file read it asks
/// for with `read` (offset, len) and writing everything; returns the bytes and the reads.
fn drain_caller(
    s: &mut iolab_http::Session,
    mut read: impl FnMut(&iolab_http::FileRead) -> std::io::Result<Vec<u8>>,
) -> (Vec<u8>, Vec<(u64, usize)>) {
    let (mut out, mut reads) = (Vec::new(), Vec::new());
    loop {
        if let Some(job) = s.file_read() {
            assert!(s.file_read().is_none(), "one read at a time");
            reads.push((job.offset(), job.len()));
            let r = read(&job);
            s.file_read_done(r, |_| {});
        } else if let Some(chunk) = s.pending().front() {
            let n = chunk.len();
            out.extend_from_slice(chunk);
            s.advance(n);
            s.resume(|_| {});
        } else {
            return (out, reads);
        }
    }
}

#[test]
fn caller_file_reads_serve_the_same_bytes_and_fill_the_cache() {
    use iolab_http::{FileReads, Session};
    let dir = tempfile::tempdir().unwrap();
    let small: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(dir.path().join("small"), &small).unwrap();
    std::fs::write(dir.path().join("big"), &big).unwrap();
    let cache = CacheConfig {
        max_cached_file: 64 * 1024,
        revalidate_after: Duration::from_secs(3600),
        ..CacheConfig::default()
    };
    let site = Site::with_cache(dir.path(), Limits::default(), cache).unwrap();
    let request = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n");
    // A miss: nothing read by the session itself; one read of the whole file, then cached.
    let mut s = Session::with_file_reads(site.clone(), FileReads::Caller);
    s.feed(request("/small").as_bytes(), |st| assert_eq!(st, 200));
    let (out, reads) = drain_caller(&mut s, |j| j.read_blocking());
    assert!(out.ends_with(&small), "miss served exactly");
    assert_eq!(reads, [(0, 3000)]);
    assert_eq!(site.cache_usage(), (1, 3000));
    // A hit: no read at all.
    s.feed(request("/small").as_bytes(), |_| {});
    let (out, reads) = drain_caller(&mut s, |j| j.read_blocking());
    assert!(out.ends_with(&small) && reads.is_empty(), "{reads:?}");
    // A file too large to cache: STREAM_CHUNK reads, answered in pieces (short reads are
    // fine), pipelined requests held until it is done; same bytes as a Blocking session.
    let mut s = Session::with_file_reads(site.clone(), FileReads::Caller);
    s.feed((request("/big") + &request("/small")).as_bytes(), |_| {});
    let (out, reads) = drain_caller(&mut s, |j| {
        let mut data = j.read_blocking()?;
        data.truncate(50_000);
        Ok(data)
    });
    let mut blocking = Session::new(site.clone());
    blocking.feed((request("/big") + &request("/small")).as_bytes(), |_| {});
    assert!(
        out == drain(&mut blocking),
        "caller and blocking reads differ"
    );
    assert_eq!(reads.len(), 4, "{reads:?}");
    assert!(reads
        .iter()
        .all(|&(_, len)| len <= iolab_http::STREAM_CHUNK));
    assert_eq!(
        site.cache_usage(),
        (1, 3000),
        "the streamed file is not cached"
    );
    // A failed read ends the connection after what was queued.
    let mut s = Session::with_file_reads(site.clone(), FileReads::Caller);
    s.feed(request("/big").as_bytes(), |_| {});
    let (_, reads) = drain_caller(&mut s, |_| Err(std::io::Error::other("disk gone")));
    assert_eq!(reads.len(), 1);
    assert!(s.should_close());
    // A Blocking session never asks.
    let mut s = Session::new(site.clone());
    s.feed(request("/big").as_bytes(), |_| {});
    assert!(s.file_read().is_none());
}
