//! Reader for DiskSim 4.0 parameter files (`*.parv`, `*.diskspecs`, `*.model`, `*.seek`).
//!
//! The syntax (DiskSim's libparam): `TYPE NAME { key = value, ... }` blocks, where a key is
//! free text up to `=` ("Segment size (in blks)"), a value is a number, a word, a list
//! `[ v, v ]`, a nested block `TYPE { ... }`, or `source FILE` (the first block of another
//! file). At top level: blocks, `source FILE`, `instantiate [ names ] as TYPE` and
//! `topology ...` (skipped). `#` starts a comment. This module only parses; `spec.rs` turns
//! the blocks into our disk model and says which parameter is missing or out of range.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Num(f64),
    Word(String),
    List(Vec<Value>),
    Block(Block),
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Block {
    /// Block type, e.g. `disksim_disk`, `dm_layout_g1_zone`.
    pub ty: String,
    /// Instance name for top-level blocks (`SEAGATE_ST32171W`).
    pub name: String,
    pub entries: Vec<(String, Value)>,
    /// File the block came from (for error messages).
    pub file: PathBuf,
    /// The line of each entry in `file` (parallel to `entries`), and of the block's start.
    pub lines: Vec<usize>,
    pub line: usize,
}

impl Block {
    pub fn get(&self, key: &str) -> Option<&Value> {
        let k = norm(key);
        self.entries
            .iter()
            .find(|(n, _)| norm(n) == k)
            .map(|(_, v)| v)
    }
    /// The line of `key` in the block's file (the block's own line when it is missing).
    pub fn line_of(&self, key: &str) -> usize {
        let k = norm(key);
        self.entries
            .iter()
            .position(|(n, _)| norm(n) == k)
            .and_then(|i| self.lines.get(i).copied())
            .unwrap_or(self.line)
    }
    /// `FILE:LINE: block TYPE NAME: parameter 'KEY'`, for errors about one parameter.
    pub fn ctx(&self, key: &str) -> String {
        format!(
            "{}:{}: block {} {}: parameter '{}'",
            self.file.display(),
            self.line_of(key),
            self.ty,
            self.name,
            key
        )
    }
    pub fn num(&self, key: &str) -> Result<f64> {
        match self.get(key) {
            Some(Value::Num(n)) => Ok(*n),
            Some(v) => bail!("{}: expected a number, found {:?}", self.ctx(key), v),
            None => bail!("{}: missing", self.ctx(key)),
        }
    }
    pub fn num_or(&self, key: &str, default: f64) -> Result<f64> {
        match self.get(key) {
            None => Ok(default),
            Some(_) => self.num(key),
        }
    }
    pub fn word(&self, key: &str) -> Result<&str> {
        match self.get(key) {
            Some(Value::Word(w)) => Ok(w),
            Some(v) => bail!("{}: expected a word, found {:?}", self.ctx(key), v),
            None => bail!("{}: missing", self.ctx(key)),
        }
    }
    pub fn block(&self, key: &str) -> Result<&Block> {
        match self.get(key) {
            Some(Value::Block(b)) => Ok(b),
            Some(v) => bail!("{}: expected a block, found {:?}", self.ctx(key), v),
            None => bail!("{}: missing", self.ctx(key)),
        }
    }
    pub fn list(&self, key: &str) -> Result<&[Value]> {
        match self.get(key) {
            Some(Value::List(l)) => Ok(l),
            Some(v) => bail!("{}: expected a list, found {:?}", self.ctx(key), v),
            None => bail!("{}: missing", self.ctx(key)),
        }
    }
    /// A list of numbers.
    pub fn nums(&self, key: &str) -> Result<Vec<f64>> {
        self.list(key)?
            .iter()
            .map(|v| match v {
                Value::Num(n) => Ok(*n),
                other => bail!("{}: expected numbers, found {:?}", self.ctx(key), other),
            })
            .collect()
    }
}

/// Keys compare case-insensitively with runs of spaces folded.
fn norm(k: &str) -> String {
    k.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_ascii_lowercase()
}

/// A parsed file set: every top-level block, in order, with `source`d files included.
#[derive(Debug, Default)]
pub struct ParamFile {
    pub blocks: Vec<Block>,
    /// `instantiate [ a, b ] as TYPE`: (instance names, block name).
    pub instances: Vec<(Vec<String>, String)>,
}

