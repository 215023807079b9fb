"""kernels/attention.py (attention_fwd) run by nkisim against torch SDPA in float64.

Shapes are real vision-model attention shapes (tokens, head dim) with few heads and batch 1-2 so
that the simulation stays fast, plus the edge cases of the contract: S=1, Sq != Sk, head dims
above 128, GQA, causal (with and without a mask), broadcast masks, both layouts, lse, and key
ranges above KV_BLOCK (online softmax).

Tolerances, by input dtype (errors measured are well below them):
* bfloat16: inputs, scale*Q and the probabilities P fed to the PV matmul are rounded to bf16
  (8-bit mantissa, relative error 2^-9 each) with fp32 accumulation, so outputs and lse carry
  ~2^-8 relative error per element -> atol = rtol = 2e-2.
* float16: the same roundings with an 11-bit mantissa (2^-12) -> atol = rtol = 3e-3.
* float32: fp32 everywhere; the errors are accumulation-order and exp rounding, ~1e-6 -> 1e-5.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import nkisim

TOLERANCE = {"bfloat16": 2e-2, "float16": 3e-3, "float32": 1e-5}
DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}


def _load_kernel_module():
    """kernels/attention.py as the op layer imports it: ``neuron_vit_attn._nki`` is a link to kernels/,
    whose modules import each other relatively (pytest's pythonpath has torch_ext)."""
    nkisim.install()     # `import nki` inside the kernel resolves to nkisim
    from neuron_vit_attn._nki import attention as module
    return module


attention = _load_kernel_module()


def make_inputs(batch, q_heads, kv_heads, q_len, kv_len, head_dim, dtype, layout, mask_shape=None, seed=0,
                q_gain=1.0):
    rng = np.random.default_rng(seed)
    if layout == "bshd":
        q_shape, kv_shape = (batch, q_len, q_heads, head_dim), (batch, kv_len, kv_heads, head_dim)
    else:
        q_shape, kv_shape = (batch, q_heads, q_len, head_dim), (batch, kv_heads, kv_len, head_dim)
    q = (q_gain * rng.standard_normal(q_shape)).astype(DTYPES[dtype])
    k = rng.standard_normal(kv_shape).astype(DTYPES[dtype])
    v = rng.standard_normal(kv_shape).astype(DTYPES[dtype])
    mask = None
    if mask_shape is not None:
        mask = rng.standard_normal(tuple(mask_shape) + (q_len, kv_len)).astype(np.float32)
        # Hide every third key of every second query row (never a whole row).
        mask[..., 1::2, 2::3] = -np.inf
    return q, k, v, mask


def reference(q, k, v, mask, scale, is_causal, layout):
    """(out in q's layout, lse (B, Hq, Sq)) in float64: SDPA for out, explicit logsumexp for lse."""
    q64, k64, v64 = (torch.from_numpy(np.asarray(x, dtype=np.float64)) for x in (q, k, v))
    if layout == "bshd":
        q64, k64, v64 = (x.transpose(1, 2) for x in (q64, k64, v64))
    q_len, kv_len = q64.shape[2], k64.shape[2]
    bias = torch.zeros(q_len, kv_len, dtype=torch.float64)
    if mask is not None:
        bias = bias + torch.from_numpy(mask.astype(np.float64))
    if is_causal:   # SDPA's top-left aligned causal mask, merged so that it combines with `mask`
        bias = bias.masked_fill(~torch.ones(q_len, kv_len, dtype=torch.bool).tril(), float("-inf"))
    out = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, attn_mask=bias, scale=scale,
                                                           enable_gqa=True)
    rep = q64.shape[1] // k64.shape[1]
    scores = q64 @ k64.repeat_interleave(rep, 1).transpose(-1, -2) * scale + bias
    lse = torch.logsumexp(scores, dim=-1)
    if layout == "bshd":
        out = out.transpose(1, 2)
    return out.numpy(), lse.numpy()


