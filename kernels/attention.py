"""Fused scaled-dot-product attention forward for Trainium (NKI 0.6): ``attention_fwd``.

    out = softmax(scale * q @ k^T + mask [+ causal]) @ v          (per batch, per query head)

Layouts: ``"bhsd"`` q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D); ``"bshd"`` q (B, Sq, Hq, D), k/v
(B, Sk, Hkv, D), the contiguous projection output of Transformers, read in place. q, k, v share
one dtype (bfloat16, float16, float32); the output has q's layout, shape and dtype. Grouped-query
attention: query head h reads kv head h // (Hq // Hkv). ``mask`` is an optional float32 additive
mask (Bm, Hm, Sq, Sk) with Bm in {1, B}, Hm in {1, Hq} (may hold -inf); ``is_causal`` is SDPA's
top-left aligned causal mask (query i sees keys j <= i) and combines with ``mask``.
``return_lse=True`` also returns lse (B, Hq, Sq) float32, the natural-log log-sum-exp of the
scaled, masked scores (for a backward kernel).

LNC: ``attention_fwd[2]`` (two physical NeuronCores per logical core, trn2's default runtime
configuration) gives each program a contiguous half (rounded up) of the (batch, kv-head group)
work items, in loop order, writing into the shared output; the kv-head group size is chosen so that
the items split evenly when possible (ViT-L at batch 1: two groups of 8 heads).

Algorithm (one pass; nothing but q, k, v, mask and the outputs touches HBM). Two schedules:

Transposed softmax (16-bit inputs, no mask, not causal, Sk <= 1536, D < 128, trn2+; every plain
vision-transformer call). Scores are computed a second time already transposed, so the
exponential writes P^T straight into SBUF for the PV matmul and P never goes through TensorE
transposes and PSUM evictions:

    for b in batch, kv-head group (K and V resident), query block of Q_BLOCK = 384 tokens:
      K_aug^T = [K^T; 1], Q_aug^T = [Q^T; -m]   D + 1 rows, DMA transposes (row D: ones / later -m)
      for each unit of UNIT_MIN_HEADS+ query heads (3 for ViT-B), software-pipelined over 4 stages:
        1. S = Q K^T per 128-query tile     TensorE -> PSUM (unscaled)
           -m = -rowmax(S)                  VectorE, one reduction per tile for the unit's heads,
                                            rounded to the input dtype (rowmin for scale < 0)
        2. -m as a row                      TensorE transpose, one PSUM copy, one DMA into row D
        3. S^T - m = K_aug Q_aug^T          TensorE, contraction D + 1, per 128-key chunk
           P^T = exp(scale (S^T - m))       ScalarE, PSUM -> SBUF, the unit's heads in one instruction
        4. [O | l] = P [V | 1]              TensorE; the ones column of V yields the row sums l
           copy [O | l] out of PSUM         VectorE or ScalarE, whichever has less work booked
           out = O * (1 / l)                once per query tile for all heads: ScalarE 1/l, GpSimd multiply
                                            (in the program's last block per head group, a shorter tail)
      store each output tile (all heads, one DMA); lse = scale * m + ln(l), a few steps later
    Any stabiliser close to the row max gives the same softmax, so m needs no more precision than
    the input dtype; lse uses the m that was actually subtracted.

Row-tile softmax (everything else: masks, causal, fp32, long key ranges, D >= 128, trn1):

    for b in batch:
      for kv-head group (as many kv heads as keep K^T and V resident within KV_RESIDENT_BYTES):
        K^T (D on partitions) by one DMA transpose for all heads; V (+ a ones column) resident
        for each query tile of Q_TILE = 128 tokens:
          Q^T by DMA transpose (all heads of the group), times `scale` on GpSimd
          for each group of query heads sharing one PSUM score tile (6 for ViT-B):
            S    = Q K^T                  TensorE: 512-key matmuls into fp32 PSUM (two 64-dim
                                          heads run side by side on PE row tiles)
            S   += mask, causal triangle  VectorE, in place in PSUM (only the diagonal key tile)
            m    = rowmax(S)              VectorE, one reduction for the whole head group
            P    = exp(S - m)             ScalarE, bias = -m fused into the activation
            P^T  128x128 transposes       TensorE -> PSUM, one eviction per PSUM bank on ScalarE
                                          or VectorE, whichever has less work booked so far
            [O | l] = P^T.T @ [V | 1]     TensorE; the ones column of V yields the row sums l
            out  = O * (1 / l)            one VectorE op for the group, PSUM -> SBUF
          store the output tile (all heads, one DMA); lse = m + ln(l) for all heads at once

The (query tile, head group) items are software-pipelined three deep (``_pipeline``), so that
TensorE, VectorE and ScalarE work on different items at the same time. When the keys of a query
tile fit one block (Sk <= KV_BLOCK = 2048: every vision model) the softmax is a plain full-row
softmax; longer key ranges use the online (flash) update over blocks, one head at a time, O and
l rescaled by exp(m_old - m_new). Statistics (max, sum, lse) are fp32; scale*Q and P are
rounded to the input dtype for the matmuls, which accumulate in fp32.

Tiles: Q_TILE = K_CHUNK = nl.tile_size.pmax (128); SCORE_COLS = nl.tile_size.gemm_moving_fmax
(512) keys per QK^T matmul = one 2 KiB PSUM bank of fp32; a head group's scores take up to
SCORE_TILE_BYTES (3 banks), heads packed densely, matmuls cut at bank boundaries; head dims above 128 split
the QK^T contraction into 128-row chunks (PV keeps D + 1 <= 257 output columns in one matmul,
N <= 512). In "bshd" with D dividing 128 (or a multiple of it) and no GQA, heads are
DMA-transposed together, 128 partitions at a time: two 64-dim heads share a [128, tokens] tile
(partitions 0-63 and 64-127). trn1 has no DMA transpose: there K and Q go through TensorE
transposes instead.

Cost-model estimates (nkisim.cost, trn2, bf16; roofline = max(FLOPs at 79 TFLOPS, q/k/v/o bytes
at 362 GB/s per NeuronCore)), transposed softmax (row-tile softmax, the previous schedule, in brackets):
ViT-B/16 (B=8, 197 tokens, 12 heads, D=64, "bshd") 56.0 us (68.4), 61.0 us with lse (72.5), vs a
26.7 us roofline (batch 1: 15.0 us vs 3.3); "bhsd" 98.1 us (108.6: per-head DMA transposes bound it);
ViT-L/14@336 (B=1) 73.4 us (87.8) vs 17.5; SigLIP-so400m (B=1) 109.4 us (142.6) vs 31; CLIP-B/32
(B=8, 50 tokens) 21.9 us (25.9). ``attention_fwd[2]`` (two cores, against the two-core roofline,
13.4 us for ViT-B/16): ViT-B/16 33.0 us (batch 1: 10.8 us), ViT-L/14@336 41.1 us, SigLIP 60.7 us.
What limits ViT-B/16 (engine busy: TensorE 45, VectorE 46, ScalarE 47, GpSimdE 33, DMA 33 us): only
VectorE and ScalarE read PSUM, one cycle per element per partition, and every score passes both
once, the row max on VectorE (39.4 us at 0.96 GHz) and the exp on ScalarE (31.5 us at 1.2 GHz),
the 69-row tail tile of 197 tokens costing as much as a full one; evicting [O | l] from PSUM adds
~10 us and the -m rows ~5 us, shared between the two. Packing the tails of four heads into shared
tiles on PE column tiles (64- and 32-slot pieces: 1.75 tiles per 197-token head instead of 2, dead
key slots zeroed by an exp bias) was built and measured (not kept): the row max fell to 34.5 us and
the exp to 27.6 us as planned, but the shifted V copies it needs (+5 us of DMA, +5 us of GpSimd) and
the extra small matmuls left every engine at 41-50 us busy and the estimate at 61-63 us. Reaching
the 40 us that 1.5x of the roofline allows on one core would need VectorE, ScalarE, TensorE, GpSimd
and DMA each at ~35 us with almost perfect overlap.

Limits (asserted at trace time): 32 <= D <= 256; Hq % Hkv == 0; finite scale; one kv head's K^T
and V must fit KV_RESIDENT_BYTES per partition (16-bit dtypes: Sk up to ~16K keys for D <= 128,
~8K for D = 256; half that in fp32; ``kv_fits`` answers it for callers in advance); rows that the
mask hides completely are undefined (as in flash attention).

Modules: this file holds the entry point, the input checks, the limits and the dispatch;
``attention_transposed.py`` the transposed-softmax schedule, ``attention_rows.py`` the row-tile
schedule (masks, causal, online softmax), ``attention_tiles.py`` the tile sizes, loads, the lse
queue and the engine balancing both schedules share.
"""

