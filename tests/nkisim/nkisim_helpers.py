"""Helpers for the nkisim tests (a uniquely named module, so test files never import another
directory's ``conftest``): ``import nki`` resolves to nkisim, and ``run_tile`` runs a small kernel
body on SBUF tiles loaded from NumPy arrays and returns the stored results."""

import ml_dtypes
import numpy as np

import nkisim

nkisim.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

BF16 = ml_dtypes.bfloat16


def run_tile(body, *arrays, out_shapes, out_dtypes=None, **consts):
    """Simulate a kernel that DMAs each input to an SBUF tile, calls ``body(*tiles, **consts)``,
    which returns SBUF tiles, and DMAs those to shared_hbm outputs (returned as NumPy arrays)."""
    out_dtypes = out_dtypes or [np.float32] * len(out_shapes)

    def kernel(*ins):
        tiles = []
        for a in ins:
            t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a)
            tiles.append(t)
        results = body(*tiles, **consts)
        results = results if isinstance(results, (tuple, list)) else (results,)
        outs = []
        for r, shape, dtype in zip(results, out_shapes, out_dtypes):
            o = nl.ndarray(shape, dtype=dtype, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=o, src=r)
            outs.append(o)
        return tuple(outs)

    outs = nki.simulate(kernel)(*arrays)
    return outs[0] if len(outs) == 1 else outs