impl ParamFile {
    pub fn find(&self, ty: &str) -> impl Iterator<Item = &Block> {
        let ty = ty.to_string();
        self.blocks.iter().filter(move |b| b.ty == ty)
    }
    pub fn by_name(&self, name: &str) -> Option<&Block> {
        self.blocks.iter().find(|b| b.name == name)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Open,   // {
    Close,  // }
    LBrack, // [
    RBrack, // ]
    Comma,
    Eq,
    Word(String),
}

fn tokenize(text: &str) -> Vec<(Tok, usize)> {
    let mut out = Vec::new();
    for (lineno, line) in text.lines().enumerate() {
        let line = match line.find('#') {
            Some(i) => &line[..i],
            None => line,
        };
        let mut word = String::new();
        let flush = |w: &mut String, out: &mut Vec<(Tok, usize)>| {
            if !w.is_empty() {
                out.push((Tok::Word(std::mem::take(w)), lineno + 1));
            }
        };
        for c in line.chars() {
            let t = match c {
                '{' => Some(Tok::Open),
                '}' => Some(Tok::Close),
                '[' => Some(Tok::LBrack),
                ']' => Some(Tok::RBrack),
                ',' => Some(Tok::Comma),
                '=' => Some(Tok::Eq),
                c if c.is_whitespace() => {
                    flush(&mut word, &mut out);
                    None
                }
                c => {
                    word.push(c);
                    None
                }
            };
            if let Some(t) = t {
                flush(&mut word, &mut out);
                out.push((t, lineno + 1));
            }
        }
        flush(&mut word, &mut out);
    }
    out
}

/// Limits on what a parameter file can make the parser do.
const MAX_DEPTH: usize = 32;
const MAX_INCLUDES: usize = 64;

struct Parser<'a> {
    toks: Vec<(Tok, usize)>,
    pos: usize,
    file: PathBuf,
    dir: PathBuf,
    loader: &'a mut Loader,
    depth: usize,
}

