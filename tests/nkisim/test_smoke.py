import ml_dtypes
import numpy as np

import nkisim


def test_tiled_matmul_matches_numpy():
    nkisim.install()
    from nkisim.examples.matmul import matmul_tiled
    rng = np.random.default_rng(1)
    lhsT = rng.standard_normal((256, 128)).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((256, 512)).astype(ml_dtypes.bfloat16)
    with nkisim.trace() as t:
        out = nkisim.simulate(matmul_tiled)(lhsT, rhs)
    ref = lhsT.astype(np.float32).T @ rhs.astype(np.float32)
    # bf16 output: one rounding of an fp32 accumulation, relative error <= 2^-8.
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=2 ** -8, atol=1e-3)
    assert t.count("nc_matmul") == 2
