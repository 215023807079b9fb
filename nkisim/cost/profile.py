"""Profile: the cost model's estimate for one kernel on one target, its roofline, a summary.

All times are ESTIMATES of the cost model (``nkisim.cost``) for the named target, never
measurements. ``mfu`` is useful TensorE FLOPs over (time x the target's TensorE peak for the
matmul dtype x cores used); the roofline is ``max(flops / peak, hbm_bytes / hbm_bandwidth)``
with the HBM bandwidth of one NeuronCore (nki-reference.md section 3).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .constants import TARGETS

ENGINE_LABELS = {"tensor": "TensorE", "vector": "VectorE", "scalar": "ScalarE", "gpsimd": "GpSimdE", "dma": "DMA"}


@dataclass(frozen=True)
class Roofline:
    compute_us: float       # flops at the TensorE peak
    memory_us: float        # HBM bytes at the per-core HBM bandwidth
    bound: str              # "compute" or "memory"

    @property
    def time_us(self) -> float:
        return max(self.compute_us, self.memory_us)


def roofline(flops: float, hbm_bytes: float, target: str = "trn2", dtype: str = "bfloat16",
             cores: int = 1) -> Roofline:
    """Roofline bound of ``flops`` TensorE FLOPs and ``hbm_bytes`` of HBM traffic on ``cores``
    NeuronCores of ``target`` (e.g. attention: 4*B*H*Sq*Sk*D FLOPs and the q, k, v, o bytes)."""
    t = TARGETS[_target_name(target)]
    compute = flops / (t.peak_flops(dtype) * cores) * 1e6
    memory = hbm_bytes / (t.hbm_bytes_per_s * cores) * 1e6
    return Roofline(compute, memory, "compute" if compute >= memory else "memory")


def _target_name(target: str) -> str:
    from ..target import ALIASES
    key = ALIASES.get(str(target).strip().lower())
    if key is None:
        raise ValueError(f"unknown target {target!r}: use trn1, trn2 or trn3")
    return key


@dataclass
class Profile:
    """Estimated execution of a kernel on ``target`` (see the module docstring)."""

    target: str
    time_us: float
    engine_busy_us: dict
    flops: int
    hbm_bytes: int
    matmul_dtype: str
    cores: int
    instructions: int
    roofline: Roofline
    critical_path: list = field(default_factory=list)   # [(engine, instruction, count, us)] by time
    critical_waits: dict = field(default_factory=dict)  # what bound starts on the path -> count
    unknown_instructions: dict = field(default_factory=dict)

    @property
    def mfu(self) -> float:
        if self.time_us <= 0 or not self.flops:
            return 0.0
        peak = TARGETS[self.target].peak_flops(self.matmul_dtype) * self.cores
        return self.flops / (self.time_us * 1e-6 * peak)

    @property
    def roofline_us(self) -> float:
        return self.roofline.time_us

    @property
    def roofline_ratio(self) -> float:
        """Estimated time over the roofline bound (1.0 = at the bound)."""
        return self.time_us / self.roofline_us if self.roofline_us > 0 else float("inf")

    @property
    def bounding_engine(self) -> str:
        return max(self.engine_busy_us, key=self.engine_busy_us.get) if self.engine_busy_us else "none"

    def utilization(self, engine: str) -> float:
        return self.engine_busy_us.get(engine, 0.0) / self.time_us if self.time_us > 0 else 0.0

    def to_dict(self) -> dict:
        return {"target": self.target, "estimated_us": self.time_us, "roofline_us": self.roofline_us,
                "roofline_bound": self.roofline.bound, "ratio_to_roofline": self.roofline_ratio, "mfu": self.mfu,
                "flops": self.flops, "hbm_bytes": self.hbm_bytes, "engine_busy_us": dict(self.engine_busy_us),
                "bounding_engine": self.bounding_engine, "instructions": self.instructions, "cores": self.cores,
                "unknown_instructions": dict(self.unknown_instructions)}

    def summary(self) -> str:
        eng = self.bounding_engine
        lines = [
            f"cost-model ESTIMATE on {self.target} ({self.cores} core{'s' if self.cores > 1 else ''}, "
            f"{self.instructions} instructions): {self.time_us:.2f} us",
            f"  roofline {self.roofline_us:.2f} us ({self.roofline.bound}-bound: "
            f"compute {self.roofline.compute_us:.2f} us, "
            f"HBM {self.roofline.memory_us:.2f} us); estimate / roofline = {self.roofline_ratio:.2f}",
            f"  TensorE {self.flops / 1e9:.3f} GFLOP ({self.matmul_dtype}), MFU {self.mfu:.1%}; "
            f"HBM traffic {self.hbm_bytes / 2**20:.2f} MiB",
            "  engine busy: " + ", ".join(f"{ENGINE_LABELS.get(e, e)} {us:.2f} us ({self.utilization(e):.0%})"
                                          for e, us in self.engine_busy_us.items()),
            f"  bounding engine: {ENGINE_LABELS.get(eng, eng)} (busy {self.utilization(eng):.0%} of the time)",
        ]
        if self.critical_path:
            top = ", ".join(f"{ENGINE_LABELS.get(e, e)}.{n} x{c} {us:.2f} us" for e, n, c, us in self.critical_path[:4])
            waits = ", ".join(f"{k} {v}" for k, v in sorted(self.critical_waits.items(), key=lambda kv: -kv[1]))
            lines.append(f"  critical path: {top} (starts bound by: {waits})")
        if self.unknown_instructions:
            lines.append("  priced by the default max(MIN_II, N) (no published formula): "
                         + ", ".join(f"{n} x{c}" for n, c in self.unknown_instructions.items()))
        return "\n".join(lines)

    def __str__(self):
        return self.summary()


def summarize_path(slots) -> tuple[list, dict]:
    """Group critical-path slots by (engine, instruction): [(engine, name, count, us)] by time."""
    time_by, count_by, waits = Counter(), Counter(), Counter()
    for s in slots:
        key = (s.instr.engine, s.instr.name)
        time_by[key] += (s.end - s.start) / 1e3
        count_by[key] += 1
        waits[s.waited_on] += 1
    rows = [(e, n, count_by[(e, n)], us) for (e, n), us in time_by.most_common()]
    return rows, dict(waits)
