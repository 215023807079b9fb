"""The custom op: registration under the _ops namespace, opcheck, torch.compile, autograd."""

import pytest
import torch

import neuron_vit_attn as nva
from neuron_vit_attn import _op
from neuron_vit_attn._ops import _OPS_NAME, ops
from ops_cases import make_qkv, sdpa64


def test_op_is_named_through_the_ops_namespace():
    assert _op.OP_NAME == f"{_OPS_NAME}::attention_fwd"
    assert ops.attention_fwd.default.name() == _op.OP_NAME
    for key in ("CPU", "PrivateUse1", "Meta", "Autograd"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(_op.OP_NAME, key), key


def _op_samples():
    gen = torch.Generator().manual_seed(3)
    q, k, v = make_qkv(2, 4, 2, 6, 10, 32, requires_grad=True)
    yield q, k, v, torch.randn(1, 4, 6, 10, generator=gen, requires_grad=True), 0.2, False
    yield q, k, v, None, 0.17, True
    yield q, k, v, None, 0.17, True, True          # return_lse: (B, Hq, Sq) lse instead of the empty placeholder
    qs, ks, vs = make_qkv(1, 3, 3, 7, 7, 32, layout="bshd", requires_grad=True)
    yield qs, ks, vs, torch.randn(1, 1, 7, 7, generator=gen), 0.3, True
    qb, kb, vb = make_qkv(1, 2, 2, 5, 5, 32, dtype=torch.bfloat16, layout="bshd")
    yield qb, kb, vb, None, 0.125, False


@pytest.mark.parametrize("args", list(_op_samples()), ids=["gqa-mask", "causal", "causal-lse", "bshd-mask-causal", "bf16"])
def test_opcheck(args):
    torch.library.opcheck(ops.attention_fwd.default, args)


@pytest.mark.parametrize("layout,expect_stride", [("bhsd", (2 * 8 * 32, 8 * 32, 32, 1)),
                                                  ("bshd", (8 * 2 * 32, 32, 2 * 32, 1))])
def test_output_keeps_the_query_layout_and_is_fresh(layout, expect_stride):
    q, k, v = make_qkv(1, 2, 2, 8, 8, 32, layout=layout)
    out = nva.attention(q, k, v)
    assert out.shape == (1, 2, 8, 32) and out.stride() == expect_stride
    assert all(out.untyped_storage().data_ptr() != t.untyped_storage().data_ptr() for t in (q, k, v))


def test_compile_fullgraph_on_cpu():
    q, k, v = make_qkv(2, 4, 2, 9, 9, 32, layout="bshd")
    mask = torch.rand(9, 9) > 0.2
    mask[:, 0] = True

    def fn(q, k, v, mask):
        return nva.attention(q, k, v, mask, is_causal=True, enable_gqa=True) * 2

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, mask), fn(q, k, v, mask), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(compiled(q, k, v, mask).double(), 2 * sdpa64(q, k, v, mask, is_causal=True,
                                                                            enable_gqa=True), rtol=1e-5, atol=1e-5)


def test_compile_fullgraph_backward():
    q, k, v = make_qkv(1, 2, 2, 6, 6, 32, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: nva.attention(q, k, v).sum(), fullgraph=True)
    grads = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    expected = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(q, k, v).sum(), (q, k, v))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_gradcheck_float64(layout):
    q, k, v = make_qkv(1, 2, 1, 3, 4, 8, dtype=torch.float64, layout=layout, requires_grad=True)
    mask = torch.randn(1, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v, m: nva.attention(q, k, v, m, is_causal=True, enable_gqa=True),
                                    (q, k, v, mask))


def test_gradcheck_through_lse():
    """The lse output is differentiable too (the backward feeds grad_lse into the recompute)."""
    q, k, v = make_qkv(1, 2, 2, 4, 5, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: ops.attention_fwd(q, k, v, None, 0.3, False, True)[1], (q, k, v))


def test_gradients_match_sdpa_with_bool_mask():
    q, k, v = make_qkv(2, 2, 2, 7, 7, 16, dtype=torch.float64, layout="bshd", requires_grad=True)
    mask = torch.rand(2, 1, 7, 7) > 0.3
    mask[..., 0] = True
    grad_out = torch.randn(2, 2, 7, 16, dtype=torch.float64)
    got = torch.autograd.grad(nva.attention(q, k, v, mask), (q, k, v), grad_out)
    want = torch.autograd.grad(sdpa64(q, k, v, mask), (q, k, v), grad_out)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)
