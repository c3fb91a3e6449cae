//! A [`System`] from a DiskSim `.parv`: the disks it instantiates (device numbers in
//! instantiation order, as DiskSim numbers them), its driver's scheduler, its I/O mappings
//! (`disksim_iosim` `I/O Mappings`: trace device → simulated device) and its logical
//! organisations (`disksim_logorg`). What the model lacks is refused with the parameter's
//! file, line and name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::logorg::{CopyChoice, Logorg, Scheme};
use super::{DriverQueue, Route, System};
use crate::engine::Component;
use crate::hdd::params::{self, Block, ParamFile, Value};
use crate::hdd::{Hdd, HddSpec};
use crate::sched::Policy;

/// A system read from a `.parv`, with what the user should know about it.
pub struct Loaded {
    pub system: System,
    pub description: String,
    pub notes: Vec<String>,
}

/// The disk instances of a parameter file, in DiskSim's device-number order: (instance
/// name, its `disksim_disk` block's name). Other device types are refused.
fn disk_instances(pf: &ParamFile, path: &Path) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (names, ty) in &pf.instances {
        let Some(b) = pf.by_name(ty) else { continue };
        match b.ty.as_str() {
            "disksim_disk" => {
                for n in params::expand_names(names)
                    .with_context(|| format!("{}: instantiate", path.display()))?
                {
                    out.push((n, ty.clone()));
                }
            }
            "disksim_simpledisk" | "memsmodel_mems" | "ssdmodel_ssd" => bail!(
                "{}:{}: {} {}: this device type is not modelled in a system (only disksim_disk)",
                b.file.display(),
                b.line,
                b.ty,
                b.name
            ),
            _ => {}
        }
    }
    Ok(out)
}

/// Whether the file describes more than one device, I/O mappings or an organisation other
/// than one disk as it is (then `run` builds a [`System`]).
pub fn describes_system(path: &Path) -> Result<bool> {
    let pf = params::parse_file(path)?;
    let disks = disk_instances(&pf, path)?;
    let plain = |b: &Block| {
        b.word("Addressing mode")
            .is_ok_and(|w| w.eq_ignore_ascii_case("parts"))
            && b.word("Distribution scheme")
                .is_ok_and(|w| w.eq_ignore_ascii_case("asis"))
            && b.word("Redundancy scheme")
                .is_ok_and(|w| w.eq_ignore_ascii_case("noredun"))
    };
    let iomap = pf
        .find("disksim_iosim")
        .any(|b| b.get("I/O Mappings").is_some());
    Ok(disks.len() > 1 || iomap || pf.find("disksim_logorg").any(|b| !plain(b)))
}

/// The driver's scheduler, and whether it queues in the subsystem (passes the disks as many
/// accesses as they take).
fn driver_policy(pf: &ParamFile) -> Result<Option<(Policy, bool)>> {
    let Some(d) = pf.find("disksim_iodriver").next() else {
        return Ok(None);
    };
    let t = d.num_or("Constant access time", 0.0)?;
    if t != 0.0 {
        bail!(
            "{}: a constant access time is not modelled (0 uses the devices)",
            d.ctx("Constant access time")
        );
    }
    let s = d.block("Scheduler")?;
    let n = s.num("Scheduling policy")?;
    let p = Policy::from_disksim(n as u32).with_context(|| s.ctx("Scheduling policy"))?;
    let in_subsystem = d.num_or("Use queueing in subsystem", 1.0)? != 0.0;
    Ok(Some((p, in_subsystem)))
}

fn refuse_controllers(pf: &ParamFile) -> Result<()> {
    for c in pf.find("disksim_ctlr") {
        let t = c.num_or("type", 1.0)?;
        if t == 3.0 {
            bail!("{}: controller type 3 (a smart controller with its own cache and queue) is not modelled in a system", c.ctx("type"));
        }
    }
    Ok(())
}

/// Trace device → simulated device name, from `disksim_iosim`'s `I/O Mappings`.
fn iomaps(pf: &ParamFile) -> Result<Option<Vec<(u32, String, Block)>>> {
    let Some(io) = pf
        .find("disksim_iosim")
        .find(|b| b.get("I/O Mappings").is_some())
    else {
        return Ok(None);
    };
    let scale = io.num_or("I/O Trace Time Scale", 1.0)?;
    if scale != 1.0 {
        bail!("{}: only 1.0 is modelled", io.ctx("I/O Trace Time Scale"));
    }
    let mut out = Vec::new();
    for v in io.list("I/O Mappings")? {
        let Value::Block(m) = v else {
            bail!("{}: expected disksim_iomap blocks", io.ctx("I/O Mappings"));
        };
        let dev = match m.get("tracedev") {
            Some(Value::Num(n)) if *n >= 0.0 && *n <= f64::from(u32::MAX) => *n as u32,
            Some(Value::Word(w)) if w.starts_with("0x") => {
                u32::from_str_radix(&w[2..], 16).with_context(|| m.ctx("tracedev"))?
            }
            _ => bail!("{}: expected a device number", m.ctx("tracedev")),
        };
        for (k, want) in [("locScale", 512.0), ("sizeScale", 1.0), ("offset", 0.0)] {
            if m.num_or(k, want)? != want {
                bail!(
                    "{}: only {want} is modelled (the trace's blocks taken as they are)",
                    m.ctx(k)
                );
            }
        }
        out.push((dev, m.word("simdev")?.to_string(), m.clone()));
    }
    Ok(Some(out))
}