struct Loader {
    seen: HashSet<PathBuf>,
    includes: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|(t, _)| t)
    }
    fn line(&self) -> usize {
        self.toks
            .get(self.pos)
            .or(self.toks.last())
            .map(|(_, l)| *l)
            .unwrap_or(0)
    }
    fn err<T>(&self, msg: &str) -> Result<T> {
        bail!("{}:{}: {}", self.file.display(), self.line(), msg)
    }
    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.pos).map(|(t, _)| t.clone());
        self.pos += 1;
        t
    }
    fn words_until(&mut self, stop: &[Tok]) -> Vec<String> {
        let mut ws = Vec::new();
        while let Some(Tok::Word(w)) = self.peek() {
            ws.push(w.clone());
            self.pos += 1;
        }
        let _ = stop;
        ws
    }

    /// Block body after `{`, up to and including `}`.
    fn body(&mut self, ty: String, name: String) -> Result<Block> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return self.err("nesting too deep");
        }
        let mut b = Block {
            ty,
            name,
            entries: Vec::new(),
            file: self.file.clone(),
            lines: Vec::new(),
            line: self.line(),
        };
        loop {
            match self.peek() {
                Some(Tok::Close) => {
                    self.pos += 1;
                    break;
                }
                Some(Tok::Comma) => {
                    self.pos += 1;
                }
                Some(Tok::Word(_)) => {
                    let line = self.line();
                    let key = self.words_until(&[Tok::Eq]).join(" ");
                    if self.next() != Some(Tok::Eq) {
                        return self.err(&format!("expected '=' after '{key}'"));
                    }
                    let v = self.value()?;
                    b.entries.push((key, v));
                    b.lines.push(line);
                }
                None => return self.err(&format!("unterminated block {} {}", b.ty, b.name)),
                Some(t) => return self.err(&format!("unexpected {t:?} in block")),
            }
        }
        self.depth -= 1;
        Ok(b)
    }

    fn value(&mut self) -> Result<Value> {
        match self.peek() {
            Some(Tok::LBrack) => {
                self.pos += 1;
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return self.err("nesting too deep");
                }
                let mut items = Vec::new();
                loop {
                    match self.peek() {
                        Some(Tok::RBrack) => {
                            self.pos += 1;
                            break;
                        }
                        Some(Tok::Comma) => self.pos += 1,
                        None => return self.err("unterminated list"),
                        _ => items.push(self.value()?),
                    }
                }
                self.depth -= 1;
                Ok(Value::List(items))
            }
            Some(Tok::Word(_)) => {
                let ws = self.words_until(&[]);
                if self.peek() == Some(&Tok::Open) {
                    self.pos += 1;
                    let ty = ws.first().cloned().unwrap_or_default();
                    let name = ws.get(1).cloned().unwrap_or_default();
                    return Ok(Value::Block(self.body(ty, name)?));
                }
                if ws.len() == 2 && ws[0] == "source" {
                    let pf = self.include(&ws[1])?;
                    return match pf.blocks.into_iter().next() {
                        Some(b) => Ok(Value::Block(b)),
                        None => self.err(&format!("'{}' holds no block", ws[1])),
                    };
                }
                let w = ws.join(" ");
                match w.parse::<f64>() {
                    Ok(n) if n.is_finite() => Ok(Value::Num(n)),
                    _ => Ok(Value::Word(w)),
                }
            }
            Some(t) => {
                let t = t.clone();
                self.err(&format!("expected a value, found {t:?}"))
            }
            None => self.err("expected a value, found the end of the file"),
        }
    }

    fn include(&mut self, name: &str) -> Result<ParamFile> {
        let path = resolve(&self.dir, name)?;
        self.loader.includes += 1;
        if self.loader.includes > MAX_INCLUDES {
            return self.err("too many 'source' includes");
        }
        if !self.loader.seen.insert(path.clone()) {
            return self.err(&format!("'{}' includes itself", path.display()));
        }
        let r = parse_file_with(&path, self.loader);
        self.loader.seen.remove(&path);
        r
    }

    fn top(&mut self, out: &mut ParamFile) -> Result<()> {
        while let Some(t) = self.peek().cloned() {
            match t {
                Tok::Word(w) if w == "source" => {
                    self.pos += 1;
                    let Some(Tok::Word(f)) = self.next() else {
                        return self.err("expected a file name after 'source'");
                    };
                    let inc = self.include(&f)?;
                    out.blocks.extend(inc.blocks);
                    out.instances.extend(inc.instances);
                }
                Tok::Word(w) if w == "instantiate" => {
                    self.pos += 1;
                    if self.next() != Some(Tok::LBrack) {
                        return self.err("expected '[' after 'instantiate'");
                    }
                    let mut names = Vec::new();
                    loop {
                        match self.next() {
                            Some(Tok::Word(n)) => names.push(n),
                            Some(Tok::Comma) => {}
                            Some(Tok::RBrack) => break,
                            _ => return self.err("bad instantiate list"),
                        }
                    }
                    match (self.next(), self.next()) {
                        (Some(Tok::Word(a)), Some(Tok::Word(ty))) if a == "as" => {
                            out.instances.push((names, ty))
                        }
                        _ => return self.err("expected 'as NAME' after instantiate list"),
                    }
                }
                Tok::Word(w) if w == "topology" => {
                    // topology TYPE NAME [ nested ... ]: not needed by the disk model; skip it.
                    self.pos += 1;
                    while !matches!(self.peek(), Some(Tok::LBrack) | None) {
                        self.pos += 1;
                    }
                    let mut depth = 0usize;
                    while let Some(t) = self.next() {
                        match t {
                            Tok::LBrack => depth += 1,
                            Tok::RBrack => {
                                depth -= 1;
                                if depth == 0 {
                                    break;
                                }
                            }
                            _ => {}
                        }
                    }
                }
                Tok::Word(_) => {
                    let ws = self.words_until(&[]);
                    if self.next() != Some(Tok::Open) {
                        return self.err(&format!("expected '{{' after '{}'", ws.join(" ")));
                    }
                    let ty = ws.first().cloned().unwrap_or_default();
                    let name = ws.get(1).cloned().unwrap_or_default();
                    let b = self.body(ty, name)?;
                    out.blocks.push(b);
                }
                other => return self.err(&format!("unexpected {other:?} at top level")),
            }
        }
        Ok(())
    }
}

/// Files named in parameter files are looked up next to the including file, and must stay
/// inside that directory tree (a parameter file cannot make us read /etc/shadow).
fn resolve(dir: &Path, name: &str) -> Result<PathBuf> {
    let p = Path::new(name);
    if p.is_absolute()
        || p.components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        bail!("'{name}': included files must be relative names inside the parameter directory");
    }
    Ok(dir.join(p))
}

fn parse_file_with(path: &Path, loader: &mut Loader) -> Result<ParamFile> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_text(&text, path, loader)
}

fn parse_text(text: &str, path: &Path, loader: &mut Loader) -> Result<ParamFile> {
    let dir = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let mut p = Parser {
        toks: tokenize(text),
        pos: 0,
        file: path.to_path_buf(),
        dir,
        loader,
        depth: 0,
    };
    let mut out = ParamFile::default();
    p.top(&mut out)?;
    Ok(out)
}

