//! fio's I/O priority options: `prioclass`/`prio` (the job's priority, which fio sets on its
//! thread with `ioprio_set`) and the libaio/io_uring engines' per-I/O priority
//! (`cmdprio_percentage`, `cmdprio_class`, `cmdprio`, `cmdprio_bssplit`; fio 3.33's
//! `engines/cmdprio.c`): which I/Os carry which priority.
//!
//! An I/O fio leaves without a priority of its own goes with class 0, and the kernel then
//! gives its bio the thread's (`bio_set_ioprio`: `get_current_ioprio`): either way the
//! job's default. The kernel carries a per-I/O priority only on direct I/O (`ki_ioprio` to
//! `bi_ioprio` in `blkdev_direct_IO`, `iomap_dio_bio_iter`); buffered reads are read ahead
//! with the reading thread's priority, and write-back is submitted by the flusher threads,
//! whose class is none (the page cache model sends both without a priority, which is right
//! for write-back only: see `JobFile::check_scheduler`).

use anyhow::{bail, Result};
use rand::Rng;
use serde::Serialize;

use super::units::parse_size;
use crate::request::{IoClass, IoPrio};

/// One `cmdprio_bssplit` entry: I/Os of `bs` bytes, `perc` % of them with `prio` (`None`:
/// the simple format's entry, with `cmdprio_class`/`cmdprio`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BsPrio {
    pub bs: u64,
    pub perc: u32,
    pub prio: Option<IoPrio>,
}

/// A job's priority options.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct JobPrio {
    /// Line of the first priority option, and of `prio`/`prioclass` (the job's own).
    pub line: Option<usize>,
    pub job_line: Option<usize>,
    /// `prioclass`, `prio`.
    pub class: Option<u32>,
    pub level: Option<u32>,
    /// Per direction (read, write): `cmdprio_percentage`, `cmdprio_class`, `cmdprio`.
    pub percentage: [u32; 2],
    pub cmd_class: [Option<u32>; 2],
    pub cmd_level: [u32; 2],
    pub bssplit: [Vec<BsPrio>; 2],
}

/// The class and level as a priority; an unknown class number is refused when parsed.
fn prio_of(class: u32, level: u32) -> IoPrio {
    IoPrio {
        class: IoClass::from_number(class).unwrap_or_default(),
        level: level.min(7) as u8,
    }
}

/// `a[,b]`: the read value and the write value (one value: both), each checked by `f`.
fn per_dir(v: &str, f: impl Fn(&str) -> Result<u32, String>) -> Result<[u32; 2], String> {
    let mut it = v.split(',');
    let r = f(it.next().unwrap_or("").trim())?;
    let w = match it.next() {
        Some(s) => f(s.trim())?,
        None => r,
    };
    Ok([r, w])
}

fn number(s: &str, max: u32, what: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(x) if x <= max => Ok(x),
        _ => Err(format!("'{s}': {what} is 0..={max}")),
    }
}

/// One direction's `cmdprio_bssplit` list: `bs/perc[/class/level]:...`.
fn parse_bssplit(s: &str) -> Result<Vec<BsPrio>, String> {
    let mut out = Vec::new();
    for e in s.split(':').filter(|e| !e.trim().is_empty()) {
        let f: Vec<&str> = e.trim().split('/').collect();
        let bs = parse_size(f[0]).map_err(|e| format!("'{}': {e}", f[0]))?;
        let perc = match f.get(1) {
            Some(p) => number(p, 100, "a percentage")?,
            None => return Err(format!("'{e}': expected size/percentage")),
        };
        let prio = match f.len() {
            2 => None,
            4 => Some(prio_of(
                number(f[2], 3, "a priority class")?,
                number(f[3], 7, "a priority level")?,
            )),
            _ => return Err(format!("'{e}': expected size/percentage[/class/level]")),
        };
        // (fio drops the entries of 0 %: those I/Os keep the default)
        if perc > 0 {
            out.push(BsPrio { bs, perc, prio });
        }
    }
    Ok(out)
}

impl JobPrio {
    /// Takes option `k` (one of this module's) from line `n`.
    pub fn apply(&mut self, k: &str, v: &str, n: usize) -> Result<()> {
        let r = match k {
            "prioclass" => number(v, 3, "a priority class").map(|c| self.class = Some(c)),
            "prio" => number(v, 7, "a priority level").map(|l| self.level = Some(l)),
            "cmdprio_percentage" => {
                per_dir(v, |s| number(s, 100, "a percentage")).map(|p| self.percentage = p)
            }
            "cmdprio_class" => per_dir(v, |s| number(s, 3, "a priority class"))
                .map(|c| self.cmd_class = c.map(Some)),
            "cmdprio" => {
                per_dir(v, |s| number(s, 7, "a priority level")).map(|l| self.cmd_level = l)
            }
            "cmdprio_bssplit" => {
                let mut dirs = v.split(',');
                let r = parse_bssplit(dirs.next().unwrap_or(""));
                r.and_then(|r| {
                    let w = match dirs.next() {
                        Some(w) => parse_bssplit(w)?,
                        None => r.clone(),
                    };
                    self.bssplit = [r, w];
                    Ok(())
                })
            }
            _ => return Ok(()),
        };
        if let Err(e) = r {
            bail!("line {n}: {k}={v}: {e}");
        }
        self.line.get_or_insert(n);
        if matches!(k, "prio" | "prioclass") {
            self.job_line.get_or_insert(n);
        }
        Ok(())
    }