/// One `disksim_logorg` block over the disks named in `index`.
fn logorg_of(
    b: &Block,
    index: &BTreeMap<String, usize>,
    cap: &[u64],
) -> Result<(Logorg, Vec<usize>)> {
    let word = |k: &str| -> Result<String> { Ok(b.word(k)?.to_ascii_lowercase()) };
    let parts = match word("Addressing mode")?.as_str() {
        "parts" => true,
        "array" => false,
        w => bail!(
            "{}: '{w}' is not an addressing mode (Parts, Array)",
            b.ctx("Addressing mode")
        ),
    };
    let mut names = Vec::new();
    for v in b.list("devices")? {
        match v {
            Value::Word(w) => names.extend(w.split_whitespace().map(String::from)),
            _ => bail!("{}: expected device names", b.ctx("devices")),
        }
    }
    let mut members = Vec::new();
    for n in params::expand_names(&names).with_context(|| b.ctx("devices"))? {
        match index.get(&n) {
            Some(&i) => members.push(i),
            None => bail!("{}: '{n}' is not a disk of the system (an organisation of organisations is not modelled)", b.ctx("devices")),
        }
    }
    let unit = b.num("Stripe unit")?;
    if !(0.0..=1e12).contains(&unit) {
        bail!(
            "{}: {unit} is not a number of sectors",
            b.ctx("Stripe unit")
        );
    }
    let unit = unit as u64;
    let striped = match word("Distribution scheme")?.as_str() {
        "asis" => false,
        "striped" => true,
        w => bail!(
            "{}: '{w}' is not modelled (Asis, Striped)",
            b.ctx("Distribution scheme")
        ),
    };
    let scheme = match (word("Redundancy scheme")?.as_str(), striped) {
        ("noredun", false) => Scheme::Asis,
        ("noredun", true) => Scheme::Striped { unit },
        ("shadowed", _) => {
            let c = b.num("Number of copies")?;
            let read = CopyChoice::from_disksim(b.num("Copy choice on read")? as u32)
                .with_context(|| b.ctx("Copy choice on read"))?;
            Scheme::Shadowed {
                copies: c.clamp(0.0, 1e6) as usize,
                unit: striped.then_some(unit),
                read,
            }
        }
        (r @ ("parity_rotated" | "parity_disk"), true) => {
            let pu = b.num("Parity stripe unit")?;
            if pu as u64 != unit {
                bail!("{}: {pu}: only a parity unit equal to the stripe unit ({unit}) is modelled", b.ctx("Parity stripe unit"));
            }
            let rotated = r == "parity_rotated";
            if rotated && b.num("Parity rotation type")? != 1.0 {
                bail!("{}: only 1 (left symmetric) is modelled", b.ctx("Parity rotation type"));
            }
            let f = b.num("RMW vs. reconstruct")?;
            Scheme::Parity {
                unit,
                rotated,
                rmw_point: (f.clamp(0.0, 1.0) * members.len() as f64) as usize,
            }
        }
        (r, _) => bail!("{}: '{r}' is not modelled with distribution '{}' (Noredun, Shadowed, Parity_disk or Parity_rotated with Striped)", b.ctx("Redundancy scheme"), word("Distribution scheme")?),
    };
    let bpp = members.first().map_or(0, |&m| cap[m]);
    let org = Logorg::new(&b.name, parts, scheme, members.len(), bpp)
        .with_context(|| b.ctx("devices"))?;
    Ok((org, members))
}

