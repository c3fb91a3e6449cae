//! Synthetic workloads: operation mix, inter-arrival, size and address distributions, open or
//! closed loop. Deterministic: a seeded ChaCha8 generator, so the same config and seed give
//! the same request stream.

use anyhow::{bail, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;

use crate::engine::{Pending, Source, When};
use crate::request::{Op, Request};

/// A distribution of non-negative values (ms for times, sectors for sizes).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(tag = "dist", rename_all = "lowercase", deny_unknown_fields)]
pub enum Dist {
    Constant {
        value: f64,
    },
    Uniform {
        min: f64,
        max: f64,
    },
    Exponential {
        mean: f64,
    },
    Normal {
        mean: f64,
        stddev: f64,
    },
    /// Poisson-distributed counts with this mean (for sizes in units).
    Poisson {
        mean: f64,
    },
}

impl Dist {
    pub fn validate(&self, what: &str) -> Result<()> {
        let ok = |x: f64| x.is_finite() && x >= 0.0;
        let good = match *self {
            Dist::Constant { value } => ok(value),
            Dist::Uniform { min, max } => ok(min) && ok(max) && min <= max,
            Dist::Exponential { mean } => ok(mean),
            Dist::Normal { mean, stddev } => ok(mean) && ok(stddev),
            Dist::Poisson { mean } => ok(mean) && mean < 1e9,
        };
        if !good {
            bail!("{what}: invalid distribution {self:?} (values must be finite and >= 0, min <= max)");
        }
        Ok(())
    }

    pub fn sample(&self, rng: &mut ChaCha8Rng) -> f64 {
        match *self {
            Dist::Constant { value } => value,
            Dist::Uniform { min, max } => {
                if max > min {
                    rng.random_range(min..max)
                } else {
                    min
                }
            }
            Dist::Exponential { mean } => {
                let u: f64 = rng.random::<f64>();
                -mean * (1.0 - u).ln()
            }
            Dist::Normal { mean, stddev } => {
                // Box-Muller; negative values clamp to 0.
                let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
                let u2: f64 = rng.random::<f64>();
                (mean + stddev * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos())
                    .max(0.0)
            }
            Dist::Poisson { mean } => {
                if mean > 30.0 {
                    // Normal approximation for large means.
                    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
                    let u2: f64 = rng.random::<f64>();
                    (mean
                        + mean.sqrt()
                            * (-2.0 * u1.ln()).sqrt()
                            * (std::f64::consts::TAU * u2).cos())
                    .round()
                    .max(0.0)
                } else {
                    let l = (-mean).exp();
                    let (mut k, mut p) = (0.0, 1.0);
                    loop {
                        p *= rng.random::<f64>();
                        if p <= l {
                            break k;
                        }
                        k += 1.0;
                    }
                }
            }
        }
    }
}

/// Where requests go.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(tag = "pattern", rename_all = "lowercase", deny_unknown_fields)]
pub enum Address {
    /// Uniformly random over `[0, span)` sectors (aligned to `align`).
    Random,
    /// One sequential stream from sector `start`, wrapping at the span.
    Sequential {
        #[serde(default)]
        start: u64,
    },
    /// Sequential runs of `run_length` requests, each run starting at a random place.
    Runs { run_length: Dist },
}

fn default_align() -> u64 {
    8
}
fn default_depth() -> u32 {
    1
}

/// The `[workload]` section of a config (units in the field docs).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    /// Requests to generate.
    pub requests: u64,
    /// Fraction of reads, 0..=1.
    pub read_fraction: f64,
    /// Request size in sectors (rounded, at least 1).
    pub size: Dist,
    /// Address pattern.
    pub address: Address,
    /// Address span in sectors (default: the device's capacity).
    #[serde(default)]
    pub span: Option<u64>,
    /// Alignment of random addresses, sectors.
    #[serde(default = "default_align")]
    pub align: u64,
    /// Open loop: time between arrivals (ms). Closed loop when absent.
    #[serde(default)]
    pub interarrival: Option<Dist>,
    /// Closed loop: requests kept outstanding.
    #[serde(default = "default_depth")]
    pub depth: u32,
    /// Closed loop: think time after each completion (ms).
    #[serde(default)]
    pub think: Option<Dist>,
    /// Seed of the random generator.
    #[serde(default)]
    pub seed: u64,
}

impl WorkloadSpec {
    pub fn validate(&self) -> Result<()> {
        if !(0.0..=1.0).contains(&self.read_fraction) {
            bail!("workload.read_fraction must be within 0..=1");
        }
        self.size.validate("workload.size")?;
        if let Some(d) = &self.interarrival {
            d.validate("workload.interarrival")?;
        }
        if let Some(d) = &self.think {
            d.validate("workload.think")?;
        }
        if let Address::Runs { run_length } = &self.address {
            run_length.validate("workload.address.run_length")?;
        }
        if self.depth == 0 || self.depth > 1_000_000 {
            bail!("workload.depth must be within 1..=1000000");
        }
        if self.align == 0 {
            bail!("workload.align must be at least 1 sector");
        }
        Ok(())
    }
}