/// Parses a DiskSim parameter file and everything it `source`s.
pub fn parse_file(path: &Path) -> Result<ParamFile> {
    let mut loader = Loader {
        seen: HashSet::new(),
        includes: 0,
    };
    loader.seen.insert(path.to_path_buf());
    parse_file_with(path, &mut loader)
}

/// Parses text with no includes allowed to leave `dir` (for tests and fuzzing).
pub fn parse_str(text: &str, pretend_path: &Path) -> Result<ParamFile> {
    let mut loader = Loader {
        seen: HashSet::new(),
        includes: 0,
    };
    parse_text(text, pretend_path, &mut loader)
}

/// Reads a DiskSim extracted seek curve: "Seek distances measured: N" then `dist, ms` lines.
pub fn parse_seek_file(path: &Path) -> Result<Vec<(u32, f64)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_seek_text(&text, path)
}

pub fn parse_seek_text(text: &str, path: &Path) -> Result<Vec<(u32, f64)>> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (_, head) = lines
        .next()
        .with_context(|| format!("{}: empty seek file", path.display()))?;
    let n: usize = head
        .split(':')
        .nth(1)
        .and_then(|s| s.trim().parse().ok())
        .with_context(|| {
            format!(
                "{}:1: expected 'Seek distances measured: N'",
                path.display()
            )
        })?;
    let mut out = Vec::with_capacity(n.min(100_000));
    for (i, line) in lines {
        let mut it = line
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty());
        let (Some(d), Some(t)) = (it.next(), it.next()) else {
            bail!("{}:{}: expected 'distance, time_ms'", path.display(), i + 1);
        };
        let d: u32 = d
            .parse()
            .with_context(|| format!("{}:{}: bad distance '{d}'", path.display(), i + 1))?;
        let t: f64 = t
            .parse()
            .with_context(|| format!("{}:{}: bad time '{t}'", path.display(), i + 1))?;
        if !(0.0..1000.0).contains(&t) {
            bail!("{}:{}: implausible seek time {t} ms", path.display(), i + 1);
        }
        if let Some(&(pd, _)) = out.last() {
            if d <= pd {
                bail!(
                    "{}:{}: distances must increase ({d} after {pd})",
                    path.display(),
                    i + 1
                );
            }
        }
        out.push((d, t));
    }
    if out.len() != n {
        bail!(
            "{}: header says {n} distances, found {}",
            path.display(),
            out.len()
        );
    }
    if out.is_empty() {
        bail!("{}: no seek distances", path.display());
    }
    let glitches = drop_seek_glitches(&mut out);
    if !glitches.is_empty() {
        let list: Vec<String> = glitches
            .iter()
            .map(|g| format!("{} cyl: {} ms between {} and {}", g.0, g.1, g.2, g.3))
            .collect();
        tracing::warn!(
            "{}: seek times far from both neighbours dropped as measurement glitches \
             (interpolated instead): {}",
            path.display(),
            list.join("; ")
        );
    }
    Ok(out)
}

/// How far (as a fraction) a measured seek time may lie below both of its neighbours'
/// times, or above both, before it counts as a glitch of the measurement.
pub const SEEK_GLITCH: f64 = 0.25;

/// Drops measured points that lie more than [`SEEK_GLITCH`] below both neighbours, then,
/// on what is left, those more than that above both: a seek curve rises smoothly with
/// distance, and an extraction tool's table can hold an isolated bad measurement (the IBM
/// 18ES's `.seek` gives 1.02 ms at 10 cylinders between 1.75 and 1.82, and 1.03 ms at
/// 3,400 between 7.37 and 7.64: a 3,300-3,500 cylinder seek then took ~2 ms in the model,
/// 7.5 on the drive). Dips go first, so that the point before a dip does not look like a
/// spike. The curve interpolates over the gaps; ordinary noise (a few percent either way)
/// stays. Returns the dropped points as (distance, ms, previous ms, next ms).
pub fn drop_seek_glitches(t: &mut Vec<(u32, f64)>) -> Vec<(u32, f64, f64, f64)> {
    let mut dropped = Vec::new();
    for dips in [true, false] {
        let mut keep = vec![true; t.len()];
        for i in 1..t.len().saturating_sub(1) {
            let (prev, here, next) = (t[i - 1].1, t[i].1, t[i + 1].1);
            let glitch = if dips {
                here < (1.0 - SEEK_GLITCH) * prev.min(next)
            } else {
                here > (1.0 + SEEK_GLITCH) * prev.max(next)
            };
            if glitch {
                keep[i] = false;
                dropped.push((t[i].0, here, prev, next));
            }
        }
        let mut k = keep.iter();
        t.retain(|_| *k.next().unwrap_or(&true));
    }
    dropped.sort_by_key(|g| g.0);
    dropped
}

