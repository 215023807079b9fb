"""Tiled matmul ``result[M, N] = lhsT[K, M].T @ rhs[K, N]`` (the docs' ``nki_matmul_tiled_`` idiom).

Loop m over 128-row output tiles, n over 512-column tiles (one PSUM bank of fp32), k over
128-deep contraction tiles accumulating in PSUM; evict with ``tensor_copy`` (casting to the
output dtype) and DMA to HBM. Shapes must be multiples of the tiles.
"""

import nki
import nki.isa as nisa
import nki.language as nl

TILE_K = nl.tile_size.pmax                  # 128: contraction on the partition dim
TILE_M = nl.tile_size.gemm_stationary_fmax  # 128
TILE_N = nl.tile_size.gemm_moving_fmax      # 512


@nki.jit
def matmul_tiled(lhsT, rhs):
    K, M = lhsT.shape
    K2, N = rhs.shape
    assert K == K2, f"contraction dims differ: {K} vs {K2}"
    assert K % TILE_K == 0 and M % TILE_M == 0 and N % TILE_N == 0, "shapes must be multiples of (128, 128, 512)"
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in range(M // TILE_M):
        for n in range(N // TILE_N):
            res_psum = nl.ndarray((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in range(K // TILE_K):
                lhsT_tile = nl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=lhsT_tile, src=lhsT[k * TILE_K:(k + 1) * TILE_K, m * TILE_M:(m + 1) * TILE_M])
                rhs_tile = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=rhs_tile, src=rhs[k * TILE_K:(k + 1) * TILE_K, n * TILE_N:(n + 1) * TILE_N])
                nisa.nc_matmul(dst=res_psum, stationary=lhsT_tile, moving=rhs_tile)
            res_sb = nl.ndarray((TILE_M, TILE_N), dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res_sb, src=res_psum)
            nisa.dma_copy(dst=result[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N], src=res_sb)
    return result
