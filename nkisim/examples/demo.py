"""Demo: run an NKI kernel through nkisim and check it against NumPy.

Grows with the project: the attention kernel and the Hub artifact join it as they land.
"""

import time

import ml_dtypes
import numpy as np

import nkisim


def main() -> None:
    nkisim.install()
    from nkisim.examples.matmul import matmul_tiled

    rng = np.random.default_rng(0)
    lhsT = rng.standard_normal((1024, 1024)).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((1024, 1024)).astype(ml_dtypes.bfloat16)
    start = time.perf_counter()
    with nkisim.trace() as t:
        out = nkisim.simulate(matmul_tiled)(lhsT, rhs)
    elapsed = time.perf_counter() - start
    ref = lhsT.astype(np.float32).T @ rhs.astype(np.float32)
    err = np.abs(out.astype(np.float32) - ref).max() / np.abs(ref).max()
    print(f"matmul_tiled 1024x1024x1024 bf16 through nkisim: {len(t)} instructions "
          f"({t.count('nc_matmul')} nc_matmul, {t.count('dma_copy')} dma_copy) in {elapsed:.2f} s CPU; "
          f"max relative error vs NumPy {err:.2e} (bf16 output rounding)")


if __name__ == "__main__":
    main()
