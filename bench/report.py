"""bench/out/: report.json, report.md and estimate_vs_roofline.png from the benchmark rows.

One row per kernel x shape x target: cost-model estimate (us), roofline bound (us), their ratio,
MFU, HBM bytes of the kernel's trace, bounding engine, plus the CPU wall times measured on this
host (eager reference, nkisim run) and the device time when a Neuron device timed the kernel.
Everything under ``estimated_*`` is a cost-model ESTIMATE for the named target, not a measurement.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parent / "out"

HOW_TO_READ = """\
How to read this: `estimate_us` is the nkisim cost model's ESTIMATE of the kernel's time on one
NeuronCore of the target, or on two for `attention_fwd[2]` (the LNC=2 launch, trn2/trn3, whose
roofline is that of two cores) (it is not a measurement; the model's calibration against public
measurements is in tests/cost/test_cost_calibration.py and test_cost_dma.py). `roofline_us` is the lower
bound max(FLOPs at the TensorE peak, bytes at the per-core HBM bandwidth); for attention the bytes
are q, k, v and o once. `ratio` = estimate / roofline (1.0 = at the bound). `mfu` = TensorE FLOPs /
(estimate x peak). `hbm_bytes` is what the kernel's DMAs actually move. `bound_by` is the engine
busiest in the estimated schedule. CPU columns are wall times on this host (eager PyTorch reference,
and the nkisim interpreter run that produced the trace); `device_us` is filled only when a Neuron
device timed the real kernel.
"""


def write(rows: list[dict], cpu: dict, device: dict, out_dir: Path = OUT_DIR) -> list[Path]:
    """Write the three report files; ``cpu``/``device`` map case label -> timings."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for row in rows:
        row.update(cpu.get(row["case"], {}))
        row["device_us"] = device.get(row["case"])
    paths = [out_dir / "report.json", out_dir / "report.md", out_dir / "estimate_vs_roofline.png"]
    paths[0].write_text(json.dumps({"note": "estimate_us and roofline_us are cost-model estimates unless device_us "
                                            "is set", "rows": rows}, indent=2) + "\n")
    paths[1].write_text(_markdown(rows))
    _plot(rows, paths[2])
    return paths


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def _markdown(rows: list[dict]) -> str:
    lines = ["# Benchmark report (cost-model estimates unless `device_us` is set)", "", HOW_TO_READ,
             "| kernel | case | target | estimate_us | roofline_us | ratio | mfu | hbm_bytes | bound_by | "
             "eager_cpu_us | nkisim_cpu_s | device_us |",
             "|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['kernel']} | {r['case']} | {r['target']} | {_fmt(r['estimate_us'], '.1f')} | "
                     f"{_fmt(r['roofline_us'], '.1f')} | {_fmt(r['ratio'], '.2f')} | {_fmt(r['mfu'], '.1%')} | "
                     f"{r['hbm_bytes']} | {r['bound_by']} | {_fmt(r.get('eager_cpu_us'), '.0f')} | "
                     f"{_fmt(r.get('nkisim_cpu_s'), '.2f')} | {_fmt(r.get('device_us'), '.1f')} |")
    return "\n".join(lines) + "\n"


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if not r["kernel"].endswith("[2]")]    # one bar per (case, target): 1-core launches
    cases = list(dict.fromkeys(r["case"] for r in rows))
    targets = sorted({r["target"] for r in rows})
    by = {(r["case"], r["target"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(cases) + 3), 5))
    width = 0.8 / (len(targets) * 2)
    for t_i, target in enumerate(targets):
        for kind_i, (key, hatch) in enumerate((("estimate_us", None), ("roofline_us", "//"))):
            xs, ys = [], []
            for c_i, case in enumerate(cases):
                row = by.get((case, target))
                if row and row[key]:
                    xs.append(c_i - 0.4 + width * (2 * t_i + kind_i + 0.5))
                    ys.append(row[key])
            label = f"{target} {'estimate' if kind_i == 0 else 'roofline'}"
            ax.bar(xs, ys, width, label=label, color=f"C{t_i}", alpha=1.0 if kind_i == 0 else 0.45, hatch=hatch)
    ax.set_yscale("log")
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(cases, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("microseconds (log scale)")
    ax.set_title("Cost-model ESTIMATE vs roofline bound per shape (not measurements)")
    ax.legend(fontsize=7, ncol=len(targets))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
