//! The validation on DiskSim's five real-disk traces, as a regression check: every disk's
//! demerit must stay at or below the value recorded in data/validation-baseline.json
//! (recorded from a run, rounded up to the next µs), and its per-request RMS error at most
//! half a percent above DiskSim 4.0's on the same trace. The simulation is deterministic, so a
//! change there is a change of the model: improve it and record the new values.

use std::collections::BTreeMap;

use iolab_disksim::validate;

#[test]
fn demerits_do_not_regress_past_the_recorded_values() {
    let dir = iolab_disksim::default_valid_dir();
    let text =
        std::fs::read_to_string(dir.parent().unwrap().join("validation-baseline.json")).unwrap();
    let recorded: BTreeMap<String, f64> = serde_json::from_str(&text).unwrap();
    let disks = validate::find_disks(&dir).unwrap();
    assert_eq!(
        disks.len(),
        5,
        "the five DiskSim validation disks are in the repository"
    );
    let mut failures = Vec::new();
    for (name, parv, trace) in disks {
        let r = validate::run_disk(&name, &parv, &trace).unwrap();
        assert!(r.requests >= 9999, "{name}: every trace line replayed");
        let max = recorded[&name];
        eprintln!(
            "{name}: demerit {:.4} ms (recorded {max}), mean error {:+.2}%",
            r.demerit_ms, r.mean_error_pct
        );
        if r.demerit_ms > max {
            failures.push(format!(
                "{name}: demerit {:.4} ms > recorded {max} ms",
                r.demerit_ms
            ));
        }
        // Request by request, the model is as close to the real drive as DiskSim 4.0 on
        // every disk (the demerit alone can reward wrong requests): closer on four (28 Nov),
        // within 0.3% on the Atlas III, where both now read ahead by DEC's scheme and differ
        // on ~300 requests by rotational phase alone (29 Nov: 163 closer in DiskSim, 133
        // here). Half a percent is allowed for that.
        let ds = r
            .disksim_per_request_rms_ms
            .expect("DiskSim's figure is known");
        eprintln!(
            "{name}: per-request RMS {:.4} ms (DiskSim {ds})",
            r.per_request_rms_ms
        );
        if r.per_request_rms_ms > ds * 1.005 {
            failures.push(format!(
                "{name}: per-request RMS {:.4} ms > DiskSim's {ds} ms",
                r.per_request_rms_ms
            ));
        }
        // Every disk's mean stays within 5% of the real one (the goal, met by all five).
        if r.mean_error_pct.abs() > 5.0 {
            failures.push(format!(
                "{name}: mean response time off by {:+.2}%",
                r.mean_error_pct
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn same_trace_same_result() {
    let dir = iolab_disksim::default_valid_dir();
    let a = validate::run_disk(
        "hp_c2247a",
        &dir.join("hp_c2247a.parv"),
        &dir.join("hp_c2247a.trace"),
    )
    .unwrap();
    let b = validate::run_disk(
        "hp_c2247a",
        &dir.join("hp_c2247a.parv"),
        &dir.join("hp_c2247a.trace"),
    )
    .unwrap();
    assert_eq!(a.sim_mean_ms, b.sim_mean_ms);
    assert_eq!(a.sim_cdf, b.sim_cdf);
}