/// A generator as a [`Source`].
pub struct Generator {
    spec: WorkloadSpec,
    span: u64,
    rng: ChaCha8Rng,
    made: u64,
    clock: f64,
    next_seq: u64,
    run_left: u64,
}

impl Generator {
    pub fn new(spec: WorkloadSpec, capacity: u64) -> Result<Generator> {
        spec.validate()?;
        let span = spec.span.unwrap_or(capacity).min(capacity);
        if span < 64 {
            bail!("workload span of {span} sectors is too small");
        }
        let start = match spec.address {
            Address::Sequential { start } => start % span,
            _ => 0,
        };
        Ok(Generator {
            rng: ChaCha8Rng::seed_from_u64(spec.seed),
            span,
            made: 0,
            clock: 0.0,
            next_seq: start,
            run_left: 0,
            spec,
        })
    }
}

impl Source for Generator {
    fn next(&mut self) -> Result<Option<Pending>> {
        if self.made >= self.spec.requests {
            return Ok(None);
        }
        let op = if self.rng.random::<f64>() < self.spec.read_fraction {
            Op::Read
        } else {
            Op::Write
        };
        let sectors = (self.spec.size.sample(&mut self.rng).round() as u64).clamp(1, self.span / 2);
        let max_start = self.span - sectors;
        let random = |rng: &mut ChaCha8Rng, align: u64| {
            let slots = max_start / align + 1;
            rng.random_range(0..slots) * align
        };
        let lba = match &self.spec.address {
            Address::Random => random(&mut self.rng, self.spec.align),
            Address::Sequential { .. } => {
                if self.next_seq > max_start {
                    self.next_seq = 0;
                }
                let l = self.next_seq;
                self.next_seq += sectors;
                l
            }
            Address::Runs { run_length } => {
                if self.run_left == 0 || self.next_seq > max_start {
                    self.run_left = (run_length.sample(&mut self.rng).round() as u64).max(1);
                    self.next_seq = random(&mut self.rng, self.spec.align);
                }
                self.run_left -= 1;
                let l = self.next_seq;
                self.next_seq += sectors;
                l
            }
        };
        let when = match &self.spec.interarrival {
            Some(d) => {
                self.clock += d.sample(&mut self.rng);
                When::At(self.clock)
            }
            None => {
                if self.made < u64::from(self.spec.depth) {
                    When::At(0.0)
                } else {
                    let think = self
                        .spec
                        .think
                        .as_ref()
                        .map(|d| d.sample(&mut self.rng))
                        .unwrap_or(0.0);
                    When::AfterCompletion { think }
                }
            }
        };
        self.made += 1;
        let req = Request::block(lba, sectors as u32, op);
        Ok(Some(Pending { when, req }))
    }
    fn len_hint(&self) -> Option<u64> {
        Some(self.spec.requests)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(address: Address) -> WorkloadSpec {
        WorkloadSpec {
            requests: 1000,
            read_fraction: 0.7,
            size: Dist::Constant { value: 8.0 },
            address,
            span: None,
            align: 8,
            interarrival: Some(Dist::Exponential { mean: 2.0 }),
            depth: 1,
            think: None,
            seed: 7,
        }
    }

    fn all(g: &mut Generator) -> Vec<Pending> {
        let mut v = Vec::new();
        while let Some(p) = g.next().unwrap() {
            v.push(p);
        }
        v
    }

    #[test]
    fn mix_rate_and_determinism() {
        let a = all(&mut Generator::new(spec(Address::Random), 1 << 20).unwrap());
        let b = all(&mut Generator::new(spec(Address::Random), 1 << 20).unwrap());
        assert_eq!(a, b, "same seed, same stream");
        let reads = a.iter().filter(|p| p.req.op == Op::Read).count();
        assert!((600..800).contains(&reads), "{reads} reads of 1000 at 0.7");
        let When::At(last) = a.last().unwrap().when else {
            panic!()
        };
        // 1000 exponential gaps of mean 2 ms: about 2000 ms.
        assert!((1700.0..2300.0).contains(&last), "{last}");
        assert!(a
            .iter()
            .all(|p| p.req.lba % 8 == 0 && p.req.end() <= 1 << 20));
    }

    #[test]
    fn sequential_is_contiguous_and_closed_loop_waits() {
        let mut s = spec(Address::Sequential { start: 100 });
        s.interarrival = None;
        s.depth = 2;
        let v = all(&mut Generator::new(s, 1 << 20).unwrap());
        assert_eq!(v[0].req.lba, 100);
        assert!(v.windows(2).all(|w| w[1].req.lba == w[0].req.end()));
        assert_eq!(v[1].when, When::At(0.0));
        assert_eq!(v[2].when, When::AfterCompletion { think: 0.0 });
    }

    #[test]
    fn bad_specs_are_refused() {
        let mut s = spec(Address::Random);
        s.read_fraction = 1.5;
        assert!(Generator::new(s, 1 << 20).is_err());
        let mut s = spec(Address::Random);
        s.size = Dist::Uniform { min: 9.0, max: 1.0 };
        assert!(Generator::new(s, 1 << 20).is_err());
    }
}
