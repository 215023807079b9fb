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

Algorithm (one pass, nothing but q, k, v, mask and the outputs touches HBM):

    for b in batch:
      for kv-head group (as many kv heads as keep K^T and V resident within KV_RESIDENT_BYTES):
        load K, V once, 128 tokens x all heads of the group per DMA; K^T by TensorE transposes
        for each query tile of Q_TILE=128 tokens:
          load Q (all heads of the group, one DMA), transpose on TensorE, fold `scale` into the
          PSUM->SBUF eviction (so scores come out of the matmul already scaled)
          for each query head:
            for each key block of <= KV_BLOCK keys (causal: key tiles above the diagonal skipped):
              S    = Q K^T                   TensorE, 512-key matmuls into PSUM (fp32)
              S   += mask, causal triangle   VectorE, in place in PSUM (diagonal tile only)
              m    = rowmax(S)               VectorE, read from PSUM
              P    = exp(S - m), l = rowsum  ScalarE, one activation with fused bias and row sum
              P^T  by 128x128 transposes     TensorE -> PSUM, one eviction per PSUM bank
              O   += P^T.T @ V               TensorE, accumulated over 128-key chunks in PSUM
              (more than one block: online softmax, O and l rescaled by exp(m_old - m_new))
            out = O / l                      fused into the PSUM->SBUF eviction (ScalarE scale)
          store the output tile (all heads of the group, one DMA)

When a query tile's keys fit in one block (Sk <= KV_BLOCK = 2048: every vision model) the
softmax is a plain full-row softmax; longer key ranges use the online (flash) update over
blocks. Statistics (max, sum, lse) are fp32; P is rounded to the input dtype for the PV matmul,
whose accumulation is fp32 in PSUM.

Tiles: Q_TILE = K_CHUNK = nl.tile_size.pmax (128) partitions; SCORE_COLS =
nl.tile_size.gemm_moving_fmax (512) keys per QK^T matmul (one 2 KiB PSUM bank of fp32);
KV_BLOCK = 2048 keys per softmax block (4 PSUM banks); head dims above 128 split the QK^T
contraction into 128-row chunks (PV keeps D <= 256 output columns in one matmul, N <= 512).
For D in {32, 64, 128, 256} and no GQA, heads are transposed several at a time (a 128-column
transpose holds two 64-dim heads, which then sit on partitions 0-63 and 64-127).