import math

import nki
import nki.isa as nisa
import nki.language as nl

from . import attention_rows, attention_transposed
from .attention_tiles import D_CHUNK, K_CHUNK, KV_BLOCK, P_MAX, Q_TILE, _itemsize, _transpose_plan

MIN_HEAD_DIM, MAX_HEAD_DIM = 32, 256
KV_RESIDENT_BYTES = 96 * 1024                   # SBUF bytes per partition for resident K^T and V
SUPPORTED_DTYPES = (nl.bfloat16, nl.float16, nl.float32)
LAYOUTS = ("bhsd", "bshd")
# Tile sizes (attention_tiles.py), re-exported here with the limits: Q_TILE = K_CHUNK = D_CHUNK = P_MAX
# (128), KV_BLOCK (2048) keys per softmax block (longer key ranges take the online softmax).
__all__ = ["attention_fwd", "kv_fits", "MIN_HEAD_DIM", "MAX_HEAD_DIM", "KV_RESIDENT_BYTES", "SUPPORTED_DTYPES",
           "LAYOUTS", "Q_TILE", "K_CHUNK", "D_CHUNK", "KV_BLOCK"]


@nki.jit
def attention_fwd(q, k, v, mask=None, scale=1.0, is_causal=False, layout="bhsd", return_lse=False):
    B, Hq, Hkv, Sq, Sk, D = _check_inputs(q, k, v, mask, scale, layout)
    dtype = q.dtype
    rep = Hq // Hkv
    out = nl.ndarray(q.shape, dtype=dtype, buffer=nl.shared_hbm)
    lse = nl.ndarray((B, Hq, Sq), dtype=nl.float32, buffer=nl.shared_hbm) if return_lse else None
    n_shards, shard = nl.num_programs(0), nl.program_id(0)
    kv_group = _kv_group_size(Hkv, Sk, D, _itemsize(dtype), B, n_shards)
    q_group = kv_group * rep
    groups = _shard_groups(B, Hkv, kv_group, n_shards, shard)
    flat = (layout == "bshd" and rep == 1 and (P_MAX % D == 0 or D % P_MAX == 0)
            and (kv_group * D) % P_MAX == 0)
    k_units, k_chunks = _transpose_plan(kv_group, D, flat)
    q_units, q_chunks = _transpose_plan(q_group, D, flat)
    use_dma_transpose = nisa.get_nc_version() >= nisa.nc_version.gen3     # trn2+

    causal_bias = attention_rows.causal_bias_tile() if is_causal else None

    ctx = {"q": q, "k": k, "v": v, "mask": mask, "scale": float(scale), "layout": layout, "dtype": dtype, "D": D,
           "Sk": Sk, "rep": rep, "flat": flat, "kv_group": kv_group, "q_group": q_group, "k_units": k_units,
           "k_chunks": k_chunks, "q_units": q_units, "q_chunks": q_chunks, "causal_bias": causal_bias,
           "use_dma_transpose": use_dma_transpose, "groups": groups, "out": out, "lse": lse, "lse_pending": [],
           "step": 0,
           "engine_ns": {"vector": 0.0, "scalar": 0.0}}

    if attention_transposed.use_transposed_softmax(ctx, mask, is_causal, Sk):
        attention_transposed.attend_transposed(ctx, Sq)
    else:
        attention_rows.attend_rows(ctx, Sq, is_causal)
    if return_lse:
        return out, lse
    return out


