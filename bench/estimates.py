"""Turn one nkisim trace into report rows: the cost-model estimate on every target, next to the
roofline of the problem (not of the kernel's own traffic), for pytest-benchmark's extra_info."""

from __future__ import annotations

from cases import PRIMARY_TARGET, TARGETS
from nkisim.cost import roofline


def rows_for(trace, kernel: str, case: str, flops: int, min_bytes: int, dtype: str = "bfloat16",
             targets=TARGETS, cores: int = 1) -> list[dict]:
    """One row per target; ``cores`` > 1 (an LNC=2 launch) compares with the roofline of that many
    NeuronCores, so that the ratio stays a per-core efficiency."""
    rows = []
    for target in targets:
        profile = trace.estimate(target)
        bound = roofline(flops, min_bytes, target, dtype, cores)
        rows.append({
            "kernel": kernel, "case": case, "target": target,
            "estimate_us": profile.time_us, "roofline_us": bound.time_us, "roofline_bound": bound.bound,
            "ratio": profile.time_us / bound.time_us if bound.time_us else None,
            "mfu": profile.mfu, "hbm_bytes": profile.hbm_bytes, "bound_by": profile.bounding_engine,
            "instructions": profile.instructions,
        })
    return rows


def extra_info(rows: list[dict]) -> dict:
    """Flat pytest-benchmark extra_info: estimate_us_trn2, roofline_us_trn2, ... per target."""
    info = {"note": "estimate_* and roofline_* are cost-model estimates, not measurements"}
    for r in rows:
        t = r["target"]
        info.update({f"estimate_us_{t}": round(r["estimate_us"], 3), f"roofline_us_{t}": round(r["roofline_us"], 3),
                     f"ratio_{t}": round(r["ratio"], 3), f"mfu_{t}": round(r["mfu"], 4),
                     f"bound_by_{t}": r["bound_by"]})
    info["hbm_bytes"] = rows[0]["hbm_bytes"] if rows else 0
    return info


def record_nkisim_run(benchmark, collector, progress, trace, kernel: str, case: str, flops: int, min_bytes: int,
                      elapsed_s: float, targets=TARGETS, cores: int = 1) -> None:
    """Estimate one nkisim run on ``targets``, put it in extra_info and the report, and print its line.
    ``cores``: NeuronCores the launch used (2 for ``kernel[2]``); the CPU time is recorded for 1-core runs."""
    rows = rows_for(trace, kernel, case, flops, min_bytes, targets=targets, cores=cores)
    benchmark.extra_info.update(extra_info(rows))
    collector.rows.extend(rows)
    if cores == 1:
        collector.add_cpu(case, nkisim_cpu_s=elapsed_s)
    main = next(r for r in rows if r["target"] == PRIMARY_TARGET)
    progress(f"nkisim {elapsed_s:.1f} s CPU; {PRIMARY_TARGET} ESTIMATE {main['estimate_us']:.1f} us vs "
             f"{cores}-core roofline {main['roofline_us']:.1f} us (x{main['ratio']:.1f}), MFU {main['mfu']:.1%}")
