//! Mechanics: seek curve, head switch, write settling and rotation.

use anyhow::{bail, Result};

/// Seek time as a function of the distance in cylinders (ms).
#[derive(Clone, Debug, PartialEq)]
pub enum SeekCurve {
    /// The same time for every non-zero distance.
    Constant(f64),
    /// A measured table `(distance, ms)`, increasing distances, interpolated linearly between
    /// points and extrapolated from the last two past the end (DiskSim "extracted").
    Table(Vec<(u32, f64)>),
    /// Ruemmler & Wilkes' two-part formula (DiskSim "hpl"): `a + b·√d` below `boundary`
    /// cylinders, `c + e·d` from there on; `one` for a single-cylinder seek.
    Hpl {
        boundary: u32,
        a: f64,
        b: f64,
        c: f64,
        e: f64,
        one: Option<f64>,
    },
    /// The first ten distances from a table, the formula beyond (DiskSim "hplplus10").
    HplPlus10 {
        first10: [f64; 10],
        boundary: u32,
        a: f64,
        b: f64,
        c: f64,
        e: f64,
    },
    /// Piecewise linear through (1, single), (cylinders/3, average), (cylinders-1, full):
    /// for disks described only by the three figures of a data sheet.
    ThreePoint {
        single: f64,
        average: f64,
        full: f64,
        cylinders: u32,
    },
}

impl SeekCurve {
    pub fn validate(&self) -> Result<()> {
        let finite_nonneg = |x: f64| x.is_finite() && (0.0..10_000.0).contains(&x);
        match self {
            SeekCurve::Constant(t) if !finite_nonneg(*t) => bail!("seek time {t} ms out of range"),
            SeekCurve::Table(t) => {
                if t.is_empty() {
                    bail!("empty seek table");
                }
                if t.windows(2).any(|w| w[1].0 <= w[0].0) {
                    bail!("seek table distances must increase");
                }
                if t.iter().any(|&(_, ms)| !finite_nonneg(ms)) {
                    bail!("seek table time out of range");
                }
            }
            SeekCurve::ThreePoint {
                single,
                average,
                full,
                cylinders,
            } if !(finite_nonneg(*single) && finite_nonneg(*average) && finite_nonneg(*full))
                || *cylinders < 4 =>
            {
                bail!("three-point seek curve needs non-negative times and at least 4 cylinders");
            }
            _ => {}
        }
        Ok(())
    }

    pub fn time(&self, dist: u32) -> f64 {
        if dist == 0 {
            return 0.0;
        }
        match self {
            SeekCurve::Constant(t) => *t,
            SeekCurve::Table(t) => table(t, dist),
            SeekCurve::Hpl {
                boundary,
                a,
                b,
                c,
                e,
                one,
            } => {
                if dist == 1 {
                    if let Some(o) = one {
                        return *o;
                    }
                }
                hpl(dist, *boundary, *a, *b, *c, *e)
            }
            SeekCurve::HplPlus10 {
                first10,
                boundary,
                a,
                b,
                c,
                e,
            } => {
                if dist <= 10 {
                    first10[dist as usize - 1]
                } else {
                    hpl(dist, *boundary, *a, *b, *c, *e)
                }
            }
            SeekCurve::ThreePoint {
                single,
                average,
                full,
                cylinders,
            } => {
                let d = f64::from(dist);
                let third = (f64::from(*cylinders) / 3.0).max(2.0);
                let last = f64::from(cylinders - 1).max(third + 1.0);
                if d <= third {
                    single + (average - single) * (d - 1.0) / (third - 1.0)
                } else {
                    average + (full - average) * (d - third) / (last - third)
                }
            }
        }
    }
}

fn hpl(dist: u32, boundary: u32, a: f64, b: f64, c: f64, e: f64) -> f64 {
    if dist < boundary {
        a + b * f64::from(dist).sqrt()
    } else {
        c + e * f64::from(dist)
    }
}

fn table(t: &[(u32, f64)], dist: u32) -> f64 {
    // First point at or past dist; interpolate with the one before, or extrapolate from the
    // last two past the end. Below the first measured distance, the first time.
    let i = t.partition_point(|&(d, _)| d < dist);
    if i < t.len() && t[i].0 == dist {
        return t[i].1;
    }
    if i == 0 {
        return t[0].1;
    }
    let (j, k) = if i >= t.len() {
        (t.len().saturating_sub(2), t.len() - 1)
    } else {
        (i - 1, i)
    };
    if j == k {
        return t[k].1;
    }
    let (d1, t1) = (f64::from(t[j].0), t[j].1);
    let (d2, t2) = (f64::from(t[k].0), t[k].1);
    (t1 + (f64::from(dist) - d1) * (t2 - t1) / (d2 - d1)).max(0.0)
}

/// Fractional part of a non-negative number (`rem_euclid(1.0)` without a libm `fmod` call:
/// this is on the hot path of every media access).
#[inline]
pub fn frac(x: f64) -> f64 {
    if (0.0..9.0e15).contains(&x) {
        x - (x as u64) as f64
    } else {
        x.rem_euclid(1.0)
    }
}