def run_and_check(batch, q_heads, kv_heads, q_len, kv_len, head_dim, dtype="bfloat16", layout="bshd",
                  is_causal=False, mask_shape=None, q_gain=1.0, tol=None, lnc=1):
    q, k, v, mask = make_inputs(batch, q_heads, kv_heads, q_len, kv_len, head_dim, dtype, layout, mask_shape,
                                q_gain=q_gain)
    scale = 1.0 / np.sqrt(head_dim)
    with nkisim.trace() as trace:
        out, lse = nkisim.simulate(attention.attention_fwd[lnc])(q, k, v, mask, scale=scale, is_causal=is_causal,
                                                                 layout=layout, return_lse=True)
    ref_out, ref_lse = reference(q, k, v, mask, scale, is_causal, layout)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (batch, q_heads, q_len) and lse.dtype == np.float32
    tol = TOLERANCE[dtype] if tol is None else tol
    np.testing.assert_allclose(out.astype(np.float64), ref_out, atol=tol, rtol=tol)
    np.testing.assert_allclose(lse.astype(np.float64), ref_lse, atol=tol, rtol=tol)
    return trace


# (batch, q heads, kv heads, q len, kv len, head dim): tokens and head dims of real models.
MODEL_SHAPES = {
    "vit_b16_224": (2, 3, 3, 197, 197, 64),
    "vit_l14_336": (1, 2, 2, 577, 577, 64),
    "siglip_so400m_384": (1, 2, 2, 729, 729, 72),
    "dinov2_224": (2, 2, 2, 257, 257, 64),
    "clip_b32_224": (2, 4, 4, 50, 50, 64),
    "vit_h14_224": (1, 2, 2, 257, 257, 80),
    "qwen2_vl_vision": (1, 2, 2, 1024, 1024, 80),
    "head_dim_128": (1, 2, 2, 300, 300, 128),
    "head_dim_256": (1, 2, 2, 200, 200, 256),
}


# Every model shape in both layouts in bfloat16 (the dtype vision models run in); float16 and
# float32 on the smaller shapes, one layout each, so that the suite stays fast.
MODEL_CASES = ([(model, layout, "bfloat16") for model in MODEL_SHAPES for layout in ("bshd", "bhsd")]
               + [(model, "bshd", "float16") for model in ("vit_b16_224", "vit_h14_224", "head_dim_256")]
               + [(model, "bhsd", "float32") for model in ("clip_b32_224", "dinov2_224", "head_dim_128")])


@pytest.mark.parametrize("model,layout,dtype", MODEL_CASES)
def test_model_shapes(model, layout, dtype):
    run_and_check(*MODEL_SHAPES[model], dtype=dtype, layout=layout)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_single_token(layout, dtype):
    run_and_check(2, 4, 4, 1, 1, 64, dtype=dtype, layout=layout)


@pytest.mark.parametrize("q_len,kv_len", [(130, 390), (300, 77), (1, 257), (197, 1)])
def test_query_and_key_lengths_differ(q_len, kv_len):
    run_and_check(1, 2, 2, q_len, kv_len, 64)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("q_heads,kv_heads", [(8, 2), (4, 1), (2, 2)])
def test_causal_prefill_gqa(layout, q_heads, kv_heads):
    run_and_check(1, q_heads, kv_heads, 300, 300, 64, layout=layout, is_causal=True)


@pytest.mark.parametrize("q_len,kv_len", [(100, 300), (300, 100)])
def test_causal_query_and_key_lengths_differ(q_len, kv_len):
    run_and_check(1, 2, 2, q_len, kv_len, 80, dtype="float16", is_causal=True)


@pytest.mark.parametrize("mask_shape", [(1, 1), (2, 1), (1, 3), (2, 3)])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_broadcast_masks(mask_shape, layout):
    run_and_check(2, 3, 3, 150, 197, 64, layout=layout, mask_shape=mask_shape)


@pytest.mark.parametrize("mask_shape", [(1, 1), (1, 4)])
def test_mask_with_causal_and_gqa(mask_shape):
    run_and_check(1, 4, 2, 200, 200, 64, dtype="float32", is_causal=True, mask_shape=mask_shape)


def test_large_scores_are_stable():
    # Scores of magnitude ~100 (after scaling): exp overflows unless the row max is subtracted.
    # fp32 scores that large carry absolute errors ~|s| * 2^-24 * sqrt(D) ~ 1e-5, which exp turns
    # into relative output errors of that size: 1e-4.
    run_and_check(1, 2, 2, 197, 197, 64, dtype="float32", q_gain=40.0, tol=1e-4)


