"""Transposed-softmax schedule of the NKI attention kernel (``attention.py``): P^T straight out of the
exponential, for plain 16-bit calls (no mask, not causal, Sk <= 1536, D < 128, trn2+).

The scores are computed a second time, already transposed, so that the exponential writes P^T to
SBUF for the PV matmul and P never goes through TensorE transposes and PSUM evictions:
    K_aug^T = [K^T; 1], Q_aug^T = [Q^T; -m]    D + 1 rows (DMA transposes; row D: ones / later -m)
    1. S = Q K^T per query tile; -m = -rowmax(S), rounded to the input dtype (rowmin for scale < 0)
    2. -m as a row: TensorE transpose, one PSUM copy, one DMA into row D of Q_aug^T
    3. S^T - m = K_aug Q_aug^T (contraction D + 1); P^T = exp(scale (S^T - m)) on ScalarE
    4. [O | l] = P [V | 1]; out = O / l after the last head group (in the program's last block after
       each head group); the tile's store
Units of (batch, kv-head group, query block of Q_BLOCK, head group) run software-pipelined over these
four stages. Any stabiliser close to the row max gives the same softmax, so m needs no more precision
than the input dtype; lse uses the m that was actually subtracted.
"""

import math

import nki.isa as nisa
import nki.language as nl

from .attention_tiles import (K_CHUNK, MAX_GROUP_HEADS, P_MAX, PSUM_BANK_BYTES, Q_TILE, SCORE_COLS,
                              SCORE_TILE_BYTES, TINY_INSTRUCTION_CYCLES, _charge, _cheaper_on_vector,
                              _flush_lse, _itemsize, _load_v_with_ones, _seq_view)

Q_BLOCK = 3 * Q_TILE                            # queries per S^T matmul (its moving side)
ST_BANKS = 2                                    # PSUM banks of a unit's S^T per key chunk
LSE_DELAY_UNITS = 4                             # steps between a tile's store and its lse
EXP_LAG = 1                                     # steps between the -m row DMA and S^T
UNIT_MIN_HEADS = 3                              # heads per pipeline unit, at least ...
UNIT_SCORES = 3 * 197 * 197                     # ... and enough for ~116K scores (3 ViT-B heads): the
                                                # unit size that overlaps the stages best (cost model)


def use_transposed_softmax(ctx, mask, is_causal, Sk):
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


