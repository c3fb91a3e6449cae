//! DiskSim's synthetic workload (`disksim_synthio`) as a workload source, open loop: each
//! generator draws its requests as DiskSim's `synthio_generatenextio` does (sequential with
//! "Probability of sequential access", local with "Probability of local access", else a
//! random block of a random device of its list; sizes and block numbers in units of the
//! "Blocking factor"; the inter-arrival time of the kind drawn), until "Number of I/O
//! requests to generate" or "Maximum time of trace generated" (seconds). Each generator is
//! a process of DiskSim's process flow whose inter-arrival time is computation on one of the
//! `disksim_pf` "Number of processors"; a process that does not wait for its requests never
//! gives its processor up, so only the last generators run, one per processor (DiskSim's
//! `synthopen.parv`: three generators, one processor, every request on the third disk). The random numbers are ours (seeded), not DiskSim's `drand48`
//! stream: runs agree with DiskSim's in distribution, not request by request. Time-critical
//! and time-limited requests (a process waiting for its request: a closed loop) and system
//! calls are refused with their parameter.

use anyhow::{bail, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::engine::{Pending, Source, When};
use crate::hdd::params::{Block, Value};
use crate::request::{Op, Request};

/// One of DiskSim's distributions (`[ name, a, b ]`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dist {
    Uniform { low: f64, high: f64 },
    Normal { mean: f64, var: f64 },
    Exponential { base: f64, mean: f64 },
    Poisson { base: f64, mean: f64 },
    TwoValue { base: f64, other: f64, p: f64 },
}

impl Dist {
    fn of(b: &Block, key: &str) -> Result<Dist> {
        let l = b.list(key)?;
        let name = match l.first() {
            Some(Value::Word(w)) => w.to_ascii_lowercase(),
            _ => bail!("{}: expected [ name, numbers ]", b.ctx(key)),
        };
        let n = |i: usize| match l.get(i) {
            Some(Value::Num(x)) => Ok(*x),
            _ => bail!("{}: expected a number in place {i}", b.ctx(key)),
        };
        Ok(match name.as_str() {
            "uniform" => Dist::Uniform {
                low: n(1)?,
                high: n(2)?,
            },
            "normal" => Dist::Normal {
                mean: n(1)?,
                var: n(2)?,
            },
            "exponential" => Dist::Exponential {
                base: n(1)?,
                mean: n(2)?,
            },
            "poisson" => Dist::Poisson {
                base: n(1)?,
                mean: n(2)?.clamp(0.0, 700.0),
            },
            "twovalue" => Dist::TwoValue {
                base: n(1)?,
                other: n(2)?,
                p: n(3)?,
            },
            w => bail!(
                "{}: '{w}' is not a distribution (uniform, normal, exponential, poisson, twovalue)",
                b.ctx(key)
            ),
        })
    }

    /// A value drawn as DiskSim's `synthio_getrand` computes it.
    fn draw(&self, rng: &mut ChaCha8Rng) -> f64 {
        let mut u = || rng.random::<f64>();
        match *self {
            Dist::Uniform { low, high } => low + (high - low) * u(),
            Dist::Normal { mean, var } => {
                // DiskSim's rejection method for a standard normal deviate.
                let mut y1;
                loop {
                    let y2 = -(1.0 - u()).ln();
                    y1 = -(1.0 - u()).ln();
                    if y2 - (y1 - 1.0) * (y1 - 1.0) / 2.0 > 0.0 {
                        break;
                    }
                }
                if u() < 0.5 {
                    y1 = -y1;
                }
                var * y1 + mean
            }
            Dist::Exponential { base, mean } => base - mean * (1.0 - u()).ln(),
            Dist::Poisson { base, mean } => {
                let stop = (-mean).exp();
                let (mut d, mut count) = (1.0, 0u32);
                while d >= stop && count < 100_000 {
                    d *= u();
                    count += 1;
                }
                f64::from(count.saturating_sub(1)) + base
            }
            Dist::TwoValue { base, other, p } => {
                if u() < p {
                    other
                } else {
                    base
                }
            }
        }
    }
}

