"""Interpreter cost of nkisim: the 1024x1024x1024 bf16 tiled matmul (nkisim/examples/matmul.py).

Not a timed test: pytest-benchmark reports the wall time of one simulation (the target is < 2 s per
run on one core; 8 x 2 x 8 = 128 nc_matmul, 256 input DMAs). The result is checked once so a fast
but wrong interpreter cannot pass. Run: .venv/bin/python -m pytest bench/test_nkisim_speed.py
"""

import ml_dtypes
import numpy as np

import nkisim

nkisim.install()

from nkisim.examples.matmul import matmul_tiled  # noqa: E402

SIZE = 1024


def test_tiled_matmul_1024_bf16(benchmark):
    rng = np.random.default_rng(0)
    lhsT = rng.standard_normal((SIZE, SIZE)).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((SIZE, SIZE)).astype(ml_dtypes.bfloat16)
    out = benchmark.pedantic(nkisim.simulate(matmul_tiled), args=(lhsT, rhs), rounds=3, iterations=1)
    ref = lhsT.astype(np.float32).T @ rhs.astype(np.float32)
    # bf16 output: one rounding of the fp32 accumulation (relative 2^-8)
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=2 ** -8, atol=1e-2)
