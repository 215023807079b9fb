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
at 362 GB/s)), transposed softmax (row-tile softmax, the previous schedule, in brackets):
ViT-B/16 (B=8, 197 tokens, 12 heads, D=64, "bshd") 58.0 us (68.4), 62.0 us with lse (72.5), vs a
26.7 us roofline; "bhsd" 98.9 us (108.6: per-head DMA transposes bound it); ViT-L/14@336 (B=1)
78.9 us (87.8) vs 17.5; SigLIP-so400m (B=1) 111.3 us (142.6) vs 31; CLIP-B/32 (B=8, 50 tokens)
22.4 us (25.9). ViT-B/16 engine busy: TensorE 45, VectorE 46, ScalarE 47, GpSimdE 35, DMA 33 us
(was 42 / 59 / 58 / 20 / 33). What remains: the row max (VectorE, ~40 us) and the exp (ScalarE,
~32 us) cost one cycle per score row element whether a tile holds 128 or 69 queries/keys, and
TensorE now computes the scores twice (S for the max, S^T for P).

Limits (asserted at trace time): 32 <= D <= 256; Hq % Hkv == 0; finite scale; one kv head's K^T
and V must fit KV_RESIDENT_BYTES per partition (16-bit dtypes: Sk up to ~16K keys for D <= 128,
~8K for D = 256; half that in fp32); rows that the mask hides completely are undefined (as in
flash attention).
"""

import math

import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = nl.tile_size.pmax                       # 128 partitions
Q_TILE = P_MAX                                  # query rows per tile (partition dim of S, O)
K_CHUNK = P_MAX                                 # keys per P^T transpose / PV contraction step
D_CHUNK = P_MAX                                 # contraction rows per QK^T matmul
SCORE_COLS = nl.tile_size.gemm_moving_fmax      # 512 keys per QK^T matmul = one PSUM bank of fp32
KV_BLOCK = 4 * SCORE_COLS                       # 2048 keys softmaxed at once (4 PSUM banks)
PSUM_BANK_BYTES = nl.tile_size.psum_bank_fmax_bytes   # 2048
SCORE_TILE_BYTES = 3 * PSUM_BANK_BYTES          # fp32 scores of one head group
MAX_GROUP_HEADS = 8                             # query heads per score tile
ENGINE_GHZ = {"vector": 0.96, "scalar": 1.2}      # trn2 clocks (nki-reference 3), to balance evictions
TINY_INSTRUCTION_CYCLES = 164                   # an instruction on a few elements: 64-cycle minimum + ~100 fixed
LSE_DELAY_STEPS = 2                             # pipeline steps between a tile's store and its lse
MIN_HEAD_DIM, MAX_HEAD_DIM = 32, 256
Q_BLOCK = 3 * Q_TILE                            # transposed path: queries per S^T matmul (its moving side)
ST_BANKS = 2                                    # transposed path: PSUM banks of a unit's S^T per key chunk
LSE_DELAY_UNITS = 4                             # transposed path: steps between a tile's store and its lse
EXP_LAG = 1                                     # transposed path: steps between the -m row DMA and S^T
UNIT_MIN_HEADS = 3                              # transposed path: heads per pipeline unit, at least ...
UNIT_SCORES = 3 * 197 * 197                     # ... and enough for ~116K scores (3 ViT-B heads): the
                                                # unit size that overlaps the stages best (cost model)
KV_RESIDENT_BYTES = 96 * 1024                   # SBUF bytes per partition for resident K^T and V
MASKED_SCORE = -3.0e38                          # additive causal mask value (finite; exp() -> 0)
SUPPORTED_DTYPES = (nl.bfloat16, nl.float16, nl.float32)
LAYOUTS = ("bhsd", "bshd")


@nki.jit
def attention_fwd(q, k, v, mask=None, scale=1.0, is_causal=False, layout="bhsd", return_lse=False):
    B, Hq, Hkv, Sq, Sk, D = _check_inputs(q, k, v, mask, scale, layout)
    dtype = q.dtype
    rep = Hq // Hkv
    out = nl.ndarray(q.shape, dtype=dtype, buffer=nl.shared_hbm)
    lse = nl.ndarray((B, Hq, Sq), dtype=nl.float32, buffer=nl.shared_hbm) if return_lse else None
    kv_group = _kv_group_size(Hkv, Sk, D, _itemsize(dtype))
    q_group = kv_group * rep
    flat = (layout == "bshd" and rep == 1 and (P_MAX % D == 0 or D % P_MAX == 0)
            and (kv_group * D) % P_MAX == 0)
    k_units, k_chunks = _transpose_plan(kv_group, D, flat)
    q_units, q_chunks = _transpose_plan(q_group, D, flat)
    use_dma_transpose = nisa.get_nc_version() >= nisa.nc_version.gen3     # trn2+

    causal_bias = None
    if is_causal:
        # causal_bias[p, j] = 0 where key j <= query p, else MASKED_SCORE: added to the diagonal
        # key tile of every query tile (key tiles above the diagonal are skipped).
        zeros = nl.ndarray((Q_TILE, K_CHUNK), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=zeros, value=0.0)
        causal_bias = nl.ndarray((Q_TILE, K_CHUNK), dtype=nl.float32, buffer=nl.sbuf)
        nisa.affine_select(dst=causal_bias, pattern=[[-1, K_CHUNK]], channel_multiplier=1, on_true_tile=zeros,
                           on_false_value=MASKED_SCORE, cmp_op=nl.greater_equal, offset=0)

    ctx = {"q": q, "k": k, "v": v, "mask": mask, "scale": float(scale), "layout": layout, "dtype": dtype, "D": D,
           "Sk": Sk, "rep": rep, "flat": flat, "kv_group": kv_group, "q_group": q_group, "k_units": k_units,
           "k_chunks": k_chunks, "q_units": q_units, "q_chunks": q_chunks, "causal_bias": causal_bias,
           "use_dma_transpose": use_dma_transpose, "out": out, "lse": lse, "lse_pending": [], "step": 0,
           "engine_ns": {"vector": 0.0, "scalar": 0.0}}

    if _use_transposed_softmax(ctx, mask, is_causal, Sk):
        _attend_transposed(ctx, B, Hkv, Sq)
        if return_lse:
            return out, lse
        return out

    # Work items: (batch, kv-head group, query tile, head group), in loop order.
    items = []
    for b in range(B):
        for g0 in range(0, Hkv, kv_group):
            kv = {"b": b, "g0": g0, "k_t": None, "v_aug": None}
            for q0 in range(0, Sq, Q_TILE):
                mq = min(Q_TILE, Sq - q0)
                tile = {"kv": kv, "b": b, "h0": g0 * rep, "q0": q0, "mq": mq,
                        "n_keys": min(Sk, q0 + mq) if is_causal else Sk, "q_t": None}
                group_heads = _score_group_heads(q_group, tile["n_keys"], D, rep, flat)
                for hs in range(0, q_group, group_heads):
                    items.append({"tile": tile, "hs": hs, "heads": min(group_heads, q_group - hs),
                                  "last": hs + group_heads >= q_group})
    # Consecutive single-block items run software-pipelined; online-softmax items run alone.
    run = []
    for item in items + [None]:
        if item is not None and item["tile"]["n_keys"] <= KV_BLOCK:
            run.append(item)
            continue
        _pipeline(run, ctx)
        run = []
        if item is not None:
            _attend_online(item, ctx)
        _flush_lse(ctx)
    if return_lse:
        return out, lse
    return out


# ---- planning (trace time) -----------------------------------------------------------------------

def _itemsize(dtype):
    return 4 if dtype == nl.float32 else 2


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
    assert resident <= KV_RESIDENT_BYTES, \
        f"attention_fwd: Sk={Sk} keys of head dim {D} need {resident} B per partition for one kv head's " \
        f"resident K^T and V, above KV_RESIDENT_BYTES={KV_RESIDENT_BYTES}; split the key sequence"
    return B, Hq, Hkv, Sq, Sk, D


def _resident_bytes(n_heads, Sk, D, itemsize):
    """SBUF bytes per partition of resident K^T and V (+ ones column) for n_heads kv heads."""
    return n_heads * (math.ceil(D / D_CHUNK) * Sk + math.ceil(Sk / K_CHUNK) * (2 * D + 1)) * itemsize


def _kv_group_size(Hkv, Sk, D, itemsize):
    """The most kv heads (a divisor of Hkv) whose K^T and V stay resident within the budget."""
    for g in range(Hkv, 0, -1):
        if Hkv % g == 0 and _resident_bytes(g, Sk, D, itemsize) <= KV_RESIDENT_BYTES:
            return g
    return 1


def _score_group_heads(q_group, n_keys, D, rep, flat):
    """Query heads per PSUM score tile: as many as SCORE_TILE_BYTES holds (1 for online softmax),
    at most MAX_GROUP_HEADS, their [Q | l] outputs within one PSUM bank, and an even number when
    head pairs share PE row tiles."""
    if n_keys > KV_BLOCK:
        return 1
    heads = min(q_group, MAX_GROUP_HEADS, SCORE_TILE_BYTES // (4 * n_keys),
                PSUM_BANK_BYTES // (4 * (D + 1)))
    if flat and heads > 1 and heads % 2:
        heads -= 1
    return max(1, heads)


def _transpose_plan(n_heads, head_dim, flat):
    """Where each head's D-on-partition chunks live in a [P_MAX, n_cols, tokens] tile.

    Returns (units, chunks): ``units`` = [(col, src_col, width)]: columns [src_col, src_col +
    width) of the (tokens, n_heads * D) input land in slot ``col``; ``chunks[h]`` = [(col, row0,
    rows)]: head h's contraction chunks of <= 128 dims. ``flat``: 128 columns at a time across
    head boundaries (D divides 128 or 128 divides D), else per head and chunk, rows from 0."""
    units, chunks = [], []
    if flat:
        for col in range(n_heads * head_dim // P_MAX):
            units.append((col, col * P_MAX, P_MAX))
        for h in range(n_heads):
            chunks.append([((h * head_dim + d0) // P_MAX, (h * head_dim + d0) % P_MAX, min(D_CHUNK, head_dim - d0))
                           for d0 in range(0, head_dim, D_CHUNK)])
    else:
        per_head = math.ceil(head_dim / D_CHUNK)
        for h in range(n_heads):
            head_chunks = []
            for i, d0 in enumerate(range(0, head_dim, D_CHUNK)):
                width = min(D_CHUNK, head_dim - d0)
                units.append((h * per_head + i, h * head_dim + d0, width))
                head_chunks.append((h * per_head + i, 0, width))
            chunks.append(head_chunks)
    return units, chunks


# ---- loads and stores ------------------------------------------------------------------------------

def _seq_view(x, layout, b, t0, t1, h0, h1):
    """HBM view of tokens [t0, t1) x heads [h0, h1) of batch b, shaped (tokens, heads, D)."""
    if layout == "bshd":
        return x[b, t0:t1, h0:h1, :]
    return x[b, h0:h1, t0:t1, :].permute((1, 0, 2))


def _dma_transposed(x, ctx, b, t0, n_tok, h0, n_heads, units):
    """[P_MAX, n_cols, n_tok] SBUF tile with D on partitions, by DMA transposes (trn2+): one DMA
    for all heads when ``flat`` (bshd: a token's heads are contiguous), else one per head chunk."""
    layout, D = ctx["layout"], ctx["D"]
    n_cols = units[-1][0] + 1
    x_t = nl.ndarray((P_MAX, n_cols, n_tok), dtype=ctx["dtype"], buffer=nl.sbuf)
    if ctx["flat"]:
        src = x[b, t0:t0 + n_tok, h0:h0 + n_heads, :].flatten_dims(1, 2).reshape_dim(1, (n_cols, P_MAX))
        nisa.dma_transpose(dst=x_t[:, :, :n_tok], src=src)
    else:
        for col, src_col, width in units:
            h, d0 = h0 + src_col // D, src_col % D
            src = x[b, t0:t0 + n_tok, h, d0:d0 + width] if layout == "bshd" else x[b, h, t0:t0 + n_tok, d0:d0 + width]
            nisa.dma_transpose(dst=x_t[:width, col, :n_tok], src=src)
    return x_t


def _pe_transposed(x, ctx, b, t0, n_tok, h0, n_heads, units, scale):
    """The same tile as ``_dma_transposed`` through TensorE transposes (trn1), times ``scale``:
    token-major loads of 128 tokens x all heads, transposes into PSUM, one eviction per unit."""
    layout, D, dtype = ctx["layout"], ctx["D"], ctx["dtype"]
    n_cols = units[-1][0] + 1
    x_t = nl.ndarray((P_MAX, n_cols, n_tok), dtype=dtype, buffer=nl.sbuf)
    per_bank = PSUM_BANK_BYTES // (K_CHUNK * _itemsize(dtype))
    for c0 in range(0, n_tok, per_bank * K_CHUNK):
        tiles = []
        for t in range(c0, min(n_tok, c0 + per_bank * K_CHUNK), K_CHUNK):
            rows = min(K_CHUNK, n_tok - t)
            tok = nl.ndarray((K_CHUNK, n_heads * D), dtype=dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=tok[:rows], src=_seq_view(x, layout, b, t0 + t, t0 + t + rows, h0, h0 + n_heads))
            tiles.append((tok, rows))
        n = sum(rows for _, rows in tiles)
        for col, src_col, width in units:
            t_psum = nl.ndarray((P_MAX, per_bank * K_CHUNK), dtype=dtype, buffer=nl.psum)
            for j, (tok, rows) in enumerate(tiles):
                nisa.nc_transpose(dst=t_psum[:width, j * K_CHUNK:j * K_CHUNK + rows], data=tok[:rows, src_col:src_col + width])
            nisa.activation(dst=x_t[:width, col, c0:c0 + n], op=nl.copy, data=t_psum[:width, :n], scale=scale)
    return x_t


def _load_v_with_ones(v, ctx, b, g0, n_heads):
    """V as [K_CHUNK, n_kchunks, n_heads, D + 1] with a ones column, so that the PV matmul also
    returns the row sums of P. Loaded token-major (all heads per DMA), widened on GpSimd."""
    layout, Sk, D, dtype = ctx["layout"], ctx["Sk"], ctx["D"], ctx["dtype"]
    n_kchunks = math.ceil(Sk / K_CHUNK)
    v_tok = nl.ndarray((K_CHUNK, n_kchunks, n_heads * D), dtype=dtype, buffer=nl.sbuf)
    v_aug = nl.ndarray((K_CHUNK, n_kchunks, n_heads, D + 1), dtype=dtype, buffer=nl.sbuf)
    nisa.memset(dst=v_aug[:, :, :, D:D + 1], value=1.0, engine=nisa.engine.gpsimd)
    for c in range(n_kchunks):
        kc = min(K_CHUNK, Sk - c * K_CHUNK)
        nisa.dma_copy(dst=v_tok[:kc, c], src=_seq_view(v, layout, b, c * K_CHUNK, c * K_CHUNK + kc, g0, g0 + n_heads))
        nisa.tensor_copy(dst=v_aug[:kc, c, :, :D], src=v_tok[:kc, c].reshape((kc, n_heads, D)),
                         engine=nisa.engine.gpsimd)
    return v_aug


def _load_mask(mask, b, h, q0, mq, k0, nk):
    """The additive mask for query rows [q0, q0 + mq) and keys [k0, k0 + nk) as [Q_TILE, nk] fp32."""
    bm = b if mask.shape[0] > 1 else 0
    hm = h if mask.shape[1] > 1 else 0
    tile = nl.ndarray((Q_TILE, nk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile[:mq], src=mask[bm, hm, q0:q0 + mq, k0:k0 + nk])
    return tile


def _store_tile(tile, ctx):
    """Output tile (all heads of the group, one DMA); its lse is queued for ``_store_lse``: lse =
    m + ln(l) = -ln(1/l) - (-m) for all heads at once (one ScalarE log, one VectorE op; GpSimd
    stays free for the loads it serves), then a DMA transpose so that the store writes each
    head's queries contiguously."""
    b, h0, q0, mq = tile["b"], tile["h0"], tile["q0"], tile["mq"]
    out, lse, layout, q_group = ctx["out"], ctx["lse"], ctx["layout"], ctx["q_group"]
    nisa.dma_copy(dst=_seq_view(out, layout, b, q0, q0 + mq, h0, h0 + q_group), src=tile["o_sb"][:mq])
    if lse is not None:
        ctx["lse_pending"].append((ctx["step"], tile))


def _store_lse(tile, ctx):
    """lse of a stored tile; issued a pipeline step later so ScalarE does not wait for its 1/l."""
    b, h0, q0, mq = tile["b"], tile["h0"], tile["q0"], tile["mq"]
    lse, q_group = ctx["lse"], ctx["q_group"]
    log_inv_sum = nl.ndarray((Q_TILE, q_group), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=log_inv_sum[:mq], op=nl.log, data=tile["inv_sum"][:mq])
    lse_sb = nl.ndarray((Q_TILE, q_group), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=lse_sb[:mq], data=log_inv_sum[:mq], op0=nl.multiply, operand0=-1.0,
                              op1=nl.subtract, operand1=tile["neg_max"][:mq])
    if not ctx["use_dma_transpose"]:     # trn1: element-strided store
        nisa.dma_copy(dst=lse[b, h0:h0 + q_group, q0:q0 + mq].permute((1, 0)), src=lse_sb[:mq])
        return
    for c0 in range(0, q_group, P_MAX):
        n = min(P_MAX, q_group - c0)
        lse_t = nl.ndarray((P_MAX, Q_TILE), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_transpose(dst=lse_t[:n, :mq], src=lse_sb[:mq, c0:c0 + n])
        nisa.dma_copy(dst=lse[b, h0 + c0:h0 + c0 + n, q0:q0 + mq], src=lse_t[:n, :mq])


# ---- attention of one (query tile, head group) ------------------------------------------------------

def _pipeline(items, ctx):
    """Software pipeline over single-block items, three deep. Each engine runs its instructions
    in program order, so every step issues work whose inputs are ready: P^T of item i - 2 (its P
    exists), exponentials of item i - 1, scores and row max of item i, then PV and the output of
    item i - 2 (after its P^T evictions). Per engine: TensorE P^T(i-2), S(i), PV(i-2); ScalarE
    evictions(i-2), exp(i-1); VectorE max(i), out(i-2). The exp of item i - 1 precedes S(i) so
    that at most one score tile is live in PSUM."""
    n = len(items)
    for step in range(n + 2):
        ctx["step"] += 1
        _flush_lse(ctx, min_age=LSE_DELAY_STEPS)
        if 2 <= step:
            _stage_transpose(items[step - 2], ctx)
        if 1 <= step <= n:
            _stage_exp(items[step - 1], ctx)
        if step < n:
            _stage_scores(items[step], ctx)
        if 2 <= step:
            _stage_pv(items[step - 2], ctx)
            _stage_output(items[step - 2], ctx)


def _flush_lse(ctx, min_age=0):
    """Issue the lse of tiles stored at least ``min_age`` pipeline steps ago."""
    keep = []
    for step, tile in ctx["lse_pending"]:
        if ctx["step"] - step >= min_age:
            _store_lse(tile, ctx)
        else:
            keep.append((step, tile))
    ctx["lse_pending"] = keep


def _ensure_loaded(tile, ctx):
    """Loads on first use: the kv group's K^T and V, the query tile's Q^T and shared mask."""
    kv = tile["kv"]
    if kv["k_t"] is None:
        b, g0, n = kv["b"], kv["g0"], ctx["kv_group"]
        if ctx["use_dma_transpose"]:
            kv["k_t"] = _dma_transposed(ctx["k"], ctx, b, 0, ctx["Sk"], g0, n, ctx["k_units"])
        else:
            kv["k_t"] = _pe_transposed(ctx["k"], ctx, b, 0, ctx["Sk"], g0, n, ctx["k_units"], 1.0)
        kv["v_aug"] = _load_v_with_ones(ctx["v"], ctx, b, g0, n)
    if tile["q_t"] is None:
        _load_query_tile(tile, ctx)


def _stage_scores(item, ctx):
    """Pipeline stage 1: S with masks, row max."""
    tile = item["tile"]
    _ensure_loaded(tile, ctx)
    mq, heads, nb = tile["mq"], item["heads"], tile["n_keys"]
    scores = _scores(item, ctx, 0, nb, nb)
    _add_masks(scores, item, ctx, 0, nb)
    item["scores"] = scores
    item["neg_max"] = tile["neg_max"][:, item["hs"]:item["hs"] + heads]
    _row_neg_max(item["neg_max"], scores, mq, nb)
    _charge(ctx, "vector", heads * nb)


def _stage_exp(item, ctx):
    """Pipeline stage 2: P = exp(S - m)."""
    _charge(ctx, "scalar", item["heads"] * item["tile"]["n_keys"])
    item["probs"] = _exp(item["scores"], item["neg_max"], item["tile"]["mq"], item["heads"], item["tile"]["n_keys"],
                         ctx["dtype"])


def _stage_transpose(item, ctx):
    """Pipeline stage 3a: P^T."""
    item["banks"] = _transpose_probs(item["probs"], item, ctx, item["tile"]["n_keys"])


def _stage_pv(item, ctx):
    """Pipeline stage 3b: [O | l] = P [V | 1] and 1 / l."""
    tile = item["tile"]
    item["o_psum"] = _pv(item["banks"], item, ctx, 0, tile["n_keys"])
    item["inv_sum"] = _inverse_sum(item["o_psum"], item, ctx)


def _stage_output(item, ctx):
    """Pipeline stage 3c: out = O / l; the tile's store after its last head group."""
    tile = item["tile"]
    _normalize(item["o_psum"], item["inv_sum"], item, ctx)
    _charge(ctx, "vector", item["heads"] * ctx["D"])
    if item["last"]:
        _store_tile(tile, ctx)


def _load_query_tile(tile, ctx):
    b, q0, mq, h0, n = tile["b"], tile["q0"], tile["mq"], tile["h0"], ctx["q_group"]
    if ctx["use_dma_transpose"]:
        q_t = _dma_transposed(ctx["q"], ctx, b, q0, mq, h0, n, ctx["q_units"])
        # scale folded into Q (GpSimd is otherwise idle): the scores come out of TensorE scaled.
        nisa.tensor_scalar(dst=q_t[:, :, :mq], data=q_t[:, :, :mq], op0=nl.multiply, operand0=ctx["scale"],
                           engine=nisa.engine.gpsimd)
    else:
        q_t = _pe_transposed(ctx["q"], ctx, b, q0, mq, h0, n, ctx["q_units"], ctx["scale"])
    tile["q_t"] = q_t
    tile["o_sb"] = nl.ndarray((Q_TILE, n, ctx["D"]), dtype=ctx["dtype"], buffer=nl.sbuf)
    # Per query row and head: -max (the exp bias, also for lse) and 1/l (normalisation, lse).
    tile["neg_max"] = nl.ndarray((Q_TILE, n), dtype=nl.float32, buffer=nl.sbuf)
    tile["inv_sum"] = nl.ndarray((Q_TILE, n), dtype=nl.float32, buffer=nl.sbuf)
    tile["shared_mask"] = None
    mask = ctx["mask"]
    if mask is not None and mask.shape[1] == 1 and tile["n_keys"] <= KV_BLOCK:
        tile["shared_mask"] = _load_mask(mask, b, 0, q0, mq, 0, tile["n_keys"])


def _scores(item, ctx, kb0, nb, stride):
    """S = (scale Q) K^T for the group's heads and keys [kb0, kb0 + nb): [Q_TILE, heads, stride]
    fp32 PSUM, heads packed densely. Matmuls of up to SCORE_COLS keys are cut at PSUM bank
    boundaries of the tile (an accumulation group never crosses a bank)."""
    tile, hs, heads = item["tile"], item["hs"], item["heads"]
    q_t, mq, k_t = tile["q_t"], tile["mq"], tile["kv"]["k_t"]
    q_chunks, k_chunks, rep = ctx["q_chunks"], ctx["k_chunks"], ctx["rep"]
    scores = nl.ndarray((Q_TILE, heads, stride), dtype=nl.float32, buffer=nl.psum)
    for g in range(heads):
        hl = hs + g
        c0 = 0
        while c0 < nb:
            col = g * stride + c0                     # column in the tile
            w = min(nb - c0, SCORE_COLS - col % SCORE_COLS)
            for i, (qc, qr, rows) in enumerate(q_chunks[hl]):
                kc, kr, _ = k_chunks[hl // rep][i]
                # Heads narrower than 128 dims sit on their own PE row tile (two 64-dim heads run
                # side by side); full-height contractions use the whole array.
                tiling = {}
                if rows < P_MAX and qr == kr and P_MAX % rows == 0 and qr % rows == 0:
                    tiling = {"tile_position": (qr, 0), "tile_size": (rows, P_MAX)}
                nisa.nc_matmul(dst=scores[:mq, g, c0:c0 + w], stationary=q_t[qr:qr + rows, qc, :mq],
                               moving=k_t[kr:kr + rows, kc, kb0 + c0:kb0 + c0 + w], accumulate=i > 0, **tiling)
            c0 += w
    return scores


def _add_masks(scores, item, ctx, kb0, nb):
    tile, hs, heads = item["tile"], item["hs"], item["heads"]
    mq, q0 = tile["mq"], tile["q0"]
    mask, causal_bias = ctx["mask"], ctx["causal_bias"]
    if mask is not None:
        if mask.shape[1] == 1:
            shared = tile["shared_mask"] if tile["shared_mask"] is not None else \
                _load_mask(mask, tile["b"], 0, q0, mq, kb0, nb)
            nisa.tensor_tensor(dst=scores[:mq, :, :nb], data1=scores[:mq, :, :nb],
                               data2=shared[:mq, :nb].expand_dim(1).broadcast(1, heads), op=nl.add)
        else:
            for g in range(heads):
                head_mask = _load_mask(mask, tile["b"], tile["h0"] + hs + g, q0, mq, kb0, nb)
                nisa.tensor_tensor(dst=scores[:mq, g, :nb], data1=scores[:mq, g, :nb], data2=head_mask[:mq, :nb],
                                   op=nl.add)
    if causal_bias is not None and kb0 <= q0 < kb0 + nb:
        d0, d1 = q0 - kb0, nb          # the diagonal key tile; keys beyond q0 + mq were skipped
        nisa.tensor_tensor(dst=scores[:mq, :, d0:d1], data1=scores[:mq, :, d0:d1],
                           data2=causal_bias[:mq, :d1 - d0].expand_dim(1).broadcast(1, heads), op=nl.add)


def _row_neg_max(neg_max, scores, mq, nb):
    """neg_max[:, g] = -max over keys of every row of head g: all heads of the group in one reduction."""
    nisa.tensor_reduce(dst=neg_max[:mq], op=nl.maximum, data=scores[:mq, :, :nb], axis=2, negate=True)


def _exp(scores, neg_max, mq, heads, nb, dtype):
    """P = exp(S - m) per head (the bias is a per-partition column, so one activation per head)."""
    probs = nl.ndarray((Q_TILE, heads, nb), dtype=dtype, buffer=nl.sbuf)
    for g in range(heads):
        nisa.activation(dst=probs[:mq, g], op=nl.exp, data=scores[:mq, g, :nb], bias=neg_max[:mq, g:g + 1])
    return probs


def _charge(ctx, engine, elements):
    """Book ``elements`` per partition of work on VectorE or ScalarE (in ns at their clocks)."""
    ctx["engine_ns"][engine] += elements / ENGINE_GHZ[engine]


def _cheaper_on_vector(ctx, elements, dtype):
    """Place a PSUM -> SBUF copy: VectorE copies 16-bit data 2x faster from PSUM, ScalarE 1x."""
    vector_elements = elements / 2 if _itemsize(dtype) == 2 else elements
    vector_done = ctx["engine_ns"]["vector"] + vector_elements / ENGINE_GHZ["vector"]
    scalar_done = ctx["engine_ns"]["scalar"] + elements / ENGINE_GHZ["scalar"]
    if vector_done < scalar_done:
        _charge(ctx, "vector", vector_elements)
        return True
    _charge(ctx, "scalar", elements)
    return False


def _transpose_probs(probs, item, ctx, nb):
    """P^T by TensorE transposes, 8 (16-bit) or 4 (fp32) 128-key chunks per PSUM bank, each bank
    evicted to SBUF by one ScalarE copy. Returns [(pt_sb, [(head, chunk), ...])] per bank."""
    tile, heads = item["tile"], item["heads"]
    mq, dtype = tile["mq"], ctx["dtype"]
    n_chunks = math.ceil(nb / K_CHUNK)
    slots = [(g, c) for g in range(heads) for c in range(n_chunks)]
    per_bank = PSUM_BANK_BYTES // (Q_TILE * _itemsize(dtype))
    banks = []
    for s0 in range(0, len(slots), per_bank):
        bank_slots = slots[s0:s0 + per_bank]
        pt_psum = nl.ndarray((K_CHUNK, len(bank_slots), Q_TILE), dtype=dtype, buffer=nl.psum)
        for j, (g, c) in enumerate(bank_slots):
            kc = min(K_CHUNK, nb - c * K_CHUNK)
            nisa.nc_transpose(dst=pt_psum[:kc, j, :mq], data=probs[:mq, g, c * K_CHUNK:c * K_CHUNK + kc])
        # Partitions past a ragged chunk's kc hold stale PSUM data: copied, never read.
        n = len(bank_slots)
        pt_sb = nl.ndarray((K_CHUNK, len(bank_slots), Q_TILE), dtype=dtype, buffer=nl.sbuf)
        # Evict on the engine with less work so far (trace-time balance of VectorE and ScalarE).
        if _cheaper_on_vector(ctx, n * mq, dtype):
            nisa.tensor_copy(dst=pt_sb[:, :n, :mq], src=pt_psum[:, :n, :mq])
        else:
            nisa.activation(dst=pt_sb[:, :n, :mq], op=nl.copy, data=pt_psum[:, :n, :mq])
        banks.append((pt_sb, bank_slots))
    return banks


def _pv(banks, item, ctx, kb0, nb):
    """[O | l] = P [V | 1] for the group: [Q_TILE, heads, D + 1] fp32 PSUM, accumulated over the
    128-key chunks of the block."""
    tile, hs, heads = item["tile"], item["hs"], item["heads"]
    mq, v_aug, D, rep = tile["mq"], tile["kv"]["v_aug"], ctx["D"], ctx["rep"]
    o_psum = nl.ndarray((Q_TILE, heads, D + 1), dtype=nl.float32, buffer=nl.psum)
    for pt_sb, bank_slots in banks:
        for j, (g, c) in enumerate(bank_slots):
            kc = min(K_CHUNK, nb - c * K_CHUNK)
            nisa.nc_matmul(dst=o_psum[:mq, g], stationary=pt_sb[:kc, j, :mq],
                           moving=v_aug[:kc, (kb0 + c * K_CHUNK) // K_CHUNK, (hs + g) // rep], accumulate=c > 0)
    return o_psum


def _inverse_sum(o_acc, item, ctx):
    """1 / l of the group's rows (l = the ones column of [O | l]) into the tile's inv_sum. 16-bit
    outputs take ScalarE's reciprocal (cheaper for these few elements, and its approximation is
    far below bf16/fp16 resolution); fp32 outputs take VectorE's exact one."""
    tile, hs, heads = item["tile"], item["hs"], item["heads"]
    inv_sum = tile["inv_sum"][:, hs:hs + heads]
    row_sums = o_acc[:tile["mq"], :, ctx["D"]]
    if _itemsize(ctx["dtype"]) == 2:
        nisa.activation(dst=inv_sum[:tile["mq"]], op=nl.reciprocal, data=row_sums)
        _charge(ctx, "scalar", TINY_INSTRUCTION_CYCLES)
    else:
        nisa.reciprocal(dst=inv_sum[:tile["mq"]], data=row_sums)
        _charge(ctx, "vector", TINY_INSTRUCTION_CYCLES)
    return inv_sum


def _normalize(o_acc, inv_sum, item, ctx):
    """out = O / l, fused into the eviction to the output tile (one VectorE op for the group)."""
    tile, hs, heads = item["tile"], item["hs"], item["heads"]
    mq, D = tile["mq"], ctx["D"]
    nisa.tensor_tensor(dst=tile["o_sb"][:mq, hs:hs + heads], data1=o_acc[:mq, :, :D],
                       data2=inv_sum[:mq].expand_dim(2).broadcast(2, D), op=nl.multiply)


def _attend_online(item, ctx):
    """Online (flash) softmax over key blocks of KV_BLOCK (keys > KV_BLOCK; one head per item)."""
    tile, heads = item["tile"], item["heads"]
    _ensure_loaded(tile, ctx)
    mq, n_keys, D, dtype = tile["mq"], tile["n_keys"], ctx["D"], ctx["dtype"]
    neg_max = acc = None
    for kb0 in range(0, n_keys, KV_BLOCK):
        nb = min(KV_BLOCK, n_keys - kb0)
        scores = _scores(item, ctx, kb0, nb, KV_BLOCK)
        _add_masks(scores, item, ctx, kb0, nb)
        block_neg_max = nl.ndarray((Q_TILE, heads), dtype=nl.float32, buffer=nl.sbuf)
        _row_neg_max(block_neg_max, scores, mq, nb)
        if neg_max is None:
            neg_max = block_neg_max
            probs = _exp(scores, neg_max, mq, heads, nb, dtype)
            o_psum = _pv(_transpose_probs(probs, item, ctx, nb), item, ctx, kb0, nb)
            acc = nl.ndarray((Q_TILE, heads, D + 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=acc[:mq], src=o_psum[:mq])
            continue
        # m_new = max(m_old, m_block); alpha = exp(m_old - m_new) rescales O and l.
        new_neg_max = nl.ndarray((Q_TILE, heads), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=new_neg_max[:mq], data1=neg_max[:mq], data2=block_neg_max[:mq], op=nl.minimum)
        delta = nl.ndarray((Q_TILE, heads), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=delta[:mq], data1=new_neg_max[:mq], data2=neg_max[:mq], op=nl.subtract)
        alpha = nl.ndarray((Q_TILE, heads), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=alpha[:mq], op=nl.exp, data=delta[:mq])
        neg_max = new_neg_max
        probs = _exp(scores, neg_max, mq, heads, nb, dtype)
        o_psum = _pv(_transpose_probs(probs, item, ctx, nb), item, ctx, kb0, nb)
        nisa.tensor_tensor(dst=acc[:mq], data1=acc[:mq], data2=alpha[:mq].expand_dim(2).broadcast(2, D + 1),
                           op=nl.multiply)
        nisa.tensor_tensor(dst=acc[:mq], data1=acc[:mq], data2=o_psum[:mq], op=nl.add)
    _normalize(acc, _inverse_sum(acc, item, ctx), item, ctx)
    nisa.tensor_copy(dst=tile["neg_max"][:mq, item["hs"]:item["hs"] + heads], src=neg_max[:mq])
    if item["last"]:
        _store_tile(tile, ctx)


# ---- transposed softmax: P^T straight out of the exponential -------------------------------------

def _use_transposed_softmax(ctx, mask, is_causal, Sk):
    """The transposed path: 16-bit inputs (P is rounded to them anyway), no mask or causal triangle,
    all keys in one score tile, a spare contraction row for -m (D < 128), DMA transposes (trn2+)."""
    return (_itemsize(ctx["dtype"]) == 2 and ctx["use_dma_transpose"] and mask is None and not is_causal
            and 4 * _psum_slot(Sk) <= SCORE_TILE_BYTES and ctx["D"] + 1 <= P_MAX)


def _psum_slot(n):
    """fp32 columns per head in a PSUM tile: a power of two >= n within a bank (whole banks beyond
    one), so that no head's matmul output crosses a bank boundary."""
    if n > SCORE_COLS:
        return SCORE_COLS * math.ceil(n / SCORE_COLS)
    return 1 << (n - 1).bit_length()


def _attend_transposed(ctx, B, Hkv, Sq):
    """Units of (batch, kv-head group, query block, head group), software-pipelined over four stages:
    unit u's row max at step u, its -m row at u + 1, S^T and exp at u + 1 + EXP_LAG (the -m row
    arrives by DMA in between), PV and output a step later. Each step issues the newest work first."""
    D, Sk, q_group, rep = ctx["D"], ctx["Sk"], ctx["q_group"], ctx["rep"]
    nq_max = min(Sq, Q_BLOCK)
    ctx["s_slot"], ctx["st_slot"] = _psum_slot(Sk), _psum_slot(nq_max)
    heads = min(q_group, MAX_GROUP_HEADS, SCORE_TILE_BYTES // (4 * ctx["s_slot"]),
                ST_BANKS * (SCORE_COLS // ctx["st_slot"]), PSUM_BANK_BYTES // (4 * (D + 1)),
                max(UNIT_MIN_HEADS, math.ceil(UNIT_SCORES / (nq_max * Sk))))
    ctx["unit_heads"] = heads = max(1, heads)
    units = []
    for b in range(B):
        for g0 in range(0, Hkv, ctx["kv_group"]):
            kv = {"b": b, "g0": g0, "k_aug": None, "v_aug": None}
            for t0 in range(0, Sq, Q_BLOCK):
                blk = {"kv": kv, "b": b, "h0": g0 * rep, "t0": t0, "nq": min(Q_BLOCK, Sq - t0), "q_aug": None}
                for hs in range(0, q_group, heads):
                    units.append({"blk": blk, "hs": hs, "heads": min(heads, q_group - hs),
                                  "last": hs + heads >= q_group})
    ctx["ones_row"] = None
    stages = ((_stage_row_max, 0), (_stage_stabiliser_row, 1), (_stage_exp_transposed, 1 + EXP_LAG),
              (_stage_pv_transposed, 2 + EXP_LAG))
    for step in range(len(units) + EXP_LAG + 2):
        ctx["step"] += 1
        _flush_lse(ctx, min_age=LSE_DELAY_UNITS)
        for stage, lag in stages:
            if 0 <= step - lag < len(units):
                stage(units[step - lag], ctx)
    _flush_lse(ctx)


def _ensure_augmented(blk, ctx):
    """Loads on first use: K_aug^T = [K^T; 1] (D + 1 rows, heads side by side) and V with a ones
    column per kv group; Q_aug^T = [Q^T; -m] per query block (row D written later)."""
    kv, dtype, D, Sk, layout = blk["kv"], ctx["dtype"], ctx["D"], ctx["Sk"], ctx["layout"]
    if kv["k_aug"] is None:
        b, g0, n = kv["b"], kv["g0"], ctx["kv_group"]
        k_aug = nl.ndarray((D + 1, n, Sk), dtype=dtype, buffer=nl.sbuf)
        first = ctx["unit_heads"] if (kv["b"], kv["g0"]) == (0, 0) and ctx["rep"] == 1 else 0
        _dma_transpose_heads(k_aug, ctx["k"], layout, b, 0, Sk, g0, n, first)
        if ctx["ones_row"] is None:
            # A memset of one partition costs as much as of all 128: set the ones row once, copy it by DMA.
            ctx["ones_row"] = nl.ndarray((1, n, Sk), dtype=dtype, buffer=nl.sbuf)
            nisa.memset(dst=ctx["ones_row"], value=1.0, engine=nisa.engine.gpsimd)
        nisa.dma_copy(dst=k_aug[D:D + 1], src=ctx["ones_row"], dge_mode=nisa.dge_mode.hwdge)
        kv["k_aug"] = k_aug
    if blk["q_aug"] is None:
        b, h0, t0, nq, n = blk["b"], blk["h0"], blk["t0"], blk["nq"], ctx["q_group"]
        blk["q_aug"] = nl.ndarray((D + 1, n, nq), dtype=dtype, buffer=nl.sbuf)
        first = ctx["unit_heads"] if (b, h0, t0) == (0, 0, 0) else 0
        _dma_transpose_heads(blk["q_aug"], ctx["q"], layout, b, t0, nq, h0, n, first)
        n_tiles = math.ceil(nq / Q_TILE)
        blk["neg_stat"] = nl.ndarray((Q_TILE, n_tiles, n), dtype=dtype, buffer=nl.sbuf)
        blk["tiles"] = []
        for q0 in range(t0, t0 + nq, Q_TILE):
            blk["tiles"].append({"b": b, "h0": h0, "q0": q0, "mq": min(Q_TILE, t0 + nq - q0),
                                 "o_acc": nl.ndarray((Q_TILE, n, D + 1), dtype=nl.float32, buffer=nl.sbuf),
                                 "o_sb": nl.ndarray((Q_TILE, n, D), dtype=dtype, buffer=nl.sbuf),
                                 "inv_sum": nl.ndarray((Q_TILE, n), dtype=nl.float32, buffer=nl.sbuf)})
    if kv["v_aug"] is None:      # after Q and K: PV needs V three steps later than S needs Q and K
        kv["v_aug"] = _load_v_with_ones(ctx["v"], ctx, kv["b"], kv["g0"], ctx["kv_group"])


def _dma_transpose_heads(x_aug, x, layout, b, t0, n_tok, h0, n_heads, first_heads=0):
    """x_aug[:D, j, :] = tokens [t0, t0 + n_tok) of head h0 + j, transposed: in "bshd" one DMA for
    all heads (a token's heads are contiguous), in "bhsd" one per head (each head is contiguous).
    ``first_heads``: in "bshd", move those heads by a DMA of their own first (so that the first
    pipeline unit can start before the rest arrives)."""
    D = x.shape[-1]
    if layout == "bshd":
        for j0, j1 in ((0, first_heads), (first_heads, n_heads)) if 0 < first_heads < n_heads else ((0, n_heads),):
            nisa.dma_transpose(dst=x_aug[:D, j0:j1, :n_tok], src=x[b, t0:t0 + n_tok, h0 + j0:h0 + j1, :])
        return
    for j in range(n_heads):
        nisa.dma_transpose(dst=x_aug[:D, j, :n_tok], src=x[b, h0 + j, t0:t0 + n_tok, :])


def _stage_row_max(unit, ctx):
    """Stage 1: S = Q K^T per query tile (unscaled) and -m = -rowmax (-rowmin for a negative scale:
    the max of scale * S), rounded to the input dtype: any value near the max stabilises the exp."""
    blk = unit["blk"]
    _ensure_augmented(blk, ctx)
    D, Sk, rep, hs, heads = ctx["D"], ctx["Sk"], ctx["rep"], unit["hs"], unit["heads"]
    q_aug, k_aug = blk["q_aug"], blk["kv"]["k_aug"]
    stat_op = nl.maximum if ctx["scale"] >= 0 else nl.minimum
    for i, tile in enumerate(blk["tiles"]):
        mq, tq = tile["mq"], tile["q0"] - blk["t0"]
        scores = nl.ndarray((Q_TILE, heads, ctx["s_slot"]), dtype=nl.float32, buffer=nl.psum)
        for g in range(heads):
            for c0 in range(0, Sk, SCORE_COLS):
                w = min(SCORE_COLS, Sk - c0)
                nisa.nc_matmul(dst=scores[:mq, g, c0:c0 + w], stationary=q_aug[:D, hs + g, tq:tq + mq],
                               moving=k_aug[:D, (hs + g) // rep, c0:c0 + w])
        nisa.tensor_reduce(dst=blk["neg_stat"][:mq, i, hs:hs + heads], op=stat_op, data=scores[:mq, :, :Sk],
                           axis=2, negate=True)
        _charge(ctx, "vector", heads * Sk)


def _stage_stabiliser_row(unit, ctx):
    """Stage 2: -m of the unit's heads from a column per head (queries on partitions) to row D of
    Q_aug^T (queries along the free dim): TensorE transposes, one PSUM copy, one DMA."""
    blk = unit["blk"]
    D, dtype, hs, heads, nq = ctx["D"], ctx["dtype"], unit["hs"], unit["heads"], blk["nq"]
    row_psum = nl.ndarray((heads, Q_BLOCK), dtype=dtype, buffer=nl.psum)
    for i, tile in enumerate(blk["tiles"]):
        tq = tile["q0"] - blk["t0"]
        nisa.nc_transpose(dst=row_psum[:, tq:tq + tile["mq"]], data=blk["neg_stat"][:tile["mq"], i, hs:hs + heads])
    row_sb = nl.ndarray((heads, Q_BLOCK), dtype=dtype, buffer=nl.sbuf)
    if _cheaper_on_vector(ctx, nq, dtype):
        nisa.tensor_copy(dst=row_sb[:, :nq], src=row_psum[:, :nq])
    else:
        nisa.activation(dst=row_sb[:, :nq], op=nl.copy, data=row_psum[:, :nq])
    nisa.dma_copy(dst=blk["q_aug"][D:D + 1, hs:hs + heads, :nq], src=row_sb[:, :nq], dge_mode=nisa.dge_mode.hwdge)


def _stage_exp_transposed(unit, ctx):
    """Stage 3: S^T - m = K_aug Q_aug^T per 128-key chunk (one K = D + 1 matmul per head, all
    queries of the block as the moving side), then P^T = exp(scale (S^T - m)) for the unit's heads
    in one ScalarE instruction, written to SBUF ready for the PV matmul."""
    blk = unit["blk"]
    Sk, rep, hs, heads, nq = ctx["Sk"], ctx["rep"], unit["hs"], unit["heads"], blk["nq"]
    q_aug, k_aug = blk["q_aug"], blk["kv"]["k_aug"]
    n_chunks = math.ceil(Sk / K_CHUNK)
    probs_t = nl.ndarray((K_CHUNK, n_chunks, heads, nq), dtype=ctx["dtype"], buffer=nl.sbuf)
    for c in range(n_chunks):
        k0, kc = c * K_CHUNK, min(K_CHUNK, Sk - c * K_CHUNK)
        scores_t = nl.ndarray((K_CHUNK, heads, ctx["st_slot"]), dtype=nl.float32, buffer=nl.psum)
        for g in range(heads):
            nisa.nc_matmul(dst=scores_t[:kc, g, :nq], stationary=k_aug[:, (hs + g) // rep, k0:k0 + kc],
                           moving=q_aug[:, hs + g, :])
        nisa.activation(dst=probs_t[:kc, c], op=nl.exp, data=scores_t[:kc, :, :nq], scale=ctx["scale"])
        _charge(ctx, "scalar", heads * nq)
    unit["probs_t"] = probs_t


def _stage_pv_transposed(unit, ctx):
    """Stage 4: [O | l] = P [V | 1] per query tile, copied out of PSUM by VectorE or ScalarE
    (whichever has less work booked); after the last head group, out = O / l for all heads at
    once (ScalarE 1/l, GpSimd multiply) and the tile's store."""
    blk = unit["blk"]
    D, Sk, rep, hs, heads = ctx["D"], ctx["Sk"], ctx["rep"], unit["hs"], unit["heads"]
    probs_t, v_aug = unit["probs_t"], blk["kv"]["v_aug"]
    for tile in blk["tiles"]:
        mq, tq = tile["mq"], tile["q0"] - blk["t0"]
        o_psum = nl.ndarray((Q_TILE, heads, D + 1), dtype=nl.float32, buffer=nl.psum)
        for g in range(heads):
            for c in range(math.ceil(Sk / K_CHUNK)):
                kc = min(K_CHUNK, Sk - c * K_CHUNK)
                nisa.nc_matmul(dst=o_psum[:mq, g], stationary=probs_t[:kc, c, g, tq:tq + mq],
                               moving=v_aug[:kc, c, (hs + g) // rep], accumulate=c > 0)
        o_acc = tile["o_acc"][:mq, hs:hs + heads]
        if _cheaper_on_vector(ctx, heads * (D + 1), nl.float32):
            nisa.tensor_copy(dst=o_acc, src=o_psum[:mq])
        else:
            nisa.activation(dst=o_acc, op=nl.copy, data=o_psum[:mq])
        if unit["last"]:
            if ctx["lse"] is not None:
                # lse needs -(max of scale * S) = scale * (-m) (GpSimd, before it waits for 1/l).
                tile["neg_max"] = nl.ndarray((Q_TILE, ctx["q_group"]), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_scalar(dst=tile["neg_max"][:mq], data=blk["neg_stat"][:mq, tq // Q_TILE],
                                   op0=nl.multiply, operand0=ctx["scale"], engine=nisa.engine.gpsimd)
            inv_sum = tile["inv_sum"]
            nisa.activation(dst=inv_sum[:mq], op=nl.reciprocal, data=tile["o_acc"][:mq, :, D])
            _charge(ctx, "scalar", TINY_INSTRUCTION_CYCLES)
            nisa.tensor_tensor(dst=tile["o_sb"][:mq], data1=tile["o_acc"][:mq, :, :D],
                               data2=inv_sum[:mq].expand_dim(2).broadcast(2, D), op=nl.multiply,
                               engine=nisa.engine.gpsimd)
            _store_transposed_tile(blk, tile, ctx)


def _store_transposed_tile(blk, tile, ctx):
    """Output tile store; its lse is queued for _store_lse (issued LSE_DELAY_UNITS steps later)."""
    b, h0, q0, mq = tile["b"], tile["h0"], tile["q0"], tile["mq"]
    nisa.dma_copy(dst=_seq_view(ctx["out"], ctx["layout"], b, q0, q0 + mq, h0, h0 + ctx["q_group"]),
                  src=tile["o_sb"][:mq])
    if ctx["lse"] is not None:
        ctx["lse_pending"].append((ctx["step"], tile))