/// One `disksim_synthgen`.
#[derive(Clone, Debug)]
pub struct Generator {
    /// Trace device numbers it addresses.
    pub devices: Vec<u32>,
    /// Sectors per block, and blocks per device.
    pub block: u64,
    pub blocks: u64,
    pub p_seq: f64,
    pub p_local: f64,
    pub p_read: f64,
    pub general: Dist,
    pub sequential: Dist,
    pub local: Dist,
    pub local_distance: Dist,
    pub size: Dist,
}

impl Generator {
    /// Reads one generator block; `device` turns a name of its `devices` into a number.
    pub fn of(b: &Block, device: &dyn Fn(&str) -> Option<u32>) -> Result<Generator> {
        for k in [
            "Probability of time-critical request",
            "Probability of time-limited request",
        ] {
            if b.num_or(k, 0.0)? != 0.0 {
                bail!("{}: only 0 is modelled (an open workload; a process waiting for its requests is not)", b.ctx(k));
            }
        }
        let mut devices = Vec::new();
        let mut names = Vec::new();
        for v in b.list("devices")? {
            match v {
                Value::Word(w) => names.extend(w.split_whitespace().map(String::from)),
                _ => bail!("{}: expected device names", b.ctx("devices")),
            }
        }
        for n in crate::hdd::params::expand_names(&names)? {
            match device(&n) {
                Some(d) => devices.push(d),
                None => bail!(
                    "{}: '{n}' is neither a disk nor an array of the system",
                    b.ctx("devices")
                ),
            }
        }
        let block = b.num("Blocking factor")?;
        let cap = b.num("Storage capacity per device")?;
        if !(1.0..=1e6).contains(&block) || !(1.0..=1e13).contains(&cap) {
            bail!(
                "{}: blocking factor and capacity must be positive sector counts",
                b.ctx("Blocking factor")
            );
        }
        let prob = |k: &str| -> Result<f64> {
            let p = b.num(k)?;
            if !(0.0..=1.0).contains(&p) {
                bail!("{}: {p} is not a probability", b.ctx(k));
            }
            Ok(p)
        };
        Ok(Generator {
            devices,
            block: block as u64,
            blocks: (cap / block) as u64,
            p_seq: prob("Probability of sequential access")?,
            p_local: prob("Probability of local access")?,
            p_read: prob("Probability of read access")?,
            general: Dist::of(b, "General inter-arrival times")?,
            sequential: Dist::of(b, "Sequential inter-arrival times")?,
            local: Dist::of(b, "Local inter-arrival times")?,
            local_distance: Dist::of(b, "Local distances")?,
            size: Dist::of(b, "Sizes")?,
        })
    }
}

/// The state of one generator: its last request (device, block, blocks, read).
struct Running {
    gen: Generator,
    last: (u32, u64, u64, bool),
}

/// DiskSim's synthetic workload as a [`Source`].
pub struct Synthio {
    gens: Vec<Running>,
    left: u64,
    end_ms: f64,
    rng: ChaCha8Rng,
    /// The generators that run (one per processor) and when each issues its next request.
    running: Vec<(usize, f64)>,
}

impl Synthio {
    /// Reads a `disksim_synthio` block; `device` as for [`Generator::of`].
    pub fn of(
        b: &Block,
        device: &dyn Fn(&str) -> Option<u32>,
        seed: u64,
        processors: usize,
    ) -> Result<Synthio> {
        if b.num_or("System call/return with each request", 0.0)? != 0.0 {
            bail!(
                "{}: only 0 is modelled",
                b.ctx("System call/return with each request")
            );
        }
        let mut gens = Vec::new();
        for v in b.list("Generators")? {
            let Value::Block(g) = v else {
                bail!("{}: expected disksim_synthgen blocks", b.ctx("Generators"));
            };
            let gen = Generator::of(g, device)?;
            if gen.devices.is_empty() || gen.blocks < 2 {
                bail!("{}: no device, or no room for a request", g.ctx("devices"));
            }
            gens.push(Running {
                gen,
                last: (0, 0, 0, false),
            });
        }
        if gens.is_empty() {
            bail!("{}: no generator", b.ctx("Generators"));
        }
        let n = b.num("Number of I/O requests to generate")?;
        let end = b.num("Maximum time of trace generated")?;
        let first = gens.len().saturating_sub(processors.max(1));
        let mut s = Synthio {
            left: n.clamp(0.0, 1e12) as u64,
            end_ms: end.max(0.0) * 1000.0,
            rng: ChaCha8Rng::seed_from_u64(seed),
            running: (first..gens.len()).map(|g| (g, 0.0)).collect(),
            gens,
        };
        for k in 0..s.running.len() {
            let g = s.running[k].0;
            s.running[k].1 = s.advance(g);
        }
        Ok(s)
    }

