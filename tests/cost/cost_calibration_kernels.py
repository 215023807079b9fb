"""Calibration kernels written from the public NKI docs (matmul tutorial idioms), for tests/cost.

``matmul_staged``: ``result[M, N] = lhsT[K, M].T @ rhs[K, N]`` that stages both operands in SBUF
once (one [128, M] and one [128, N] tile per 128-deep K slice, loaded in K order so the first
matmuls can start while later slices stream in), then keeps TensorE fed: for every 128-row
output block and 512-column PSUM bank, 16 back-to-back accumulating matmuls, a VectorE eviction
(PSUM fp32 -> SBUF bf16) and one store per 128-row block. LNC=1. Limits: K, M multiples of 128,
N a multiple of 512, and both operands must fit in SBUF (2048^3 bf16 uses 128 KiB per partition).

``matmul_streamed``: the same staging, with the loop order of the hand-tuned kernels: K slices
stream in while TensorE works on two 128-row output blocks at once, with K as the outer loop over
all 8 PSUM banks (2 row blocks x 4 column banks), so the first matmuls need only the first K slice.
The 8 accumulators are allocated once and reused for every pair of row blocks, as a real
allocation of all 8 banks would be (so eviction -> next matmul is a real dependency).
``matmul_staged`` also reuses its PSUM: two banks, alternating (double-buffered PSUM).

``dma_one_tile``: a single HBM -> SBUF dma_copy of the whole input (then a store back so the
kernel has an output), for the DMA calibration point.
"""

import nki
import nki.isa as nisa
import nki.language as nl

TILE_K = nl.tile_size.pmax                  # 128
TILE_M = nl.tile_size.gemm_stationary_fmax  # 128
TILE_N = nl.tile_size.gemm_moving_fmax      # 512


def _stage_k_slices(lhsT, rhs):
    """Both operands into SBUF once, one [128, M] and one [128, N] tile per 128-deep K slice, in K order
    (so the first matmuls can start while later slices stream in). Inlined into the kernels at trace time."""
    lhsT_sb, rhs_sb = [], []
    for k in range(lhsT.shape[0] // TILE_K):
        a = nl.ndarray((TILE_K, lhsT.shape[1]), dtype=lhsT.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=lhsT[k * TILE_K:(k + 1) * TILE_K, :])
        b = nl.ndarray((TILE_K, rhs.shape[1]), dtype=rhs.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=b, src=rhs[k * TILE_K:(k + 1) * TILE_K, :])
        lhsT_sb.append(a)
        rhs_sb.append(b)
    return lhsT_sb, rhs_sb


@nki.jit
def matmul_staged(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    lhsT_sb, rhs_sb = _stage_k_slices(lhsT, rhs)
    banks = [nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum) for _ in range(2)]
    for m in range(M // TILE_M):
        row = nl.ndarray((TILE_M, N), dtype=result.dtype, buffer=nl.sbuf)
        for n in range(N // TILE_N):
            acc = banks[(m * (N // TILE_N) + n) % 2]
            for k in range(K // TILE_K):
                nisa.nc_matmul(dst=acc, stationary=lhsT_sb[k][:, m * TILE_M:(m + 1) * TILE_M],
                               moving=rhs_sb[k][:, n * TILE_N:(n + 1) * TILE_N], accumulate=(k > 0))
            nisa.tensor_copy(dst=row[:, n * TILE_N:(n + 1) * TILE_N], src=acc)
        nisa.dma_copy(dst=result[m * TILE_M:(m + 1) * TILE_M, :], src=row)
    return result


@nki.jit
def matmul_streamed(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    lhsT_sb, rhs_sb = _stage_k_slices(lhsT, rhs)
    n_banks = N // TILE_N
    blocks = 8 // n_banks                      # row blocks that fit in the 8 PSUM banks at once
    acc = [[nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum) for _ in range(n_banks)]
           for _ in range(blocks)]
    for m0 in range(0, M // TILE_M, blocks):
        for k in range(K // TILE_K):
            for i in range(blocks):
                m = m0 + i
                for n in range(n_banks):
                    nisa.nc_matmul(dst=acc[i][n], stationary=lhsT_sb[k][:, m * TILE_M:(m + 1) * TILE_M],
                                   moving=rhs_sb[k][:, n * TILE_N:(n + 1) * TILE_N], accumulate=(k > 0))
        for i in range(blocks):
            m = m0 + i
            row = nl.ndarray((TILE_M, N), dtype=result.dtype, buffer=nl.sbuf)
            for n in range(n_banks):          # evictions alternate VectorE / ScalarE to halve the drain
                nisa.tensor_copy(dst=row[:, n * TILE_N:(n + 1) * TILE_N], src=acc[i][n],
                                 engine=nisa.engine.vector if n % 2 == 0 else nisa.engine.scalar)
            nisa.dma_copy(dst=result[m * TILE_M:(m + 1) * TILE_M, :], src=row)
    return result


@nki.jit
def dma_one_tile(x):
    tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=tile)
    return out