/// Where each trace device number goes: through the I/O mappings, else device `d` is
/// DiskSim's device number `d`; to the first organisation covering it: an `Array` is
/// device `o`, its place among the organisations; a `Parts` organisation covers its data
/// devices.
fn routes_of(
    maps: Option<&[(u32, String, Block)]>,
    index: &BTreeMap<String, usize>,
    orgs: &[(Logorg, Vec<usize>)],
) -> Result<BTreeMap<u32, Route>> {
    let pairs: Vec<(u32, usize)> = match maps {
        Some(m) => m
            .iter()
            .map(|(t, name, b)| match index.get(name) {
                Some(&i) => Ok((*t, i)),
                None => bail!("{}: '{name}' is not a disk of the system", b.ctx("simdev")),
            })
            .collect::<Result<_>>()?,
        None => (0..index.len()).map(|i| (i as u32, i)).collect(),
    };
    let mut routes = BTreeMap::new();
    for (t, dev) in pairs {
        // DiskSim numbers an array by its organisation's place (`logorg_set_arraydisk`).
        let found = orgs.iter().enumerate().find_map(|(o, (org, members))| {
            if !org.parts {
                return (o == dev).then_some(Route { org: o, part: 0 });
            }
            let p = members.iter().position(|&m| m == dev)?;
            (p < org.logical_devices()).then_some(Route { org: o, part: p })
        });
        if let Some(r) = found {
            routes.insert(t, r);
        }
    }
    Ok(routes)
}

/// DiskSim's synthetic workload of `path` (its `disksim_synthio` block), if it has one: a
/// generator's devices are disks (DiskSim's device numbers) or arrays (their
/// organisation's number), as the system routes them without I/O mappings.
pub fn synthio(path: &Path) -> Result<Option<super::synthio::Synthio>> {
    let pf = params::parse_file(path)?;
    let Some(b) = pf.find("disksim_synthio").next() else {
        return Ok(None);
    };
    if iomaps(&pf)?.is_some() {
        bail!("{}: a synthetic workload with I/O mappings is not modelled (the generators address DiskSim's device numbers)", b.ctx("Generators"));
    }
    let disks = disk_instances(&pf, path)?;
    let orgs: Vec<String> = pf.find("disksim_logorg").map(|o| o.name.clone()).collect();
    let device = |n: &str| -> Option<u32> {
        disks
            .iter()
            .position(|(d, _)| d == n)
            .or_else(|| orgs.iter().position(|o| o == n))
            .map(|i| i as u32)
    };
    let seed = pf
        .find("disksim_global")
        .next()
        .and_then(|g| g.num("Init Seed").ok())
        .unwrap_or(42.0);
    let cpus = pf
        .find("disksim_pf")
        .next()
        .and_then(|p| p.num("Number of processors").ok())
        .unwrap_or(1.0);
    let s = super::synthio::Synthio::of(
        b,
        &device,
        seed.abs() as u64,
        cpus.clamp(1.0, 4096.0) as usize,
    )?;
    Ok(Some(s))
}