# ---- limits and planning (trace time) -------------------------------------------------------------

def kv_fits(kv_len, head_dim, itemsize):
    """True when ``kv_len`` keys of ``head_dim`` fit the kernel's SBUF budget for one kv head's resident
    K^T and V (``itemsize``: bytes per element of q/k/v, 2 for bfloat16/float16, 4 for float32).

    This is exactly the check ``attention_fwd`` asserts at trace time: callers use it to route longer
    key sequences elsewhere (e.g. to a reference implementation) instead of hitting the assert."""
    return _resident_bytes(1, kv_len, head_dim, itemsize) <= KV_RESIDENT_BYTES


def _check_inputs(q, k, v, mask, scale, layout):
    assert layout in LAYOUTS, f"attention_fwd: layout={layout!r}, expected one of {LAYOUTS}"
    assert len(q.shape) == 4 and len(k.shape) == 4 and len(v.shape) == 4, \
        f"attention_fwd: q, k, v must be 4-D, got {q.shape}, {k.shape}, {v.shape}"
    if layout == "bshd":
        (B, Sq, Hq, D), (Bk, Sk, Hkv, Dk) = q.shape, k.shape
    else:
        (B, Hq, Sq, D), (Bk, Hkv, Sk, Dk) = q.shape, k.shape
    assert tuple(v.shape) == tuple(k.shape), f"attention_fwd: v shape {v.shape} must equal k shape {k.shape}"
    assert Bk == B and Dk == D, f"attention_fwd: k {k.shape} does not match q {q.shape} in batch or head dim"
    assert MIN_HEAD_DIM <= D <= MAX_HEAD_DIM, \
        f"attention_fwd: head dim D={D} outside the supported {MIN_HEAD_DIM}..{MAX_HEAD_DIM} (MAX_HEAD_DIM)"
    assert Hkv >= 1 and Hq % Hkv == 0, \
        f"attention_fwd: query heads Hq={Hq} must be a multiple of key/value heads Hkv={Hkv} (Hq % Hkv == 0)"
    assert Sq >= 1 and Sk >= 1, f"attention_fwd: empty sequence (Sq={Sq}, Sk={Sk})"
    assert q.dtype in SUPPORTED_DTYPES, f"attention_fwd: dtype {q.dtype} not supported (bfloat16, float16, float32)"
    assert k.dtype == q.dtype and v.dtype == q.dtype, \
        f"attention_fwd: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
    assert isinstance(scale, (int, float)) and not isinstance(scale, bool) and math.isfinite(scale), \
        f"attention_fwd: scale must be a finite Python float, got {scale!r}"
    if mask is not None:
        assert mask.dtype == nl.float32, f"attention_fwd: mask must be float32, got {mask.dtype}"
        assert len(mask.shape) == 4 and mask.shape[0] in (1, B) and mask.shape[1] in (1, Hq) \
            and tuple(mask.shape[2:]) == (Sq, Sk), \
            f"attention_fwd: mask shape {mask.shape} must be (1 or {B}, 1 or {Hq}, {Sq}, {Sk})"
    resident = _resident_bytes(1, Sk, D, _itemsize(q.dtype))
    assert kv_fits(Sk, D, _itemsize(q.dtype)), \
        f"attention_fwd: Sk={Sk} keys of head dim {D} need {resident} B per partition for one kv head's " \
        f"resident K^T and V, above KV_RESIDENT_BYTES={KV_RESIDENT_BYTES}; split the key sequence"
    return B, Hq, Hkv, Sq, Sk, D


