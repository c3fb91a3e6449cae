//! Libraries log through `tracing`, never `eprintln!` (issue 9 §5): the `iolab` binary
//! installs the subscriber (`-v`, `RUST_LOG`; progress lines with target `progress` are
//! always shown). This test reads every library source file and fails on a print macro
//! outside the places allowed to print:
//! - binaries (`main.rs`, `src/bin/`; the command line is the binary's `src/cli/`, outside
//!   `crates/`), `#[cfg(test)]` items;
//! - test-support modules (`testing.rs`, `testutil.rs`): their skip lines must reach the test
//!   runner's stderr, where no subscriber is installed and captured output is hidden;
//! - `println!` (stdout, not logging) only in the files of [`STDOUT_RESULTS`], whose job is
//!   to print a command's result.
//!
//! It takes a few milliseconds: no build of anything, only reading files.

use std::path::{Path, PathBuf};

/// Files that print a command's result on stdout (not diagnostics), with why.
const STDOUT_RESULTS: &[(&str, &str)] = &[
    (
        "crates/apps/micro/src/table.rs",
        "Table::print: the micro tables",
    ),
    (
        "crates/tiers/odb/src/agent.rs",
        "run_foreground: the agent's address, read by its launcher",
    ),
    (
        "crates/apps/seeder/src/swarm.rs",
        "the leecher process's JSON result, read by `seed bench`",
    ),
    (
        "crates/apps/seeder/src/bench/mod.rs",
        "`seed bench`'s result table",
    ),
    (
        "crates/apps/seeder/src/bench/versus.rs",
        "`seed bench`'s table against libtorrent",
    ),
];

/// Print macros in `src` outside `#[cfg(test)]` items and comments: (line number, macro).
fn prints(src: &str) -> Vec<(usize, &'static str)> {
    const MACROS: [&str; 5] = ["eprintln!", "eprint!", "println!", "print!", "dbg!"];
    let mut found = Vec::new();
    // Skipping a #[cfg(test)] item: armed after the attribute, then the brace depth inside it.
    let mut armed = false;
    let mut depth: Option<i64> = None;
    for (i, line) in src.lines().enumerate() {
        let code = strip_strings(line);
        let code = code.split("//").next().unwrap_or("");
        let trimmed = code.trim();
        if let Some(d) = depth.as_mut() {
            *d += code.matches('{').count() as i64 - code.matches('}').count() as i64;
            if *d <= 0 {
                depth = None;
            }
            continue;
        }
        if trimmed.starts_with("#[cfg(test)]") {
            armed = true;
            continue;
        }
        if armed && !trimmed.is_empty() && !trimmed.starts_with("#[") {
            armed = false;
            let d = code.matches('{').count() as i64 - code.matches('}').count() as i64;
            if d > 0 {
                depth = Some(d);
            }
            continue; // the item's first line (`mod tests {`, `fn x() -> T;`...)
        }
        for m in MACROS {
            let hit = code.match_indices(m).any(|(at, _)| {
                let before = code[..at].chars().next_back();
                !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
            });
            if hit {
                found.push((i + 1, m));
            }
        }
    }
    found
}

/// `line` with the contents of its string and char literals blanked (so braces and `//`
/// inside them do not count).
fn strip_strings(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_str = false;
    let mut escaped = false;
    for c in line.chars() {
        if in_str {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_str = false;
                out.push('"');
            }
            continue;
        }
        if c == '"' {
            in_str = true;
        }
        out.push(c);
    }
    out.replace("'{'", "' '").replace("'}'", "' '")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Whether `rel` (relative to the workspace root) is allowed to print at all: a program's
/// own code (a crate's `src/bin/`, `main.rs`) and test helpers. The command line, which prints
/// for people, is the binary's `src/cli/`, outside `crates/`; a library's file named like a CLI
/// is library code.
fn exempt(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    rel.contains("/src/bin/") || matches!(name, "main.rs" | "testing.rs" | "testutil.rs")
}

#[test]
fn library_code_does_not_print() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    // crates/<layer>/<crate>/src
    for layer in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        for krate in std::fs::read_dir(layer.path()).unwrap().flatten() {
            rust_files(&krate.path().join("src"), &mut files);
        }
    }
    assert!(files.len() > 50, "found only {} source files", files.len());
    let mut bad = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        if exempt(&rel) {
            continue;
        }
        let src = std::fs::read_to_string(f).unwrap();
        let stdout_ok = STDOUT_RESULTS.iter().any(|(p, _)| *p == rel);
        for (line, m) in prints(&src) {
            if !(stdout_ok && (m == "println!" || m == "print!")) {
                bad.push(format!("{rel}:{line}: {m}"));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "print macros in library code (log through tracing: tracing::warn!, or \
         tracing::info!(target: \"progress\", ...) for progress the user must see; results \
         go through the cli module):\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_allowed_stdout_files_exist_and_print() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (p, why) in STDOUT_RESULTS {
        let src = std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert!(
            prints(&src).iter().any(|(_, m)| *m == "println!"),
            "{p} ({why}) no longer prints: remove it from STDOUT_RESULTS"
        );
    }
}

#[test]
fn the_scanner_finds_prints_and_skips_tests_comments_and_strings() {
    let src = r#"
fn a() {
    eprintln!("x {}", 1);
    // eprintln!("a comment");
    let s = "println!(\"in a string\") {";
    std::eprint!("y");
}
#[cfg(test)]
mod tests {
    #[test]
    fn t() {
        eprintln!("test output {}", '{');
        if true { println!("nested"); }
    }
}
fn b() { dbg!(1); }
#[cfg(test)]
fn helper() -> u8 {
    println!("test-only helper");
    1
}
fn c() { println!("after"); }
"#;
    assert_eq!(
        prints(src),
        vec![
            (3, "eprintln!"),
            (6, "eprint!"),
            (16, "dbg!"),
            (22, "println!")
        ]
    );
    assert!(!exempt("crates/apps/lab/src/cli.rs"));
    assert!(!exempt("crates/sim/disksim/src/recordcli.rs"));
    assert!(exempt("crates/tiers/odb/src/bin/odb-agent.rs"));
    assert!(!exempt("crates/apps/lab/src/lab.rs"));
}