/// Reads the system of `path`.
pub fn load(path: &Path) -> Result<Loaded> {
    let pf = params::parse_file(path)?;
    let disks = disk_instances(&pf, path)?;
    if disks.is_empty() {
        bail!("{}: instantiates no disksim_disk", path.display());
    }
    refuse_controllers(&pf)?;
    let dir = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let driver = driver_policy(&pf)?;
    let mut specs: BTreeMap<String, HddSpec> = BTreeMap::new();
    let mut devices: Vec<(String, Box<dyn Component>)> = Vec::new();
    let mut cap = Vec::new();
    let mut notes = Vec::new();
    let mut drivers = Vec::new();
    for (inst, ty) in &disks {
        if !specs.contains_key(ty) {
            let b = pf.by_name(ty).with_context(|| format!("no disk {ty}"))?;
            let spec = HddSpec::from_blocks(b, &pf, &dir)
                .with_context(|| format!("{}: disk {ty}", path.display()))?;
            specs.insert(ty.clone(), spec);
        }
        let mut spec = specs[ty].clone();
        spec.cache.keep_returned_data = true;
        // The driver hands the disk one access at a time without queueing in the
        // subsystem, else as many as the disk takes ("Max queue length").
        drivers.push(driver.map(|(p, in_subsystem)| {
            let depth = if in_subsystem { spec.queue_depth } else { 1 };
            DriverQueue::new(p, depth, spec.blocks())
        }));
        cap.push(spec.blocks());
        devices.push((inst.clone(), Box::new(Hdd::new(spec))));
    }
    let index: BTreeMap<String, usize> = disks
        .iter()
        .enumerate()
        .map(|(i, (n, _))| (n.clone(), i))
        .collect();
    let mut orgs = Vec::new();
    for b in pf.find("disksim_logorg") {
        orgs.push(logorg_of(b, &index, &cap)?);
    }
    if orgs.is_empty() {
        // No organisation: each disk as it is (DiskSim requires one; a convenience).
        for (i, (n, _)) in disks.iter().enumerate() {
            orgs.push((Logorg::new(n, true, Scheme::Asis, 1, cap[i])?, vec![i]));
        }
        notes.push(format!(
            "{}: no disksim_logorg: each disk addressed as it is",
            path.display()
        ));
    }
    let maps = iomaps(&pf)?;
    let routes = routes_of(maps.as_deref(), &index, &orgs)?;
    if routes.is_empty() {
        bail!(
            "{}: no trace device number reaches a disk (I/O mappings and organisations)",
            path.display()
        );
    }
    let types: Vec<String> = specs
        .keys()
        .map(|t| format!("{} × {t}", disks.iter().filter(|d| &d.1 == t).count()))
        .collect();
    let org_text: Vec<String> = orgs
        .iter()
        .map(|(o, m)| format!("{} {:?} over {}", o.name, o.scheme, m.len()))
        .collect();
    let description = format!(
        "system of {} disks ({}); organisations: {}; trace devices {:?}",
        disks.len(),
        types.join(", "),
        org_text.join("; "),
        routes.keys().collect::<Vec<_>>()
    );
    notes.push("buses and controllers shared by several disks are not modelled: each disk has its own path".into());
    Ok(Loaded {
        system: System::new(devices, orgs, routes).with_drivers(drivers),
        description,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ascii.parv` (in `data/disksim-systems/`) with `edit` applied, in a scratch directory.
    fn ascii_with(edit: impl Fn(String) -> String) -> (iolab_sys::testing::TempDir, PathBuf) {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/disksim-systems");
        let dir = iolab_sys::testing::tempdir("disksim-system").unwrap();
        for f in ["hp_c2249a.diskspecs", "hp_c2249a.model"] {
            std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
        }
        let text = std::fs::read_to_string(src.join("ascii.parv")).unwrap();
        let p = dir.path().join("ascii.parv");
        std::fs::write(&p, edit(text)).unwrap();
        (dir, p)
    }

    fn err(edit: impl Fn(String) -> String) -> String {
        let (_d, p) = ascii_with(edit);
        match load(&p) {
            Ok(_) => panic!("loaded"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn ascii_parv_is_eighteen_disks_on_the_traces_device_numbers() {
        let (_d, p) = ascii_with(|t| t);
        assert!(describes_system(&p).unwrap());
        let l = load(&p).unwrap();
        assert_eq!(l.system.device_names().len(), 18);
        let caps = l.system.capacities();
        assert_eq!(caps.len(), 18);
        assert!(caps.contains_key(&0x0e) && caps.contains_key(&0x67));
    }

    #[test]
    fn what_the_model_lacks_is_refused_with_parameter_and_line() {
        let e = err(|t| t.replace("Distribution scheme = Asis", "Distribution scheme = Random"));
        assert!(
            e.contains("Distribution scheme") && e.contains("ascii.parv:296"),
            "{e}"
        );
        let e = err(|t| {
            t.replace(
                "Redundancy scheme = Noredun",
                "Redundancy scheme = Parity_rotated",
            )
        });
        assert!(e.contains("Redundancy scheme") && e.contains("asis"), "{e}");
        let e = err(|t| {
            t.replace(
                "locScale = 512, sizeScale = 1 },\n     disksim_iomap { tracedev = 0x12",
                "locScale = 1024, sizeScale = 1 },\n     disksim_iomap { tracedev = 0x12",
            )
        });
        assert!(e.contains("locScale"), "{e}");
        let e = err(|t| t.replace("simdev = disk5,", "simdev = disk99,"));
        assert!(e.contains("disk99") && e.contains("simdev"), "{e}");
        let e = err(|t| {
            t.replace(
                "devices = [ disk0 .. disk17 ],\n   Stripe unit  =  64",
                "devices = [ disk0 .. disk17, org9 ],\n   Stripe unit  =  64",
            )
        });
        assert!(e.contains("org9"), "{e}");
        let e = err(|t| {
            t.replace("Copy choice on read =  6", "Copy choice on read =  2")
                .replace(
                    "Redundancy scheme = Noredun",
                    "Redundancy scheme = Shadowed",
                )
        });
        assert!(e.contains("Copy choice on read"), "{e}");
    }

    #[test]
    fn a_trace_device_without_a_disk_is_an_error_with_its_line() {
        let (_d, p) = ascii_with(|t| t);
        let trace = "0.0 14 0 8 1\n1.0 99 0 8 1\n";
        let e = super::super::replay_ascii(&p, trace.as_bytes()).unwrap_err();
        let e = format!("{e:#}");
        assert!(e.contains("line 2") && e.contains("device 99"), "{e}");
        let past = "0.0 14 99999999 8 1\n";
        let e = format!(
            "{:#}",
            super::super::replay_ascii(&p, past.as_bytes()).unwrap_err()
        );
        assert!(e.contains("line 1") && e.contains("beyond"), "{e}");
    }

    #[test]
    fn name_ranges_expand() {
        let w = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(
            params::expand_names(&w("disk0 .. disk2 x")).unwrap(),
            w("disk0 disk1 disk2 x")
        );
        assert!(params::expand_names(&w("a0 .. b3")).is_err());
        assert!(params::expand_names(&w(".. b3")).is_err());
        assert!(params::expand_names(&w("d9 .. d1")).is_err());
    }
}