/// Expands DiskSim's `[ disk0 .. disk17 ]` name lists.
pub fn expand_names(words: &[String]) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < words.len() {
        if words[i] == ".." {
            let (Some(a), Some(b)) = (out.pop(), words.get(i + 1)) else {
                bail!("'..' needs a name on each side");
            };
            let split = |s: &str| {
                let d = s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
                (s[..d].to_string(), s[d..].parse::<u64>().ok())
            };
            let ((pa, Some(na)), (pb, Some(nb))) = (split(&a), split(b)) else {
                bail!("'{a} .. {b}': both names must end in a number");
            };
            if pa != pb || nb < na || nb - na > 4096 {
                bail!("'{a} .. {b}' is not a range of names");
            }
            out.extend((na..=nb).map(|n| format!("{pa}{n}")));
            i += 2;
        } else {
            out.push(words[i].clone());
            i += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_blocks_lists_and_free_text_keys() {
        let t = "disksim_disk D { Segment size (in blks) = 281, Scheduler = disksim_ioqueue { Scheduling policy = 1 },\n # comment\n Zones = [ z { a = 1 }, z { a = 2 } ], Seek type = extracted }";
        let pf = parse_str(t, Path::new("x.diskspecs")).unwrap();
        let b = &pf.blocks[0];
        assert_eq!((b.ty.as_str(), b.name.as_str()), ("disksim_disk", "D"));
        assert_eq!(b.num("segment size  (in blks)").unwrap(), 281.0);
        assert_eq!(
            b.block("Scheduler")
                .unwrap()
                .num("Scheduling policy")
                .unwrap(),
            1.0
        );
        assert_eq!(b.list("Zones").unwrap().len(), 2);
        assert_eq!(b.word("Seek type").unwrap(), "extracted");
        assert!(b
            .num("missing")
            .unwrap_err()
            .to_string()
            .contains("missing"));
    }

    #[test]
    fn bad_syntax_names_the_line() {
        let e = parse_str("a B {\n x = \n", Path::new("f.parv"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("f.parv:"), "{e}");
        let e = parse_str("a B { x = 1 ", Path::new("f.parv"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unterminated"), "{e}");
    }

    #[test]
    fn includes_cannot_escape() {
        let e = parse_str("source ../../etc/passwd", Path::new("/tmp/x.parv"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("relative names"), "{e}");
    }

    #[test]
    fn seek_file() {
        let s = parse_seek_text(
            "Seek distances measured: 2\n1,\t1.5\n10,\t3.0\n",
            Path::new("s"),
        )
        .unwrap();
        assert_eq!(s, vec![(1, 1.5), (10, 3.0)]);
        assert!(parse_seek_text("Seek distances measured: 3\n1, 1\n", Path::new("s")).is_err());
    }

    #[test]
    fn isolated_seek_glitches_are_dropped_and_noise_is_kept() {
        // 10 cylinders at 1.02 between 1.75 and 1.82 (the IBM 18ES's table) and a spike up
        // to 9 between 4 and 4.2 go; 45 cylinders at 2.366 between 2.411 and 2.514 (a few
        // percent low) stays, and so do both ends.
        let mut t = vec![
            (1, 1.06),
            (9, 1.749),
            (10, 1.02),
            (12, 1.823),
            (40, 2.411),
            (45, 2.366),
            (50, 2.514),
            (100, 4.0),
            (200, 9.0),
            (300, 4.2),
            (400, 0.5),
        ];
        let d = drop_seek_glitches(&mut t);
        assert_eq!(
            d.iter().map(|g| g.0).collect::<Vec<_>>(),
            vec![10, 200],
            "{d:?}"
        );
        assert_eq!(t.len(), 9);
        assert!(t.contains(&(45, 2.366)) && t.contains(&(400, 0.5)));
        // The curve now interpolates 10 cylinders between its neighbours.
        let c = super::super::mech::SeekCurve::Table(t);
        assert!((c.time(10) - (1.749 + (1.823 - 1.749) / 3.0)).abs() < 1e-9);
    }
}