    /// Draws generator `i`'s next request (its extent) as DiskSim's
    /// `synthio_generatenextio`, and returns its inter-arrival time (ms).
    fn advance(&mut self, i: usize) -> f64 {
        let rng = &mut self.rng;
        let r = &mut self.gens[i];
        let g = &r.gen;
        let (dev, blk, cnt, read) = r.last;
        let size = |rng: &mut ChaCha8Rng| (g.size.draw(rng).max(0.0) as u64).div_ceil(g.block);
        let gap = |d: &Dist, rng: &mut ChaCha8Rng| {
            (0..1000)
                .map(|_| d.draw(rng))
                .find(|t| *t >= 0.0)
                .unwrap_or(0.0)
        };
        let kind: f64 = rng.random();
        let next = if kind <= g.p_seq && blk + 2 * cnt < g.blocks && cnt > 0 {
            (gap(&g.sequential, rng), dev, blk + cnt, cnt, read)
        } else if kind > g.p_seq && kind < g.p_seq + g.p_local && cnt > 0 {
            let t = gap(&g.local, rng);
            let mut pick = None;
            for _ in 0..1000 {
                let b = blk as f64 + (g.local_distance.draw(rng) / g.block as f64).trunc();
                let c = size(rng);
                if b >= 0.0 && c > 0 && (b as u64) + c < g.blocks {
                    pick = Some((b as u64, c));
                    break;
                }
            }
            let (b, c) = pick.unwrap_or((0, 1));
            (t, dev, b, c, rng.random::<f64>() < g.p_read)
        } else {
            let t = gap(&g.general, rng);
            let d = g.devices
                [(rng.random::<f64>() * g.devices.len() as f64) as usize % g.devices.len()];
            let mut pick = (0, 1);
            for _ in 0..1000 {
                let b = (rng.random::<f64>() * g.blocks as f64) as u64;
                let c = size(rng);
                if c > 0 && b + c < g.blocks {
                    pick = (b, c);
                    break;
                }
            }
            (t, d, pick.0, pick.1, rng.random::<f64>() < g.p_read)
        };
        r.last = (next.1, next.2, next.3, next.4);
        next.0
    }
}

impl Source for Synthio {
    fn next(&mut self) -> Result<Option<Pending>> {
        if self.left == 0 {
            return Ok(None);
        }
        let Some(k) = (0..self.running.len())
            .min_by(|&a, &b| self.running[a].1.total_cmp(&self.running[b].1))
        else {
            return Ok(None);
        };
        let (i, at) = self.running[k];
        if at >= self.end_ms {
            return Ok(None);
        }
        let r = &self.gens[i];
        let (dev, blk, cnt, read) = r.last;
        let op = if read { Op::Read } else { Op::Write };
        let sectors = (cnt * r.gen.block).min(u64::from(u32::MAX)) as u32;
        let mut req = Request::block(blk * r.gen.block, sectors, op);
        req.dev = dev;
        self.left -= 1;
        self.running[k].1 = at + self.advance(i);
        Ok(Some(Pending {
            when: When::At(at),
            req,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distributions_have_disksims_means() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mean = |d: Dist, rng: &mut ChaCha8Rng| {
            (0..200_000).map(|_| d.draw(rng)).sum::<f64>() / 200_000.0
        };
        let e = mean(
            Dist::Exponential {
                base: 2.0,
                mean: 25.0,
            },
            &mut rng,
        );
        assert!((e - 27.0).abs() < 0.3, "{e}");
        let u = mean(
            Dist::Uniform {
                low: 10.0,
                high: 20.0,
            },
            &mut rng,
        );
        assert!((u - 15.0).abs() < 0.1, "{u}");
        let n = mean(
            Dist::Normal {
                mean: 30.0,
                var: 10.0,
            },
            &mut rng,
        );
        assert!((n - 30.0).abs() < 0.2, "{n}");
        let p = mean(
            Dist::Poisson {
                base: 0.0,
                mean: 4.0,
            },
            &mut rng,
        );
        assert!((p - 4.0).abs() < 0.05, "{p}");
    }
}