def _resident_bytes(n_heads, Sk, D, itemsize):
    """SBUF bytes per partition of resident K^T and V (+ ones column) for n_heads kv heads."""
    return n_heads * (math.ceil(D / D_CHUNK) * Sk + math.ceil(Sk / K_CHUNK) * (2 * D + 1)) * itemsize


def _kv_group_size(Hkv, Sk, D, itemsize, B=1, n_shards=1):
    """The most kv heads (a divisor of Hkv) whose K^T and V stay resident within the budget and,
    with LNC=2, whose (batch, group) work items split evenly across the programs when any does
    (else that give every program at least one item when any does)."""
    fitting = [g for g in range(Hkv, 0, -1)
               if Hkv % g == 0 and _resident_bytes(g, Sk, D, itemsize) <= KV_RESIDENT_BYTES]
    if not fitting:
        return 1
    even = [g for g in fitting if (B * (Hkv // g)) % n_shards == 0]
    enough = [g for g in fitting if B * (Hkv // g) >= n_shards]
    return (even or enough or fitting)[0]


def _shard_groups(B, Hkv, kv_group, n_shards, shard):
    """This program's (batch, first kv head) work items: the loop order of all items, cut into
    ``n_shards`` contiguous runs of ceil(items / n_shards) (an LNC=2 launch gives each physical core
    one run; with an odd item count the second program has one item fewer)."""
    items = [(b, g0) for b in range(B) for g0 in range(0, Hkv, kv_group)]
    per = math.ceil(len(items) / n_shards)
    return items[shard * per:(shard + 1) * per]
