"""attention() on CPU with the default backend (the eager reference) against torch's SDPA."""

import pytest
import torch

import neuron_vit_attn as nva
from ops_cases import LAYOUTS, make_qkv, sdpa64

# float64 in, float64 math: only summation-order differences remain.
F64_TOL = dict(rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("q_heads,kv_heads,q_len,kv_len,causal", [
    (3, 3, 17, 17, False),      # plain self-attention
    (4, 2, 9, 13, False),       # GQA, cross lengths
    (4, 1, 12, 12, True),       # multi-query, causal
    (2, 2, 5, 11, True),        # causal with Sq < Sk: top-left aligned as SDPA
    (2, 2, 11, 5, True),        # causal with Sq > Sk: late rows see all keys, none fully masked
])
def test_matches_sdpa_float64(layout, q_heads, kv_heads, q_len, kv_len, causal):
    q, k, v = make_qkv(2, q_heads, kv_heads, q_len, kv_len, 32, dtype=torch.float64, layout=layout)
    gqa = q_heads != kv_heads
    out = nva.attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    ref = sdpa64(q, k, v, is_causal=causal, enable_gqa=gqa)
    assert out.shape == ref.shape and out.dtype == torch.float64
    torch.testing.assert_close(out, ref, **F64_TOL)


@pytest.mark.parametrize("mask_shape", [(7, 9), (1, 7, 9), (2, 1, 7, 9), (1, 3, 7, 9), (2, 3, 7, 9), (2, 1, 1, 9),
                                        (1, 9)])
@pytest.mark.parametrize("kind", ["float", "bool"])
def test_masks_broadcast_like_sdpa(mask_shape, kind):
    q, k, v = make_qkv(2, 3, 3, 7, 9, 16, dtype=torch.float64)
    gen = torch.Generator().manual_seed(5)
    if kind == "bool":
        mask = torch.rand(mask_shape, generator=gen) > 0.3
        mask[..., 0] = True      # at least one key per row: a fully masked row is tested separately
    else:
        mask = torch.randn(mask_shape, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(nva.attention(q, k, v, mask), sdpa64(q, k, v, mask), **F64_TOL)


def test_fully_masked_row_gives_zero_like_sdpa():
    q, k, v = make_qkv(1, 2, 2, 4, 6, 16, dtype=torch.float64)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[2] = False
    out = nva.attention(q, k, v, mask)
    torch.testing.assert_close(out, sdpa64(q, k, v, mask), **F64_TOL)
    assert torch.all(out[:, :, 2] == 0)


def test_float_mask_with_neg_inf_and_causal_combined():
    q, k, v = make_qkv(1, 2, 2, 6, 6, 16, dtype=torch.float64)
    mask = torch.zeros(1, 1, 6, 6, dtype=torch.float64)
    mask[..., 1] = float("-inf")
    torch.testing.assert_close(nva.attention(q, k, v, mask, is_causal=True), sdpa64(q, k, v, mask, is_causal=True),
                               **F64_TOL)


@pytest.mark.parametrize("scale", [0.05, 1.0, 0.3])
def test_scale(scale):
    q, k, v = make_qkv(1, 2, 2, 8, 8, 32, dtype=torch.float64)
    torch.testing.assert_close(nva.attention(q, k, v, scale=scale), sdpa64(q, k, v, scale=scale), **F64_TOL)


def test_value_head_dim_may_differ_like_sdpa():
    q, k, _ = make_qkv(1, 2, 2, 5, 6, 32, dtype=torch.float64)
    v = torch.randn(1, 2, 6, 48, dtype=torch.float64)
    out = nva.attention(q, k, v)
    assert out.shape == (1, 2, 5, 48)
    torch.testing.assert_close(out, sdpa64(q, k, v), **F64_TOL)


# One rounding of the fp32-accumulated result to the input dtype: 2^-8 relative for bf16,
# 2^-11 for fp16; fp32 accumulation over <= 64 keys stays near 1e-6.
@pytest.mark.parametrize("dtype,tol", [(torch.float32, dict(rtol=1e-5, atol=1e-5)),
                                       (torch.bfloat16, dict(rtol=2 ** -7, atol=2 ** -7)),
                                       (torch.float16, dict(rtol=2 ** -10, atol=2 ** -10))])
def test_low_precision_inputs_keep_their_dtype(dtype, tol):
    q, k, v = make_qkv(2, 4, 2, 33, 64, 64, dtype=dtype, layout="bshd")
    out = nva.attention(q, k, v, enable_gqa=True)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), sdpa64(q, k, v, enable_gqa=True), **tol)


def test_attention_reference_is_sdpa_compatible():
    q, k, v = make_qkv(1, 4, 2, 6, 8, 16, dtype=torch.float64)
    mask = torch.rand(6, 8) > 0.2
    mask[:, 0] = True
    out = nva.attention_reference(q, k, v, mask, scale=0.4, is_causal=False, enable_gqa=True)
    torch.testing.assert_close(out, sdpa64(q, k, v, mask, scale=0.4, enable_gqa=True), **F64_TOL)


def test_autocast_runs_in_the_autocast_dtype_like_sdpa():
    q, k, v = make_qkv(1, 2, 2, 8, 8, 32, layout="bshd", requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = nva.attention(q, k, v)
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert out.dtype == sdpa.dtype == torch.bfloat16
    expected = nva.attention(q.detach().bfloat16(), k.detach().bfloat16(), v.detach().bfloat16())
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    out.float().sum().backward()
    assert q.grad.dtype == torch.float32