    /// Whether any option is set.
    pub fn any(&self) -> bool {
        self.line.is_some()
    }

    /// The job's own priority (`td->ioprio`): class 0, level 0 unless given.
    pub fn default_prio(&self) -> IoPrio {
        match (self.class, self.level) {
            (None, None) => IoPrio::NONE,
            (c, l) => prio_of(c.unwrap_or(0), l.unwrap_or(0)),
        }
    }

    /// The per-I/O priority: `cmdprio_class` (RT when not given, `fio_cmdprio_init`) and
    /// `cmdprio` for direction `d`.
    fn cmd_prio(&self, d: usize) -> IoPrio {
        prio_of(self.cmd_class[d].unwrap_or(1), self.cmd_level[d])
    }

    /// The priority of an I/O of `bs` bytes in direction `d` (0 read, 1 write), drawing from
    /// `rng` as fio's `fio_cmdprio_set_ioprio` does from its own random state: with
    /// `cmdprio_percentage` p, p % of the I/Os; with `cmdprio_bssplit`, by the entries of
    /// that size, one draw against their running sum; else the job's default.
    pub fn pick(&self, d: usize, bs: u64, rng: &mut impl Rng) -> IoPrio {
        let p = self.percentage[d];
        if p > 0 {
            if rng.random_range(0..100) < p {
                return self.cmd_prio(d);
            }
            return self.default_prio();
        }
        let entries: Vec<&BsPrio> = self.bssplit[d].iter().filter(|e| e.bs == bs).collect();
        if !entries.is_empty() {
            let r = rng.random_range(0..100);
            let mut sum = 0;
            for e in entries {
                sum += e.perc;
                if r < sum {
                    return e.prio.unwrap_or_else(|| self.cmd_prio(d));
                }
            }
        }
        self.default_prio()
    }

    /// fio's check (`fio_cmdprio_init`): the two per-I/O modes exclude each other.
    pub fn check(&self) -> Result<(), String> {
        let perc = self.percentage.iter().any(|&p| p > 0);
        let split = self.bssplit.iter().any(|s| !s.is_empty());
        if perc && split {
            return Err(
                "cmdprio_percentage and cmdprio_bssplit exclude each other (as fio says)".into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn job(opts: &[(&str, &str)]) -> JobPrio {
        let mut p = JobPrio::default();
        for (i, (k, v)) in opts.iter().enumerate() {
            p.apply(k, v, i + 1).unwrap();
        }
        p
    }

    /// cmdprio-percentage.fio: 20 % RT, the rest the job's IDLE class.
    #[test]
    fn a_percentage_of_the_ios_get_the_cmdprio_class() {
        let p = job(&[
            ("prioclass", "3"),
            ("cmdprio_percentage", "20"),
            ("cmdprio_class", "1"),
        ]);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let picks: Vec<IoPrio> = (0..10_000).map(|_| p.pick(0, 131072, &mut rng)).collect();
        let rt = picks.iter().filter(|p| p.class == IoClass::Rt).count();
        let idle = picks.iter().filter(|p| p.class == IoClass::Idle).count();
        assert!((1_850..=2_150).contains(&rt), "{rt}");
        assert_eq!(rt + idle, 10_000);
    }

    /// cmdprio-bssplit.fio's advanced job: 64 KiB reads 25 % RT level 1, 75 % IDLE level 2;
    /// 1 MiB reads and all writes the default.
    #[test]
    fn bssplit_entries_by_size() {
        let p = job(&[
            ("prioclass", "2"),
            ("prio", "7"),
            ("cmdprio_bssplit", "64k/25/1/1:64k/75/3/2:1024k/0,1024k/0"),
        ]);
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let small: Vec<IoPrio> = (0..8_000).map(|_| p.pick(0, 65536, &mut rng)).collect();
        let rt = small.iter().filter(|p| p.class == IoClass::Rt).count();
        assert!((1_800..=2_200).contains(&rt), "{rt}");
        assert!(small
            .iter()
            .all(|p| p.level == if p.class == IoClass::Rt { 1 } else { 2 }));
        let be7 = prio_of(2, 7);
        assert_eq!(p.pick(0, 1 << 20, &mut rng), be7);
        assert_eq!(p.pick(1, 1 << 20, &mut rng), be7);
        assert_eq!(p.pick(1, 65536, &mut rng), be7);
    }

    #[test]
    fn bad_values_name_the_line() {
        let mut p = JobPrio::default();
        let e = p.apply("prioclass", "4", 9).unwrap_err().to_string();
        assert!(e.contains("line 9") && e.contains("prioclass"), "{e}");
        let e = p
            .apply("cmdprio_bssplit", "64k", 3)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3"), "{e}");
        let p = job(&[("cmdprio_percentage", "5"), ("cmdprio_bssplit", "4k/10")]);
        assert!(p.check().is_err());
    }
}
