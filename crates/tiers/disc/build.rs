//! Compiles the eBPF programs (bpf/disc.bpf.c) with clang into OUT_DIR/disc.bpf.o, embedded
//! by src/bpf.rs. Needs clang and libbpf's headers (Debian: clang, libbpf-dev; see
//! scripts/deps/disc). Without them the crate still builds, with an empty object: loading
//! the programs then fails with a clear error, and the eBPF tests skip (fail under CI=true).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=bpf/disc.bpf.c");
    println!("cargo::rerun-if-env-changed=CLANG");
    println!("cargo::rerun-if-env-changed=CI");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("disc.bpf.o");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    // The kernel's uapi headers include <asm/types.h>, which Debian keeps per architecture.
    let multiarch = match std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("aarch64") => "aarch64-linux-gnu",
        _ => "x86_64-linux-gnu",
    };
    let result = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-I/usr/include/{multiarch}"))
        .args(["-c", "bpf/disc.bpf.c", "-o"])
        .arg(&out)
        .output();
    let why = match result {
        Ok(o) if o.status.success() => return,
        Ok(o) => format!(
            "{clang} failed on bpf/disc.bpf.c ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("{clang} not found ({e})"),
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{why} (scripts/deps/disc: clang, libbpf-dev)");
    }
    println!(
        "cargo::warning=iolab-disc without eBPF programs: {why}; install clang and libbpf-dev"
    );
    // Built again once clang and the headers are there (a missing file is always stale):
    // an empty object must not outlive `scripts/install-deps`.
    let path = if clang.contains('/') {
        clang.clone()
    } else {
        format!("/usr/bin/{clang}")
    };
    println!("cargo::rerun-if-changed={path}");
    println!("cargo::rerun-if-changed=/usr/include/bpf/bpf_helpers.h");
    std::fs::write(&out, b"").expect("writing an empty object");
}
