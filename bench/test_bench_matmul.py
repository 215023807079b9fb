"""The nkisim matmul example (nkisim/examples/matmul.py), 1024^3 bf16: eager torch.matmul on CPU,
the nkisim run (one round), and the cost-model ESTIMATE of its trace on trn1/trn2/trn3. It reloads
both tiles from HBM for every matmul, so expect a DMA-bound estimate far from the roofline."""

from __future__ import annotations

import time

import ml_dtypes
import numpy as np
import torch

import nkisim
from estimates import record_nkisim_run

SIZE = 1024
CASE = f"matmul {SIZE}^3 bf16"


def operands():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((SIZE, SIZE)).astype(ml_dtypes.bfloat16),
            rng.standard_normal((SIZE, SIZE)).astype(ml_dtypes.bfloat16))


def test_eager_matmul_cpu(benchmark, collector):
    lhsT, rhs = (torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16) for x in operands())
    benchmark.group = CASE
    benchmark(lambda: lhsT.T @ rhs)
    collector.add_cpu(CASE, eager_cpu_us=benchmark.stats.stats.mean * 1e6)


def test_nkisim_matmul_example(benchmark, collector, progress):
    nkisim.install()
    from nkisim.examples.matmul import matmul_tiled
    lhsT, rhs = operands()
    traces = []

    def run():
        with nkisim.trace() as t:
            out = nkisim.simulate(matmul_tiled)(lhsT, rhs)
        traces.append(t)
        return out

    benchmark.group = CASE
    start = time.perf_counter()
    out = benchmark.pedantic(run, rounds=1, iterations=1)
    elapsed = time.perf_counter() - start
    ref = lhsT.astype(np.float32).T @ rhs.astype(np.float32)
    # bf16 output: one rounding of the fp32 accumulation (2^-8 relative to the largest value).
    assert np.abs(out.astype(np.float32) - ref).max() <= 2 ** -8 * np.abs(ref).max()
    record_nkisim_run(benchmark, collector, progress, traces[-1], "matmul_tiled", CASE, 2 * SIZE ** 3,
                      3 * SIZE * SIZE * 2, elapsed)
