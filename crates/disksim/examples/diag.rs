use std::io::BufReader;
use iolab_disksim::{engine::Simulator, hdd::{Hdd, HddSpec}, trace::*};
fn main() {
    let name = std::env::args().nth(1).unwrap();
    let dir = iolab_disksim::default_valid_dir();
    let spec = HddSpec::from_disksim(&dir.join(format!("{name}.parv")), None).unwrap();
    let f = std::fs::File::open(dir.join(format!("{name}.trace"))).unwrap();
    let q: MeasuredQueue = Default::default();
    let mut src = TraceSource::new(BufReader::new(f), Format::Validate).with_measured(q.clone());
    let mut sim = Simulator::new(vec![Box::new(Hdd::new(spec))]);
    let mut rows = Vec::new();
    sim.run(&mut src, &mut |c| { let m = q.borrow_mut().pop_front().unwrap(); rows.push((c.req.op.letter(), c.rec.cache.name(), m.service_ms, c.response(), c.req.lba, c.req.sectors, m.outcome.clone(), c.rec.seek, c.rec.rotation, c.rec.transfer)); }).unwrap();
    use std::collections::BTreeMap;
    let mut g: BTreeMap<(char, &str), (usize, f64, f64)> = BTreeMap::new();
    for r in &rows { let e = g.entry((r.0, r.1)).or_default(); e.0 += 1; e.1 += r.2; e.2 += r.3; }
    for (k, v) in g { println!("{:?} n={} real={:.3} sim={:.3}", k, v.0, v.1 / v.0 as f64, v.2 / v.0 as f64); }
    let mut g2: BTreeMap<(char, String), (usize, f64, f64)> = BTreeMap::new();
    for r in &rows { let e = g2.entry((r.0, r.6.clone())).or_default(); e.0 += 1; e.1 += r.2; e.2 += r.3; }
    for (k, v) in g2 { println!("real-outcome {:?} n={} real={:.3} sim={:.3}", k, v.0, v.1 / v.0 as f64, v.2 / v.0 as f64); }
    let mut g3: BTreeMap<(char, char, &str), (usize, f64, f64)> = BTreeMap::new();
    for w in rows.windows(2) { let e = g3.entry((w[0].0, w[1].0, w[1].1)).or_default(); e.0 += 1; e.1 += w[1].2; e.2 += w[1].3; }
    for (k, v) in g3 { println!("prev-then {:?} n={} real={:.3} sim={:.3}", k, v.0, v.1 / v.0 as f64, v.2 / v.0 as f64); }
    if std::env::args().nth(2).as_deref() == Some("slowwrite") {
        let mut shown = 0;
        for i in 3..rows.len() { if rows[i].0 == 'W' && (rows[i].3 - rows[i].2).abs() > 1.0 && shown < 10 { shown += 1; for j in i-3..=i { println!("{:?}", rows[j]); } println!(); } }
        println!("writes off by > 1 ms: {}", rows.iter().filter(|r| r.0 == 'W' && (r.3 - r.2).abs() > 1.0).count());
    }
    let mut g4: BTreeMap<(char, &str, u32), (usize, f64, f64)> = BTreeMap::new();
    for r in &rows { let e = g4.entry((r.0, r.1, r.5)).or_default(); e.0 += 1; e.1 += r.2; e.2 += r.3; }
    for (k, v) in g4 { if v.0 >= 40 { println!("size {:?} n={} real={:.3} sim={:.3} diff={:+.3}", k, v.0, v.1 / v.0 as f64, v.2 / v.0 as f64, (v.2 - v.1) / v.0 as f64); } }
    if std::env::args().nth(2).as_deref() == Some("x") { for r in rows.iter().take(60) { println!("{:?}", r); } }
    if std::env::args().nth(2).as_deref() == Some("badhit") {
        let mut shown = 0;
        for i in 3..rows.len() { if rows[i].1 == "hit" && rows[i].2 > 3.0 && shown < 12 { shown += 1; for j in i-3..=i { println!("{:?}", rows[j]); } println!(); } }
        shown = 0;
        for i in 3..rows.len() { if rows[i].1 != "hit" && rows[i].0 == 'R' && rows[i].2 < 2.0 && shown < 12 { shown += 1; for j in i-3..=i { println!("{:?}", rows[j]); } println!(); } }
        let bad = rows.iter().filter(|r| r.1 == "hit" && r.2 > 3.0).count();
        let hits = rows.iter().filter(|r| r.1 == "hit").count();
        let missed = rows.iter().filter(|r| r.1 != "hit" && r.0 == 'R' && r.2 < 2.0).count();
        println!("sim hits {hits}, of which real > 3 ms: {bad}; sim non-hit reads with real < 2 ms: {missed}");
    }
}
#[allow(dead_code)]
fn unused() {}
