"""Shared pieces of the NKI attention kernel (``attention.py``): tile sizes, PSUM budgets and the loads,
stores and bookkeeping that both schedules use.

- Tile sizes: 128 partitions (``P_MAX``) per query tile / key chunk / contraction chunk, ``SCORE_COLS``
  (512) keys per QK^T matmul = one 2 KiB PSUM bank of fp32, ``KV_BLOCK`` keys softmaxed at once.
- Loads: K^T / Q^T with D on partitions, by DMA transposes (trn2+) or TensorE transposes (trn1),
  laid out by ``_transpose_plan``; V with a ones column (so the PV matmul also yields the row sums).
- The lse queue (``_flush_lse`` / ``_store_lse``): a stored tile's lse is issued a few pipeline steps
  later so that ScalarE does not wait for that tile's 1/l.
- Engine balancing (``_charge`` / ``_cheaper_on_vector``): a trace-time tally of booked VectorE and
  ScalarE work that places each PSUM -> SBUF copy on the engine that is less busy.

Underscored names are internal to the kernel package (not API); the entry point is
``attention.attention_fwd``.
"""

import math

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


def _itemsize(dtype):
    return 4 if dtype == nl.float32 else 2


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


# ---- loads ------------------------------------------------------------------------------------------

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


# ---- lse queue and engine balancing -----------------------------------------------------------------

def _flush_lse(ctx, min_age=0):
    """Issue the lse of tiles stored at least ``min_age`` pipeline steps ago."""
    keep = []
    for step, tile in ctx["lse_pending"]:
        if ctx["step"] - step >= min_age:
            _store_lse(tile, ctx)
        else:
            keep.append((step, tile))
    ctx["lse_pending"] = keep


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