@pytest.mark.parametrize("is_causal,mask_shape", [(False, None), (True, None), (False, (1, 2))])
def test_keys_beyond_one_block_use_online_softmax(is_causal, mask_shape):
    kv_len = attention.KV_BLOCK + 252
    q_len = kv_len if is_causal else 140
    trace = run_and_check(1, 2, 1, q_len, kv_len, 64, is_causal=is_causal, mask_shape=mask_shape)
    # The online update rescales with exp(m_old - m_new): an exp on a [P, 1] statistics tile.
    assert any(i.name == "activation" and i.attrs["op"] == "exp" and i.operand("data").free_elems == 1
               for i in trace)


@pytest.mark.parametrize("scale", [-0.3, 0.0])
def test_non_positive_scale(scale):
    # scale is folded into Q before the row max, so any finite scale works (0: uniform weights).
    q, k, v, mask = make_inputs(1, 2, 2, 150, 197, 64, "float32", "bshd", mask_shape=(1, 1))
    out, lse = nkisim.simulate(attention.attention_fwd)(q, k, v, mask, scale=scale, layout="bshd", return_lse=True)
    ref_out, ref_lse = reference(q, k, v, mask, scale, False, "bshd")
    np.testing.assert_allclose(out.astype(np.float64), ref_out, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(lse.astype(np.float64), ref_lse, atol=1e-5, rtol=1e-5)


def test_return_lse_false_returns_only_the_output():
    q, k, v, _ = make_inputs(1, 2, 2, 64, 64, 64, "bfloat16", "bhsd")
    out = nkisim.simulate(attention.attention_fwd)(q, k, v, scale=0.125)
    assert isinstance(out, np.ndarray) and out.shape == q.shape
    ref_out, _ = reference(q, k, v, None, 0.125, False, "bhsd")
    np.testing.assert_allclose(out.astype(np.float64), ref_out, atol=2e-2, rtol=2e-2)


def test_vit_b16_full_size_runs_the_nki_instructions():
    """The performance shape (B=8, 197 tokens, 12 heads, D=64, bf16, bshd) within SBUF/PSUM limits,
    and what ran (the transposed softmax): S = QK^T on TensorE with the row max on VectorE (several
    heads per instruction), S^T - m by a D + 1 contraction, exp on ScalarE writing P^T to SBUF
    (no P^T transposes), PV on TensorE, Q/K by DMA transpose (trn2), large DMAs, no HBM round trip."""
    trace = run_and_check(8, 12, 12, 197, 197, 64)
    by_name = {}
    for instr in trace:
        by_name.setdefault((instr.engine, instr.name), []).append(instr)
    matmuls = by_name[("tensor", "nc_matmul")]
    assert all(i.operand("dst").buffer == "psum" for i in matmuls)
    # PV matmuls multiply by [V | 1]: D + 1 columns, the last one giving the softmax row sums.
    assert sum(1 for i in matmuls if i.attrs["n"] == 65) == 8 * 12 * 2 * 2     # (b, h, q tile, key chunk)
    # S^T - m: contraction over D + 1 rows (the -m row of Q_aug against the ones row of K_aug),
    # all 197 queries as the moving side, one per (b, h, key chunk).
    transposed_scores = [i for i in matmuls if i.attrs["k"] == 65]
    assert len(transposed_scores) == 8 * 12 * 2 and all(i.attrs["n"] == 197 for i in transposed_scores)
    # TensorE transposes only move the -m columns (a few heads wide), never P.
    assert all(i.operand("data").free_elems <= 12 for i in by_name[("tensor", "nc_transpose")])
    exps = [i for i in by_name[("scalar", "activation")] if i.attrs["op"] == "exp"]
    assert len(exps) == 8 * 4 * 2           # one per (batch, unit of 3 heads, key chunk)
    assert all(i.operand("data").buffer == "psum" and i.operand("dst").buffer == "sbuf"
               and i.operand("data").free_elems == 3 * 197 for i in exps)
    reduces = by_name[("vector", "tensor_reduce")]
    assert all(i.operand("data").free_elems % 197 == 0 and i.operand("data").free_elems > 197 for i in reduces)
    assert ("dma", "dma_transpose") in by_name
    # No HBM round trip: HBM traffic is exactly q, k, v, out and lse.
    hbm = sum(o.nbytes for i in trace if i.engine == "dma" for o in i.operands if o.buffer.endswith("hbm"))
    assert hbm == 4 * 8 * 197 * 12 * 64 * 2 + 8 * 12 * 197 * 4
    # V loads and output stores move all 12 heads of a 128-token tile at once: 1536 B per partition;
    # only the last batch's stores go per unit of 3 heads as each completes (a shorter kernel tail).
    copies = by_name[("dma", "dma_copy")]
    stores = [i for i in copies if i.operand("dst").buffer == "shared_hbm" and i.operand("src").dtype == "bfloat16"]
    loads = [i for i in copies if i.operand("dst").buffer == "sbuf" and i.operand("src").buffer.endswith("hbm")]
    per_partition = lambda i, side: i.operand(side).nbytes // i.operand(side).partitions   # noqa: E731
    assert loads and all(per_partition(i, "dst") == 12 * 64 * 2 for i in loads)
    assert [per_partition(i, "src") for i in stores] == [12 * 64 * 2] * 7 * 2 + [3 * 64 * 2] * 4 * 2


@pytest.mark.parametrize("batch,heads,layout,is_causal,mask_shape", [
    (2, 3, "bshd", False, None),          # transposed softmax: one batch per core
    (1, 4, "bshd", False, None),          # batch 1: the kv heads are split (two groups of 2)
    (1, 2, "bhsd", True, (1, 2)),         # row-tile softmax (causal + mask): one head per core
    (1, 3, "bshd", False, None),          # 3 groups of 1 head: 2 on program 0, 1 on program 1
])
def test_lnc2_splits_the_work_between_the_programs(batch, heads, layout, is_causal, mask_shape):
    """attention_fwd[2]: each program computes its share of (batch, head group) items into the
    shared output; together they match SDPA, and each program did part of the work."""
    trace = run_and_check(batch, heads, heads, 197, 197, 64, layout=layout, is_causal=is_causal,
                          mask_shape=mask_shape, lnc=2)
    matmuls = {p: sum(1 for i in trace if i.name == "nc_matmul" and i.program_id == p) for p in (0, 1)}
    assert matmuls[0] > 0 and matmuls[1] > 0
    assert matmuls[0] == matmuls[1] or heads % 2 == 1


def _ran_transposed_softmax(trace, head_dim):
    return any(i.name == "nc_matmul" and i.attrs["k"] == head_dim + 1 for i in trace)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("q_heads,kv_heads", [(8, 2), (4, 1)])
def test_gqa_without_masks(layout, q_heads, kv_heads):
    # Query head h reads kv head h // (Hq // Hkv) in the transposed softmax's K_aug and V too.
    trace = run_and_check(1, q_heads, kv_heads, 300, 300, 64, layout=layout)
    assert _ran_transposed_softmax(trace, 64)


@pytest.mark.parametrize("scale", [-0.3, 0.0])
def test_non_positive_scale_16bit(scale):
    # The transposed softmax takes the row min as its stabiliser when scale < 0 (the max of
    # scale * S); scale 0 gives uniform weights. Tolerance: bfloat16 (see the module docstring).
    q, k, v, _ = make_inputs(1, 2, 2, 150, 197, 64, "bfloat16", "bshd")
    with nkisim.trace() as trace:
        out, lse = nkisim.simulate(attention.attention_fwd)(q, k, v, scale=scale, layout="bshd", return_lse=True)
    assert _ran_transposed_softmax(trace, 64)
    ref_out, ref_lse = reference(q, k, v, None, scale, False, "bshd")
    tol = TOLERANCE["bfloat16"]
    np.testing.assert_allclose(out.astype(np.float64), ref_out, atol=tol, rtol=tol)
    np.testing.assert_allclose(lse.astype(np.float64), ref_lse, atol=tol, rtol=tol)


def test_large_scores_are_stable_16bit():
    # Scores of magnitude ~100 in bfloat16: the stabiliser m is rounded to bf16 (error up to
    # |m| * 2^-9 ~ 0.25), which any value near the max tolerates; bf16 tolerance as elsewhere.
    trace = run_and_check(1, 2, 2, 197, 197, 64, q_gain=40.0)
    assert _ran_transposed_softmax(trace, 64)


@pytest.mark.parametrize("layout,q_heads,kv_heads,head_dim", [("bshd", 4, 4, 64), ("bhsd", 4, 2, 80)])
def test_trn1_transposes_on_tensor_engine(monkeypatch, layout, q_heads, kv_heads, head_dim):
    # trn1 has no DMA transpose: K^T and Q^T come from TensorE transposes instead.
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    trace = run_and_check(1, q_heads, kv_heads, 197, 197, head_dim, layout=layout)
    assert "dma_transpose" not in trace.names()


def test_trn3(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    run_and_check(1, 4, 4, 197, 197, 64, is_causal=True, mask_shape=(1, 1))


@pytest.mark.parametrize("q_shape,kv_shape,match", [
    ((1, 2, 16, 300), (1, 2, 16, 300), "MAX_HEAD_DIM"),
    ((1, 2, 16, 16), (1, 2, 16, 16), "MAX_HEAD_DIM"),
    ((1, 3, 16, 64), (1, 2, 16, 64), r"Hq % Hkv == 0"),
])
def test_bad_shapes_are_rejected(q_shape, kv_shape, match):
    q = np.zeros(q_shape, ml_dtypes.bfloat16)
    k = np.zeros(kv_shape, ml_dtypes.bfloat16)
    with pytest.raises(AssertionError, match=match):
        nkisim.simulate(attention.attention_fwd)(q, k, k, scale=0.1)


def test_key_length_limit_is_named():
    q = np.zeros((1, 1, 1, 128), ml_dtypes.bfloat16)
    k = np.zeros((1, 1, 20000, 128), ml_dtypes.bfloat16)
    with pytest.raises(AssertionError, match="KV_RESIDENT_BYTES"):
        nkisim.simulate(attention.attention_fwd)(q, k, k, scale=0.1)


@pytest.mark.parametrize("head_dim, itemsize", [(64, 2), (128, 2), (256, 2), (256, 4)])
def test_kv_fits_is_the_kernels_own_key_length_limit(head_dim, itemsize):
    """kv_fits (what callers ask before calling) flips exactly where the trace-time assert starts:
    the longest accepted key sequence passes the input checks, one key more is rejected."""
    longest = 1
    while attention.kv_fits(longest + 1, head_dim, itemsize):
        longest += 1
    assert 1000 < longest < 50000 and not attention.kv_fits(longest + 1, head_dim, itemsize)
    dtype = ml_dtypes.bfloat16 if itemsize == 2 else np.float32
    q = np.zeros((1, 1, 1, head_dim), dtype)
    attention._check_inputs(q, np.zeros((1, 1, longest, head_dim), dtype), np.zeros((1, 1, longest, head_dim), dtype),
                            None, 0.1, "bhsd")
    k = np.zeros((1, 1, longest + 1, head_dim), dtype)
    with pytest.raises(AssertionError, match="KV_RESIDENT_BYTES"):
        nkisim.simulate(attention.attention_fwd)(q, k, k, scale=0.1)


def test_bad_mask_and_dtypes_are_rejected():
    q = np.zeros((1, 2, 16, 64), ml_dtypes.bfloat16)
    with pytest.raises(AssertionError, match="mask shape"):
        nkisim.simulate(attention.attention_fwd)(q, q, q, np.zeros((1, 3, 16, 16), np.float32))
    with pytest.raises(AssertionError, match="share one dtype"):
        nkisim.simulate(attention.attention_fwd)(q, q.astype(np.float16), q)
    with pytest.raises(AssertionError, match="layout"):
        nkisim.simulate(attention.attention_fwd)(q, q, q, layout="sbhd")
    with pytest.raises(AssertionError, match="scale must be"):
        nkisim.simulate(attention.attention_fwd)(q, q, q, scale=float("nan"))
