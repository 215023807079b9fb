"""How tensors reach the NKI kernel, checked with a stand-in that honours the kernel's contract
(kernels/attention.py: ``attention_fwd(q, k, v, mask, scale, is_causal, layout, return_lse)``)
and records what it was given: layouts, zero-copy views, mask preparation, both dispatch routes
(CPU with NEURON_VIT_ATTN_BACKEND=sim, and the PrivateUse1 ``neuron`` kernel)."""

import pytest
import torch

import neuron_vit_attn as nva
from neuron_vit_attn import _backend, _op
from neuron_vit_attn.reference import attention_with_lse
from ops_cases import make_qkv, sdpa64


class ContractKernel:
    """Computes the kernel contract with the reference, in the layout it is told, and records calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, mask=None, scale=1.0, is_causal=False, layout="bhsd", return_lse=False):
        self.calls.append(dict(q=q, k=k, v=v, mask=mask, scale=scale, is_causal=is_causal, layout=layout))
        to_bhsd = (lambda t: t.transpose(1, 2)) if layout == "bshd" else (lambda t: t)
        out, lse = attention_with_lse(to_bhsd(q), to_bhsd(k), to_bhsd(v), mask, scale, is_causal)
        out = to_bhsd(out).contiguous()
        return (out, lse) if return_lse else out


@pytest.fixture(params=["sim", "neuron"])
def route(request, monkeypatch, backend):
    """Runs attention through one of the two kernel routes, with the stand-in kernel."""
    kernel = ContractKernel()
    if request.param == "sim":
        backend("sim")
        monkeypatch.setattr(_backend, "simulated_kernel", lambda: kernel)
        run = nva.attention
    else:
        # The PrivateUse1 kernel itself, called with CPU tensors: no neuron device exists here.
        # Its limits come from kernels/attention.py, imported with nkisim standing in for nki.
        import nkisim
        nkisim.install()
        monkeypatch.setattr(_backend, "device_kernel", lambda: kernel)

        def run(q, k, v, attn_mask=None, *, scale=None, is_causal=False, enable_gqa=False):
            from neuron_vit_attn._validation import normalize_mask
            scale = q.shape[-1] ** -0.5 if scale is None else scale
            return _op._attention_fwd_neuron(q, k, v, normalize_mask(attn_mask, q, k), scale, is_causal)[0]
    return run, kernel


def test_transformers_views_reach_the_kernel_without_a_copy(route):
    run, kernel = route
    q, k, v = make_qkv(2, 3, 3, 10, 10, 32, layout="bshd")
    out = run(q, k, v)
    (call,) = kernel.calls
    assert call["layout"] == "bshd"
    for name, t in (("q", q), ("k", k), ("v", v)):
        assert call[name].data_ptr() == t.data_ptr() and call[name].is_contiguous(), name
        assert call[name].shape == (2, 10, 3, 32)
    assert out.shape == (2, 3, 10, 32) and out.transpose(1, 2).is_contiguous()
    torch.testing.assert_close(out.double(), sdpa64(q, k, v), rtol=1e-5, atol=1e-5)


def test_contiguous_bhsd_reaches_the_kernel_without_a_copy(route):
    run, kernel = route
    q, k, v = make_qkv(1, 4, 2, 8, 12, 32, layout="bhsd")
    out = run(q, k, v, enable_gqa=True)
    (call,) = kernel.calls
    assert call["layout"] == "bhsd"
    assert [call[n].data_ptr() for n in "qkv"] == [t.data_ptr() for t in (q, k, v)]
    assert out.is_contiguous()
    torch.testing.assert_close(out.double(), sdpa64(q, k, v, enable_gqa=True), rtol=1e-5, atol=1e-5)


def test_key_value_follow_the_query_layout(route):
    run, kernel = route
    q, _, _ = make_qkv(1, 2, 2, 8, 8, 32, layout="bshd")
    _, k, v = make_qkv(1, 2, 2, 8, 8, 32, layout="bhsd", seed=1)
    out = run(q, k, v)
    (call,) = kernel.calls
    assert call["layout"] == "bshd" and call["q"].data_ptr() == q.data_ptr()
    assert call["k"].shape == (1, 8, 2, 32) and call["k"].is_contiguous()
    torch.testing.assert_close(out.double(), sdpa64(q, k, v), rtol=1e-5, atol=1e-5)


def test_strided_query_is_made_contiguous_bhsd(route):
    run, kernel = route
    q, k, v = make_qkv(1, 2, 2, 16, 8, 32)
    q = q[:, :, ::2]                         # neither layout: one copy, into (B, H, S, D)
    out = run(q, k, v)
    (call,) = kernel.calls
    assert call["layout"] == "bhsd" and call["q"].is_contiguous()
    torch.testing.assert_close(out.double(), sdpa64(q, k, v), rtol=1e-5, atol=1e-5)


def test_mask_reaches_the_kernel_as_float32_additive_with_batch_and_head_broadcast_kept(route):
    run, kernel = route
    q, k, v = make_qkv(2, 4, 4, 6, 9, 32)
    keep = torch.rand(2, 1, 1, 9) > 0.3            # a padding mask
    keep[..., 0] = True
    out = run(q, k, v, keep, is_causal=True, scale=0.2)
    (call,) = kernel.calls
    mask = call["mask"]
    assert mask.dtype == torch.float32 and mask.shape == (2, 1, 6, 9) and mask.is_contiguous()
    assert set(mask.unique().tolist()) <= {0.0, float("-inf")}
    assert call["is_causal"] is True and call["scale"] == 0.2
    torch.testing.assert_close(out.double(), sdpa64(q, k, v, keep, is_causal=True, scale=0.2), rtol=1e-5, atol=1e-5)


def test_flash_attn_forward_returns_the_kernel_output_buffer(monkeypatch, backend):
    """(B, S, H, D) in, (B, S, H, D) contiguous out: the transpose back is free, no copy."""
    backend("sim")
    kernel, outputs = ContractKernel(), []

    def recording(*args, **kwargs):
        result = kernel(*args, **kwargs)
        outputs.append(result[0])
        return result
    monkeypatch.setattr(_backend, "simulated_kernel", lambda: recording)
    q, k, v = make_qkv(1, 2, 2, 10, 10, 32, layout="bshd")
    out, _ = nva.flash_attn_forward(None, q, k, v, None, is_causal=False)
    assert out.data_ptr() == outputs[0].data_ptr()


def test_reference_backend_never_calls_the_kernel(route, backend):
    run, kernel = route
    backend("reference")
    q, k, v = make_qkv(1, 2, 2, 8, 8, 32)
    run(q, k, v)
    assert kernel.calls == []


def test_compiled_projection_keeps_the_zero_copy_layout(monkeypatch, backend):
    """Under torch.compile the op still gets the projection's (B, S, H, D) buffer: the layout the
    fake implementation predicts from q's strides is the one the kernel runs with."""
    backend("sim")
    kernel = ContractKernel()
    monkeypatch.setattr(_backend, "simulated_kernel", lambda: kernel)
    proj = torch.nn.Linear(64, 3 * 64)
    hidden = torch.randn(2, 10, 64)

    def vit_attention(x):
        q, k, v = proj(x).view(2, 10, 3, 2, 32).unbind(2)       # each (B, S, H, D), strided
        q, k, v = (t.contiguous().transpose(1, 2) for t in (q, k, v))
        return nva.attention(q, k, v).transpose(1, 2).reshape(2, 10, 64)

    torch._dynamo.reset()
    compiled = torch.compile(vit_attention, fullgraph=True)
    with torch.no_grad():
        got, want = compiled(hidden), vit_attention(hidden)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert [c["layout"] for c in kernel.calls] == ["bshd", "bshd"]
    assert all(c[n].is_contiguous() for c in kernel.calls for n in "qkv")