Limits (asserted at trace time): 32 <= D <= 256; Hq % Hkv == 0; one kv head's K^T and V must fit
KV_RESIDENT_BYTES per partition (Sk <= 24576 for D <= 128, 12288 for D = 256); rows that the
mask hides completely are undefined (as in flash attention).
"""

import math

import nki
import nki.isa as nisa
import nki.language as nl

P_MAX = nl.tile_size.pmax                       # 128 partitions
Q_TILE = P_MAX                                  # query rows per tile (partition dim of S, O)
K_CHUNK = P_MAX                                 # keys per P^T transpose / PV contraction step
SCORE_COLS = nl.tile_size.gemm_moving_fmax      # 512 keys per QK^T matmul = one PSUM bank of fp32
KV_BLOCK = 4 * SCORE_COLS                       # 2048 keys softmaxed at once (4 PSUM banks)
PSUM_BANK_BYTES = nl.tile_size.psum_bank_fmax_bytes  # 2048
MIN_HEAD_DIM, MAX_HEAD_DIM = 32, 256
D_CHUNK = P_MAX                                 # contraction rows per QK^T matmul
KV_RESIDENT_BYTES = 96 * 1024                   # SBUF bytes per partition for resident K^T and V
MASKED_SCORE = -3.0e38                          # additive causal mask value (finite; exp() -> 0)
SUPPORTED_DTYPES = (nl.bfloat16, nl.float16, nl.float32)
LAYOUTS = ("bhsd", "bshd")


def _itemsize(dtype):
    return 4 if dtype == nl.float32 else 2


def _seq_view(x, layout, b, t0, t1, h0, h1):
    """HBM view of tokens [t0, t1) x heads [h0, h1) of batch b, shaped (tokens, heads, D)."""
    if layout == "bshd":
        return x[b, t0:t1, h0:h1, :]
    return x[b, h0:h1, t0:t1, :].permute((1, 0, 2))


def _transpose_plan(n_heads, head_dim, flat):
    """How the (tokens, n_heads * D) SBUF tile becomes D-on-partition tiles.

    Returns (units, chunks): ``units`` = [(col, src_col, width)]: transpose columns
    [src_col, src_col + width) into slot ``col`` of a [P_MAX, n_cols, tokens] tile;
    ``chunks[h]`` = [(col, row0, rows)]: where head h's contraction chunks of <= 128 dims live.
    ``flat``: transpose 128 columns at a time regardless of head boundaries (D divides 128 or
    128 divides D), else one transpose per head and 128-dim chunk (rows start at partition 0)."""
    units, chunks = [], []
    if flat:
        total = n_heads * head_dim
        for col in range(math.ceil(total / P_MAX)):
            units.append((col, col * P_MAX, min(P_MAX, total - col * P_MAX)))
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
    assert isinstance(scale, (int, float)), f"attention_fwd: scale must be a Python float, got {type(scale)}"
    if mask is not None:
        assert mask.dtype == nl.float32, f"attention_fwd: mask must be float32, got {mask.dtype}"
        assert len(mask.shape) == 4 and mask.shape[0] in (1, B) and mask.shape[1] in (1, Hq) \
            and tuple(mask.shape[2:]) == (Sq, Sk), \
            f"attention_fwd: mask shape {mask.shape} must be (1 or {B}, 1 or {Hq}, {Sq}, {Sk})"
    d_rows = math.ceil(D / D_CHUNK)
    resident = (d_rows * Sk + math.ceil(Sk / K_CHUNK) * D) * _itemsize(q.dtype)
    assert resident <= KV_RESIDENT_BYTES, \
        f"attention_fwd: Sk={Sk} keys of head dim {D} need {resident} B per partition for one kv head's " \
        f"resident K^T and V, above KV_RESIDENT_BYTES={KV_RESIDENT_BYTES}; split the key sequence"
    return B, Hq, Hkv, Sq, Sk, D


@nki.jit
def attention_fwd(q, k, v, mask=None, scale=1.0, is_causal=False, layout="bhsd", return_lse=False):
    B, Hq, Hkv, Sq, Sk, D = _check_inputs(q, k, v, mask, scale, layout)
    dtype = q.dtype
    itemsize = _itemsize(dtype)
    rep = Hq // Hkv
    flat = rep == 1 and (P_MAX % D == 0 or D % P_MAX == 0)
    out = nl.ndarray(q.shape, dtype=dtype, buffer=nl.shared_hbm)
    lse = nl.ndarray((B, Hq, Sq), dtype=nl.float32, buffer=nl.shared_hbm) if return_lse else None

    # kv heads per group: the most that keep K^T + V resident within the budget.
    n_kchunks = math.ceil(Sk / K_CHUNK)
    kv_group = 1
    for g in range(Hkv, 0, -1):
        cols = math.ceil(g * D / P_MAX) if flat else g * math.ceil(D / D_CHUNK)
        if Hkv % g == 0 and (cols * Sk + n_kchunks * g * D) * itemsize <= KV_RESIDENT_BYTES:
            kv_group = g
            break
    q_group = kv_group * rep
    k_units, k_chunks = _transpose_plan(kv_group, D, flat)
    q_units, q_chunks = _transpose_plan(q_group, D, flat)

    causal_bias = None
    if is_causal:
        # causal_bias[p, j] = 0 where key j <= query p, else MASKED_SCORE: added to the diagonal
        # 128x128 score tile of every query tile (key tiles above the diagonal are skipped).
        zeros = nl.ndarray((Q_TILE, K_CHUNK), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=zeros, value=0.0)
        causal_bias = nl.ndarray((Q_TILE, K_CHUNK), dtype=nl.float32, buffer=nl.sbuf)
        nisa.affine_select(dst=causal_bias, pattern=[[-1, K_CHUNK]], channel_multiplier=1, on_true_tile=zeros,
                           on_false_value=MASKED_SCORE, cmp_op=nl.greater_equal, offset=0)

    for b in range(B):
        for g0 in range(0, Hkv, kv_group):
            k_t, v_sb = _load_kv(k, v, layout, b, g0, kv_group, Sk, D, dtype, k_units)
            h0 = g0 * rep
            for q0 in range(0, Sq, Q_TILE):
                mq = min(Q_TILE, Sq - q0)
                q_t = _load_q_transposed(q, layout, b, h0, q_group, q0, mq, D, dtype, q_units, scale)
                o_sb = nl.ndarray((Q_TILE, q_group, D), dtype=dtype, buffer=nl.sbuf)
                lse_sb = nl.ndarray((Q_TILE, q_group), dtype=nl.float32, buffer=nl.sbuf) if return_lse else None
                n_keys = min(Sk, q0 + mq) if is_causal else Sk
                shared_mask = None
                if mask is not None and mask.shape[1] == 1 and n_keys <= KV_BLOCK:
                    shared_mask = _load_mask(mask, b, 0, q0, mq, 0, n_keys)
                for hl in range(q_group):
                    gl = hl // rep
                    h = h0 + hl
                    _attend_head(q_t, q_chunks[hl], k_t, k_chunks[gl], v_sb, gl, o_sb, lse_sb, hl,
                                 mask, shared_mask, causal_bias, b, h, q0, mq, n_keys, D, dtype)
                nisa.dma_copy(dst=_seq_view(out, layout, b, q0, q0 + mq, h0, h0 + q_group), src=o_sb[:mq])
                if return_lse:
                    nisa.dma_copy(dst=lse[b, h0:h0 + q_group, q0:q0 + mq].permute((1, 0)), src=lse_sb[:mq])
    if return_lse:
        return out, lse
    return out


def _load_kv(k, v, layout, b, g0, n_heads, Sk, D, dtype, units):
    """K^T ([P_MAX, n_cols, Sk], D on partitions) and V ([K_CHUNK, n_kchunks, n_heads, D]) for kv
    heads [g0, g0 + n_heads) of batch b, resident in SBUF. One DMA per 128 tokens moves all heads."""
    n_kchunks = math.ceil(Sk / K_CHUNK)
    n_cols = units[-1][0] + 1
    k_t = nl.ndarray((P_MAX, n_cols, Sk), dtype=dtype, buffer=nl.sbuf)
    v_sb = nl.ndarray((K_CHUNK, n_kchunks, n_heads, D), dtype=dtype, buffer=nl.sbuf)
    chunks_per_bank = PSUM_BANK_BYTES // (K_CHUNK * _itemsize(dtype))
    for c0 in range(0, n_kchunks, chunks_per_bank):
        group = range(c0, min(n_kchunks, c0 + chunks_per_bank))
        k_tok = []
        for c in group:
            t0 = c * K_CHUNK
            kc = min(K_CHUNK, Sk - t0)
            tile = nl.ndarray((K_CHUNK, n_heads * D), dtype=dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=tile[:kc], src=_seq_view(k, layout, b, t0, t0 + kc, g0, g0 + n_heads))
            nisa.dma_copy(dst=v_sb[:kc, c], src=_seq_view(v, layout, b, t0, t0 + kc, g0, g0 + n_heads))
            k_tok.append((tile, kc))
        k0 = c0 * K_CHUNK
        n_group_keys = sum(kc for _, kc in k_tok)
        for col, src, width in units:
            kt_psum = nl.ndarray((P_MAX, chunks_per_bank * K_CHUNK), dtype=dtype, buffer=nl.psum)
            for j, (tile, kc) in enumerate(k_tok):
                nisa.nc_transpose(dst=kt_psum[:width, j * K_CHUNK:j * K_CHUNK + kc], data=tile[:kc, src:src + width])
            nisa.tensor_copy(dst=k_t[:width, col, k0:k0 + n_group_keys], src=kt_psum[:width, :n_group_keys])
    return k_t, v_sb


def _load_q_transposed(q, layout, b, h0, n_heads, q0, mq, D, dtype, units, scale):
    """Q^T * scale for heads [h0, h0 + n_heads) and query rows [q0, q0 + mq): [P_MAX, n_cols, Q_TILE]."""
    q_tok = nl.ndarray((Q_TILE, n_heads * D), dtype=dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=q_tok[:mq], src=_seq_view(q, layout, b, q0, q0 + mq, h0, h0 + n_heads))
    n_cols = units[-1][0] + 1
    q_t = nl.ndarray((P_MAX, n_cols, Q_TILE), dtype=dtype, buffer=nl.sbuf)
    per_bank = PSUM_BANK_BYTES // (Q_TILE * _itemsize(dtype))
    for u0 in range(0, len(units), per_bank):
        batch = units[u0:u0 + per_bank]
        qt_psum = nl.ndarray((P_MAX, per_bank, Q_TILE), dtype=dtype, buffer=nl.psum)
        rows = max(width for _, _, width in batch)
        for j, (col, src, width) in enumerate(batch):
            nisa.nc_transpose(dst=qt_psum[:width, j, :mq], data=q_tok[:mq, src:src + width])
        # Rows above a unit's width hold stale PSUM data; they are copied but never read.
        c0, n = batch[0][0], len(batch)
        nisa.activation(dst=q_t[:rows, c0:c0 + n, :mq], op=nl.copy, data=qt_psum[:rows, :n, :mq], scale=float(scale))
    return q_t


def _load_mask(mask, b, h, q0, mq, k0, nk):
    """The additive mask for query rows [q0, q0 + mq) and keys [k0, k0 + nk) as [Q_TILE, nk] fp32."""
    bm = b if mask.shape[0] > 1 else 0
    hm = h if mask.shape[1] > 1 else 0
    tile = nl.ndarray((Q_TILE, nk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile[:mq], src=mask[bm, hm, q0:q0 + mq, k0:k0 + nk])
    return tile


def _attend_head(q_t, q_chunks, k_t, k_chunks, v_sb, gl, o_sb, lse_sb, hl, mask, shared_mask, causal_bias,
                 b, h, q0, mq, n_keys, D, dtype):
    """softmax(Q K^T + masks) V for one query head and query tile into o_sb[:mq, hl, :]."""
    n_blocks = math.ceil(n_keys / KV_BLOCK)
    pt_per_bank = PSUM_BANK_BYTES // (Q_TILE * _itemsize(dtype))
    neg_max = row_sum = acc = None
    for blk in range(n_blocks):
        kb0 = blk * KV_BLOCK
        nb = min(KV_BLOCK, n_keys - kb0)
        # S = (scale Q) K^T in fp32 PSUM, SCORE_COLS keys per matmul, contraction split over D chunks.
        scores = nl.ndarray((Q_TILE, nb), dtype=nl.float32, buffer=nl.psum)
        for c0 in range(0, nb, SCORE_COLS):
            w = min(SCORE_COLS, nb - c0)
            for i in range(len(q_chunks)):
                qc, qr, rows = q_chunks[i]
                kc, kr, _ = k_chunks[i]
                nisa.nc_matmul(dst=scores[:mq, c0:c0 + w], stationary=q_t[qr:qr + rows, qc, :mq],
                               moving=k_t[kr:kr + rows, kc, kb0 + c0:kb0 + c0 + w], accumulate=i > 0)
        if mask is not None:
            mask_tile = shared_mask if (shared_mask is not None and n_blocks == 1) else \
                _load_mask(mask, b, h, q0, mq, kb0, nb)
            nisa.tensor_tensor(dst=scores[:mq, :nb], data1=scores[:mq, :nb], data2=mask_tile[:mq, :nb], op=nl.add)
        if causal_bias is not None and kb0 <= q0 < kb0 + nb:
            d0, d1 = q0 - kb0, n_keys - kb0     # the diagonal tile; keys beyond q0 + mq were skipped
            nisa.tensor_tensor(dst=scores[:mq, d0:d1], data1=scores[:mq, d0:d1], data2=causal_bias[:mq, :d1 - d0],
                               op=nl.add)

        block_neg_max = nl.ndarray((Q_TILE, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=block_neg_max[:mq], op=nl.maximum, data=scores[:mq, :nb], axis=1, negate=True,
                           keepdims=True)
        alpha = None
        if blk == 0:
            neg_max = block_neg_max
        else:
            # Online softmax: m_new = max(m_old, m_block); alpha = exp(m_old - m_new).
            new_neg_max = nl.ndarray((Q_TILE, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=new_neg_max[:mq], data1=neg_max[:mq], data2=block_neg_max[:mq], op=nl.minimum)
            alpha = nl.ndarray((Q_TILE, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=alpha[:mq], op=nl.exp, data=neg_max[:mq], scale=-1.0, bias=new_neg_max[:mq])
            neg_max = new_neg_max

        probs = nl.ndarray((Q_TILE, nb), dtype=dtype, buffer=nl.sbuf)
        block_sum = nl.ndarray((Q_TILE, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=probs[:mq], op=nl.exp, data=scores[:mq, :nb], bias=neg_max[:mq], reduce_op=nl.add,
                        reduce_res=block_sum[:mq], reduce_cmd=nisa.reduce_cmd.reset_reduce)

        # O_block = P V: P^T chunks by TensorE transposes (one PSUM bank per group), then matmuls
        # accumulating over the block's 128-key chunks.
        o_psum = nl.ndarray((Q_TILE, D), dtype=nl.float32, buffer=nl.psum)
        n_chunks = math.ceil(nb / K_CHUNK)
        for g0 in range(0, n_chunks, pt_per_bank):
            group = range(g0, min(n_chunks, g0 + pt_per_bank))
            pt_psum = nl.ndarray((K_CHUNK, pt_per_bank, Q_TILE), dtype=dtype, buffer=nl.psum)
            for j, c in enumerate(group):
                kc = min(K_CHUNK, nb - c * K_CHUNK)
                nisa.nc_transpose(dst=pt_psum[:kc, j, :mq], data=probs[:mq, c * K_CHUNK:c * K_CHUNK + kc])
            # Partitions past a ragged chunk's kc hold stale PSUM data; copied, never read.
            pt_sb = nl.ndarray((K_CHUNK, pt_per_bank, Q_TILE), dtype=dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=pt_sb[:, :len(group), :mq], src=pt_psum[:, :len(group), :mq])
            for j, c in enumerate(group):
                kc = min(K_CHUNK, nb - c * K_CHUNK)
                nisa.nc_matmul(dst=o_psum[:mq], stationary=pt_sb[:kc, j, :mq],
                               moving=v_sb[:kc, (kb0 + c * K_CHUNK) // K_CHUNK, gl, :], accumulate=c > 0)

        if blk == 0:
            row_sum = block_sum
            if n_blocks > 1:
                acc = nl.ndarray((Q_TILE, D), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_copy(dst=acc[:mq], src=o_psum[:mq])
        else:
            new_sum = nl.ndarray((Q_TILE, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.scalar_tensor_tensor(dst=new_sum[:mq], data=row_sum[:mq], op0=nl.multiply, operand0=alpha[:mq],
                                      op1=nl.add, operand1=block_sum[:mq])
            row_sum = new_sum
            nisa.scalar_tensor_tensor(dst=acc[:mq], data=acc[:mq], op0=nl.multiply, operand0=alpha[:mq],
                                      op1=nl.add, operand1=o_psum[:mq])

    inv_sum = nl.ndarray((Q_TILE, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=inv_sum[:mq], data=row_sum[:mq])
    # Normalisation fused into the PSUM (or accumulator) -> SBUF eviction, cast to the output dtype.
    nisa.activation(dst=o_sb[:mq, hl, :], op=nl.copy, data=(o_psum if n_blocks == 1 else acc)[:mq], scale=inv_sum[:mq])
    if lse_sb is not None:
        log_sum = nl.ndarray((Q_TILE, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=log_sum[:mq], op=nl.log, data=row_sum[:mq])
        nisa.tensor_tensor(dst=lse_sb[:mq, hl:hl + 1], data1=log_sum[:mq], data2=neg_max[:mq], op=nl.subtract)
