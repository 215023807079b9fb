"""Row-tile softmax schedule of the NKI attention kernel (``attention.py``): scores with the queries
on partitions, for every call the transposed schedule does not take (masks, causal, fp32, long key
ranges, D >= 128, trn1).

Per (query tile of 128 tokens, group of query heads sharing one PSUM score tile):
    S = (scale Q) K^T         TensorE, 512-key matmuls into fp32 PSUM (64-dim heads in pairs on PE row tiles)
    S += mask, causal         VectorE, in place in PSUM (causal: only the diagonal key tile)
    m = rowmax(S)             VectorE, one reduction for the head group
    P = exp(S - m)            ScalarE, bias -m fused
    P^T                       TensorE 128x128 transposes, one eviction per PSUM bank
    [O | l] = P [V | 1]       TensorE (the ones column of V yields the row sums l)
    out = O / l               VectorE, PSUM -> SBUF; the tile's store after its last head group
Items run software-pipelined three deep (``_pipeline``). Key ranges above KV_BLOCK use the online
(flash) softmax over key blocks, one head at a time (``_attend_online``): O and l are rescaled by
exp(m_old - m_new). Statistics are fp32; scale*Q and P are rounded to the input dtype.
"""

import math

import nki.isa as nisa
import nki.language as nl

from .attention_tiles import (K_CHUNK, KV_BLOCK, MAX_GROUP_HEADS, P_MAX, PSUM_BANK_BYTES, Q_TILE, SCORE_COLS,
                              SCORE_TILE_BYTES, TINY_INSTRUCTION_CYCLES, _charge, _cheaper_on_vector,
                              _dma_transposed, _flush_lse, _itemsize, _load_v_with_ones, _pe_transposed,
                              _seq_view)

LSE_DELAY_STEPS = 2                             # pipeline steps between a tile's store and its lse
MASKED_SCORE = -3.0e38                          # additive causal mask value (finite; exp() -> 0)


def attend_rows(ctx, Sq, is_causal):
    """The row-tile schedule for all (batch, kv-head group, query tile, head group) work items, in
    loop order: consecutive single-block items run software-pipelined (``_pipeline``), items with
    more than KV_BLOCK keys run alone through the online softmax (``_attend_online``)."""
    Sk, D, rep, flat = ctx["Sk"], ctx["D"], ctx["rep"], ctx["flat"]
    kv_group, q_group = ctx["kv_group"], ctx["q_group"]
    # Work items: (batch, kv-head group, query tile, head group), in loop order.
    items = []
    for b, g0 in ctx["groups"]:
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


def causal_bias_tile():
    """causal_bias[p, j] = 0 where key j <= query p, else MASKED_SCORE: added to the diagonal key tile
    of every query tile (key tiles above the diagonal are skipped)."""
    zeros = nl.ndarray((Q_TILE, K_CHUNK), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=zeros, value=0.0)
    causal_bias = nl.ndarray((Q_TILE, K_CHUNK), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=causal_bias, pattern=[[-1, K_CHUNK]], channel_multiplier=1, on_true_tile=zeros,
                       on_false_value=MASKED_SCORE, cmp_op=nl.greater_equal, offset=0)
    return causal_bias


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


# ---- software pipeline over (query tile, head group) items ------------------------------------------

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


def _load_mask(mask, b, h, q0, mq, k0, nk):
    """The additive mask for query rows [q0, q0 + mq) and keys [k0, k0 + nk) as [Q_TILE, nk] fp32."""
    bm = b if mask.shape[0] > 1 else 0
    hm = h if mask.shape[1] > 1 else 0
    tile = nl.ndarray((Q_TILE, nk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile[:mq], src=mask[bm, hm, q0:q0 + mq, k0:k0 + nk])
    return tile


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


# ---- attention of one (query tile, head group) ------------------------------------------------------

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
