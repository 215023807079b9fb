"""nkisim.cost: estimated Trainium time of a traced kernel (trn1 / trn2 / trn3).

    with nkisim.trace() as t:
        kernel(a, b)
    p = t.estimate("trn2")                      # Profile
    out, p = nkisim.profile(kernel, target="trn2")(a, b)
    print(p.summary())

How: per-instruction engine cycles from the published formulas (``engines``), DMA transfers as a
fixed latency plus bytes over the engines they span (``dma``), then a list schedule with every
engine in program order, read/write dependencies through memory and SBUF/PSUM capacity over time
(``schedule``, ``memory``); the estimate is the schedule's makespan, with engine busy times,
MFU, roofline and critical path (``profile``).
Every constant and its source is in ``constants``. Results are estimates, not measurements; the
calibration tests in tests/cost state how far they land from the public measured points.

Known limits of the model:
* it knows nothing the published formulas do not say: no HBM page/bank effects, no
  instruction-fetch or semaphore-bookkeeping stalls beyond the documented ~100-cycle overhead;
* every engine keeps the kernel's program order (no compiler reordering), so independent work
  written after a dependent chain waits behind it, as the instruction streams do;
* memory reuse is modelled by capacity only (``memory``): an allocation waits for room in SBUF or
  PSUM, not for a particular earlier buffer (no bank/address conflicts, no fragmentation);
* DMA issue order is program order within three queues (loads, stores, other copies);
  indirect (gather/scatter) DMAs are priced like dense ones with the row size as chunk.
"""

from __future__ import annotations

import os
from collections import Counter

from . import constants
from .profile import Profile, Roofline, roofline, summarize_path

__all__ = ["estimate", "profile", "Profile", "Roofline", "roofline", "constants"]


def estimate(instructions, target: str = "trn2") -> Profile:
    """Estimate the time of ``instructions`` (a trace) on ``target``; LNC programs run in parallel
    on separate cores, so the time is the slowest program's makespan."""
    from . import dma as dma_mod
    from . import engines
    from .profile import _target_name
    from .schedule import critical_path, schedule_program

    name = _target_name(target)
    cost = constants.TARGETS[name]
    instructions = list(instructions)
    programs: dict = {}
    for instr in instructions:
        programs.setdefault(instr.program_id, []).append(instr)
    schedules = {pid: schedule_program(instrs, cost) for pid, instrs in sorted(programs.items())}
    if schedules:
        slowest = max(schedules.values(), key=lambda s: s.makespan)
        time_ns = slowest.makespan
        lanes = list(dict.fromkeys(["tensor", "vector", "scalar", "gpsimd", "dma"]
                                   + [e for s in schedules.values() for e in s.busy]))
        busy = {e: max(s.busy.get(e, 0.0) for s in schedules.values()) / 1e3 for e in lanes}
        path, waits = summarize_path(critical_path(slowest))
    else:
        time_ns, busy, path, waits = 0.0, {e: 0.0 for e in ("tensor", "vector", "scalar", "gpsimd", "dma")}, [], {}
    unknown: Counter = Counter()
    for s in schedules.values():
        unknown.update(s.unknown)

    flops_by_dtype: Counter = Counter()
    hbm = 0
    for instr in instructions:
        if instr.engine == "tensor":
            f = engines.matmul_flops(instr)
            if f:
                flops_by_dtype[instr.attrs.get("dtype", "bfloat16")] += f
        elif instr.engine == "dma":
            hbm += dma_mod.hbm_bytes(instr)
    flops = sum(flops_by_dtype.values())
    matmul_dtype = flops_by_dtype.most_common(1)[0][0] if flops_by_dtype else "bfloat16"
    cores = max(1, len(schedules))
    return Profile(target=name, time_us=time_ns / 1e3, engine_busy_us=busy, flops=flops, hbm_bytes=hbm,
                   matmul_dtype=matmul_dtype, cores=cores, instructions=len(instructions),
                   roofline=roofline(flops, hbm, name, matmul_dtype, cores), critical_path=path,
                   critical_waits=waits, unknown_instructions=dict(unknown))


def profile(kernel, target: str = "trn2"):
    """``nkisim.profile(kernel, target)(*args, **kwargs) -> (outputs, Profile)``: run the kernel in
    nkisim for ``target`` (its checks and limits apply) and estimate the recorded trace there."""
    from ..jit import simulate
    from ..target import ENV_VAR
    from ..trace import trace
    from .profile import _target_name

    name = _target_name(target)

    def run(*args, **kwargs):
        previous = os.environ.get(ENV_VAR)
        os.environ[ENV_VAR] = name
        try:
            with trace() as t:
                outputs = simulate(kernel)(*args, **kwargs)
        finally:
            if previous is None:
                os.environ.pop(ENV_VAR, None)
            else:
                os.environ[ENV_VAR] = previous
        return outputs, t.estimate(name)
    return run