def attend_transposed(ctx, Sq):
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
    for b, g0 in ctx["groups"]:
        kv = {"b": b, "g0": g0, "k_aug": None, "v_aug": None}
        for t0 in range(0, Sq, Q_BLOCK):
            blk = {"kv": kv, "b": b, "h0": g0 * rep, "t0": t0, "nq": min(Q_BLOCK, Sq - t0), "q_aug": None}
            for hs in range(0, q_group, heads):
                units.append({"blk": blk, "hs": hs, "heads": min(heads, q_group - hs),
                              "last": hs + heads >= q_group})
    for unit in units:
        unit["blk"]["final"] = unit["blk"] is units[-1]["blk"]
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
    column per kv group; Q_aug^T = [Q^T; -m] per query block (row D written later). The DMA
    transposes of the first pipeline unit's heads of K and Q go before the bulk of either, so that
    the first S matmul does not wait for all heads."""
    kv, dtype, D, Sk, layout = blk["kv"], ctx["dtype"], ctx["D"], ctx["Sk"], ctx["layout"]
    k_moves, q_moves = [], []
    if kv["k_aug"] is None:
        b, g0, n = kv["b"], kv["g0"], ctx["kv_group"]
        kv["k_aug"] = nl.ndarray((D + 1, n, Sk), dtype=dtype, buffer=nl.sbuf)
        first = ctx["unit_heads"] if (kv["b"], kv["g0"]) == ctx["groups"][0] and ctx["rep"] == 1 else 0
        k_moves = _head_transposes(kv["k_aug"], ctx["k"], layout, b, 0, Sk, g0, n, first)
    if blk["q_aug"] is None:
        b, h0, t0, nq, n = blk["b"], blk["h0"], blk["t0"], blk["nq"], ctx["q_group"]
        blk["q_aug"] = nl.ndarray((D + 1, n, nq), dtype=dtype, buffer=nl.sbuf)
        first = ctx["unit_heads"] if (b, h0 // ctx["rep"], t0) == (*ctx["groups"][0], 0) else 0
        q_moves = _head_transposes(blk["q_aug"], ctx["q"], layout, b, t0, nq, h0, n, first)
        n_tiles = math.ceil(nq / Q_TILE)
        blk["neg_stat"] = nl.ndarray((Q_TILE, n_tiles, n), dtype=dtype, buffer=nl.sbuf)
        blk["tiles"] = []
        for q0 in range(t0, t0 + nq, Q_TILE):
            blk["tiles"].append({"b": b, "h0": h0, "q0": q0, "mq": min(Q_TILE, t0 + nq - q0),
                                 "o_acc": nl.ndarray((Q_TILE, n, D + 1), dtype=nl.float32, buffer=nl.sbuf),
                                 "o_sb": nl.ndarray((Q_TILE, n, D), dtype=dtype, buffer=nl.sbuf),
                                 "inv_sum": nl.ndarray((Q_TILE, n), dtype=nl.float32, buffer=nl.sbuf)})
    for dst, src in k_moves[:1] + q_moves[:1] + k_moves[1:] + q_moves[1:]:
        nisa.dma_transpose(dst=dst, src=src)
    if k_moves:
        if ctx["ones_row"] is None:
            # A memset costs one cycle per element of a partition, whatever the partition count: set the
            # ones once with one head per partition ([n, Sk], not [1, n * Sk]), and move them by DMA.
            ctx["ones_row"] = nl.ndarray((ctx["kv_group"], Sk), dtype=dtype, buffer=nl.sbuf)
            nisa.memset(dst=ctx["ones_row"], value=1.0, engine=nisa.engine.gpsimd)
        nisa.dma_copy(dst=kv["k_aug"][D:D + 1], src=ctx["ones_row"], dge_mode=nisa.dge_mode.hwdge)
    if kv["v_aug"] is None:      # after Q and K: PV needs V three steps later than S needs Q and K
        kv["v_aug"] = _load_v_with_ones(ctx["v"], ctx, kv["b"], kv["g0"], ctx["kv_group"])


def _head_transposes(x_aug, x, layout, b, t0, n_tok, h0, n_heads, first_heads=0):
    """The (dst, src) DMA transposes that fill x_aug[:D, j, :] with tokens [t0, t0 + n_tok) of head
    h0 + j: in "bshd" one for all heads (a token's heads are contiguous), or two when ``first_heads``
    asks for those heads on their own first; in "bhsd" one per head (each head is contiguous)."""
    D = x.shape[-1]
    if layout == "bshd":
        spans = ((0, first_heads), (first_heads, n_heads)) if 0 < first_heads < n_heads else ((0, n_heads),)
        return [(x_aug[:D, j0:j1, :n_tok], x[b, t0:t0 + n_tok, h0 + j0:h0 + j1, :]) for j0, j1 in spans]
    return [(x_aug[:D, j, :n_tok], x[b, h0 + j, t0:t0 + n_tok, :]) for j in range(n_heads)]


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
        # Normally all heads of a tile at once, after its last head group; in the program's last block
        # each head group as it completes, so that the kernel's tail waits for one group, not all.
        if unit["last"] or blk["final"]:
            h_lo, h_hi = (hs, hs + heads) if blk["final"] else (0, ctx["q_group"])
            if unit["last"] and ctx["lse"] is not None:
                # lse needs -(max of scale * S) = scale * (-m) (GpSimd, before it waits for 1/l).
                tile["neg_max"] = nl.ndarray((Q_TILE, ctx["q_group"]), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_scalar(dst=tile["neg_max"][:mq], data=blk["neg_stat"][:mq, tq // Q_TILE],
                                   op0=nl.multiply, operand0=ctx["scale"], engine=nisa.engine.gpsimd)
            inv_sum = tile["inv_sum"][:mq, h_lo:h_hi]
            nisa.activation(dst=inv_sum, op=nl.reciprocal, data=tile["o_acc"][:mq, h_lo:h_hi, D])
            _charge(ctx, "scalar", TINY_INSTRUCTION_CYCLES)
            nisa.tensor_tensor(dst=tile["o_sb"][:mq, h_lo:h_hi], data1=tile["o_acc"][:mq, h_lo:h_hi, :D],
                               data2=inv_sum.expand_dim(2).broadcast(2, D), op=nl.multiply,
                               engine=nisa.engine.gpsimd)
            _store_transposed_tile(tile, ctx, h_lo, h_hi, queue_lse=unit["last"])


def _store_transposed_tile(tile, ctx, h_lo, h_hi, queue_lse):
    """Store heads [h_lo, h_hi) of an output tile; once the tile is complete (``queue_lse``) its lse
    is queued for _store_lse (issued LSE_DELAY_UNITS steps later)."""
    b, h0, q0, mq = tile["b"], tile["h0"], tile["q0"], tile["mq"]
    nisa.dma_copy(dst=_seq_view(ctx["out"], ctx["layout"], b, q0, q0 + mq, h0 + h_lo, h0 + h_hi),
                  src=tile["o_sb"][:mq, h_lo:h_hi])
    if queue_lse and ctx["lse"] is not None:
        ctx["lse_pending"].append((ctx["step"], tile))
