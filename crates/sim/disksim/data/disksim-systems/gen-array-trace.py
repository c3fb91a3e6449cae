#!/usr/bin/env python3
"""Writes array-6k.trace: 6,000 requests in DiskSim's ascii format (time_ms device block
sectors flags) for the array organisations: exponential inter-arrival times (mean 5 ms),
sizes a multiple of 8 sectors (exponential, mean 8), 20% sequential, 66% reads, blocks below
6,000,000, all on device 0 (tests/systems.rs renumbers the device per configuration).
Seeded: the file is the same on every run."""
import random

rng = random.Random(44)
t, prev_end, out = 0.0, 0, []
for _ in range(6000):
    t += rng.expovariate(1 / 5.0)
    size = 8 * max(1, round(rng.expovariate(1 / 8.0) / 8))
    if rng.random() < 0.2 and prev_end + size < 6_000_000:
        blk = prev_end
    else:
        blk = 8 * rng.randrange(0, (6_000_000 - 64) // 8)
    prev_end = blk + size
    read = 1 if rng.random() < 0.66 else 0
    out.append(f"{t:.6f} 0 {blk} {size} {read}\n")
open("array-6k.trace", "w").writelines(out)