/// Mechanical parameters of the head-disk assembly.
#[derive(Clone, Debug, PartialEq)]
pub struct Mech {
    pub seek: SeekCurve,
    /// Time to switch to another surface of the same cylinder (ms).
    pub head_switch: f64,
    /// Extra settling before writing after any positioning (ms). DIXtrac extracted negative
    /// values for some drives (the DEC RZ26: −0.483 ms, its writes settling faster than its
    /// reads); DiskSim adds them all the same, and so do we, never below zero.
    pub write_settle: f64,
    /// Spindle speed (revolutions per minute).
    pub rpm: f64,
}

impl Mech {
    /// One revolution (ms).
    pub fn period(&self) -> f64 {
        60_000.0 / self.rpm
    }

    /// Positioning from (cyl, head) to (cyl, head): the seek, or the head switch if longer,
    /// plus write settling when anything moved.
    pub fn position(&self, from: (u32, u32), to: (u32, u32), write: bool) -> f64 {
        let seek = self.seek.time(from.0.abs_diff(to.0));
        let hs = if from.1 != to.1 {
            self.head_switch
        } else {
            0.0
        };
        let t = seek.max(hs);
        if t > 0.0 && write {
            (t + self.write_settle).max(0.0)
        } else {
            t
        }
    }

    /// Angle (0..1) of the platters at time `t` (the spindle is at angle 0 at t = 0).
    pub fn angle_at(&self, t: f64) -> f64 {
        frac(t / self.period())
    }

    /// Time to wait from `t` until angle `target` passes under the head (0 ≤ wait < period).
    pub fn wait_for(&self, t: f64, target: f64) -> f64 {
        let d = frac(target - self.angle_at(t) + 1.0);
        // Angles that are equal up to rounding mean "now", not a full revolution.
        if d > 1.0 - 1e-9 {
            0.0
        } else {
            d * self.period()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seek_table_interpolates_and_extrapolates() {
        let c = SeekCurve::Table(vec![(1, 2.0), (10, 4.0), (100, 8.0)]);
        assert_eq!(c.time(0), 0.0);
        assert_eq!(c.time(1), 2.0);
        assert_eq!(c.time(10), 4.0);
        // Halfway between 10 and 100 -> halfway between 4 and 8.
        assert!((c.time(55) - 6.0).abs() < 1e-12);
        // 190 is as far past 100 as 100 is past 10: 8 + 4.
        assert!((c.time(190) - 12.0).abs() < 1e-12);
    }

    #[test]
    fn hpl_formula_both_sides_of_the_boundary() {
        let c = SeekCurve::Hpl {
            boundary: 300,
            a: 3.81,
            b: 0.33,
            c: 7.75,
            e: 0.0059,
            one: Some(0.2),
        };
        assert_eq!(c.time(1), 0.2);
        assert!((c.time(100) - (3.81 + 0.33 * 10.0)).abs() < 1e-12);
        assert!((c.time(1000) - (7.75 + 5.9)).abs() < 1e-12);
        let p = SeekCurve::HplPlus10 {
            first10: [1., 2., 3., 4., 5., 6., 7., 8., 9., 10.],
            boundary: 300,
            a: 3.81,
            b: 0.33,
            c: 7.75,
            e: 0.0059,
        };
        assert_eq!(p.time(7), 7.0);
        assert!((p.time(400) - (7.75 + 0.0059 * 400.0)).abs() < 1e-12);
    }

    #[test]
    fn rotational_wait_is_within_one_revolution() {
        let m = Mech {
            seek: SeekCurve::Constant(1.0),
            head_switch: 0.5,
            write_settle: 0.1,
            rpm: 7200.0,
        };
        let p = m.period();
        assert!((p - 8.333_333_333).abs() < 1e-6);
        for i in 0..1000 {
            let t = i as f64 * 0.0137;
            let target = (i as f64 * 0.618).fract();
            let w = m.wait_for(t, target);
            assert!((0.0..p).contains(&w), "wait {w}");
            // After waiting, the head is at the target angle.
            let a = m.angle_at(t + w);
            assert!((a - target).abs() < 1e-9 || (a - target).abs() > 1.0 - 1e-9);
        }
        // Positioning: head switch only, settle for writes, the longer of seek and switch.
        assert_eq!(m.position((5, 0), (5, 1), false), 0.5);
        assert!((m.position((5, 0), (5, 1), true) - 0.6).abs() < 1e-12);
        assert_eq!(m.position((5, 0), (9, 1), false), 1.0);
        assert_eq!(m.position((5, 1), (5, 1), true), 0.0);
        // A negative write settle shortens a write's positioning, never below nothing.
        let fast = Mech {
            write_settle: -0.3,
            ..m.clone()
        };
        assert!((fast.position((5, 0), (5, 1), true) - 0.2).abs() < 1e-12);
        let faster = Mech {
            write_settle: -0.8,
            ..m.clone()
        };
        assert_eq!(faster.position((5, 0), (5, 1), true), 0.0);
        assert_eq!(faster.position((5, 0), (5, 1), false), 0.5);
    }
}
