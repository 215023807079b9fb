"""The NKI kernel itself (kernels/attention.py) behind the op, run by nkisim on CPU:
NEURON_VIT_ATTN_BACKEND=sim, and the PrivateUse1 kernel with nkisim standing in for nki."""

import warnings

import pytest
import torch

import neuron_vit_attn as nva
from neuron_vit_attn import _backend, _op
from ops_cases import LAYOUTS, make_qkv, requires_kernel, sdpa64

nkisim = pytest.importorskip("nkisim")
pytestmark = requires_kernel

# Tolerances against float64 SDPA. fp32: the kernel accumulates in fp32 PSUM; measured errors are
# below 1e-6 for |out| <= 4, so 1e-5 leaves a 10x margin. bf16/fp16: q, k, v, the probabilities P
# and the output are rounded to the input dtype (2^-8 / 2^-11 relative each), so a few units of
# 2^-8 / 2^-11 (measured: <= 1e-2 bf16, <= 1e-3 fp16 at |out| ~3).
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2 ** -7, atol=2 ** -7),
       torch.float16: dict(rtol=2 ** -9, atol=2 ** -9)}


@pytest.fixture
def sim(backend):
    backend("sim")


def _assert_close_to_sdpa(out, q, k, v, **kwargs):
    ref = sdpa64(q, k, v, **kwargs)
    torch.testing.assert_close(out.double(), ref, **TOL[q.dtype])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype,head_dim", [(torch.float32, 32), (torch.bfloat16, 64), (torch.float16, 128),
                                            (torch.bfloat16, 256)])
def test_sim_matches_sdpa(sim, layout, dtype, head_dim):
    q, k, v = make_qkv(2, 2, 2, 40, 40, head_dim, dtype=dtype, layout=layout)
    with nkisim.trace() as trace:
        out = nva.attention(q, k, v)
    assert trace.count("nc_matmul") > 0, "the NKI kernel did not run"
    assert out.dtype == dtype
    _assert_close_to_sdpa(out, q, k, v)


@pytest.mark.parametrize("q_heads,kv_heads,q_len,kv_len,causal", [
    (4, 2, 24, 40, False),     # GQA, cross lengths
    (2, 1, 33, 33, True),      # multi-query, causal
    (2, 2, 16, 48, True),      # causal, Sq < Sk (top-left)
])
def test_sim_gqa_and_causal(sim, q_heads, kv_heads, q_len, kv_len, causal):
    q, k, v = make_qkv(1, q_heads, kv_heads, q_len, kv_len, 64, layout="bshd")
    gqa = q_heads != kv_heads
    _assert_close_to_sdpa(nva.attention(q, k, v, is_causal=causal, enable_gqa=gqa), q, k, v, is_causal=causal,
                          enable_gqa=gqa)


@pytest.mark.parametrize("mask_shape,kind", [((24, 30), "float"), ((2, 1, 1, 30), "bool"), ((1, 2, 24, 30), "bool"),
                                             ((2, 2, 24, 30), "float")])
def test_sim_masks(sim, mask_shape, kind):
    q, k, v = make_qkv(2, 2, 2, 24, 30, 32)
    gen = torch.Generator().manual_seed(4)
    if kind == "bool":
        mask = torch.rand(mask_shape, generator=gen) > 0.3
        mask[..., 0] = True
    else:
        mask = torch.randn(mask_shape, generator=gen)
    _assert_close_to_sdpa(nva.attention(q, k, v, mask, scale=0.3), q, k, v, attn_mask=mask, scale=0.3)


def test_sim_vit_base_shape(sim):
    """ViT-B/16 at 224px: 197 tokens, head_dim 64 (2 of its 12 heads, to stay fast)."""
    q, k, v = make_qkv(1, 2, 2, 197, 197, 64, dtype=torch.bfloat16, layout="bshd")
    out, _ = nva.flash_attn_forward(None, q, k, v, None, scaling=0.125, is_causal=False)
    assert out.shape == (1, 197, 2, 64) and out.is_contiguous()
    torch.testing.assert_close(out.double(), sdpa64(q, k, v, scale=0.125).transpose(1, 2), **TOL[torch.bfloat16])


def test_sim_reads_transformers_views_without_copies(sim, monkeypatch):
    real = _backend.simulated_kernel()
    seen = []

    def recording(q, k, v, *args, **kwargs):
        seen.append((q, k, v, kwargs["layout"]))
        return real(q, k, v, *args, **kwargs)
    monkeypatch.setattr(_backend, "simulated_kernel", lambda: recording)
    q, k, v = make_qkv(1, 2, 2, 20, 20, 32, layout="bshd")
    with nkisim.trace() as trace:
        out = nva.attention(q, k, v)
    (q_k, k_k, v_k, layout), = seen
    assert trace.count("nc_matmul") > 0
    # The kernel was handed the projection buffers themselves, as (B, S, H, D) with layout "bshd".
    assert layout == "bshd" and q_k.shape == (1, 20, 2, 32)
    assert (q_k.data_ptr(), k_k.data_ptr(), v_k.data_ptr()) == (q.data_ptr(), k.data_ptr(), v.data_ptr())
    _assert_close_to_sdpa(out, q, k, v)


def test_neuron_kernel_runs_the_nki_kernel(monkeypatch):
    """The PrivateUse1 implementation with nkisim standing in for nki (CPU tensors; no device here)."""
    nkisim.install()
    q, k, v = make_qkv(1, 4, 2, 20, 20, 32, dtype=torch.bfloat16, layout="bshd")
    with nkisim.trace() as trace:
        out, lse = _op._attention_fwd_neuron(q, k, v, None, 32 ** -0.5, True, True)
    assert trace.count("nc_matmul") > 0
    assert lse.shape == (1, 4, 20) and lse.dtype == torch.float32
    _assert_close_to_sdpa(out, q, k, v, is_causal=True, enable_gqa=True)


def test_sim_gradients_match_sdpa(sim):
    """Forward by the kernel, backward by the reference recompute: gradients as SDPA's."""
    q, k, v = make_qkv(1, 2, 2, 24, 24, 32, layout="bshd", requires_grad=True)
    grad_out = torch.randn(1, 2, 24, 32, generator=torch.Generator().manual_seed(9))
    got = torch.autograd.grad(nva.attention(q, k, v, is_causal=True), (q, k, v), grad_out)
    want = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                               (q, k, v), grad_out)
    for g, w in zip(got, want):
        # The recompute is the fp32 reference: differences are fp32 summation order only.
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_sim_opcheck(sim):
    q, k, v = make_qkv(1, 2, 2, 16, 16, 32, dtype=torch.bfloat16, layout="bshd")
    torch.library.opcheck(nva._attention.ops.attention_fwd.default, (q, k, v, None, 0.2, True))


def test_sim_lse_matches_reference(sim):
    q, k, v = make_qkv(1, 2, 2, 16, 24, 32)
    _, lse = nva._attention.ops.attention_fwd(q, k, v, None, 0.25, False, True)
    expected = torch.logsumexp((q.double() @ k.double().transpose(-1, -2)) * 0.25, dim=-1)
    torch.testing.assert_close(lse.double(), expected, rtol=1e-5, atol=1e-5)


def test_sim_fully_masked_rows_are_zero_like_sdpa(sim):
    """The kernel leaves rows with no visible key undefined; the op makes them SDPA's 0 / -inf."""
    q, k, v = make_qkv(1, 2, 2, 12, 12, 32)
    keep = torch.ones(12, 12, dtype=torch.bool)
    keep[3] = False                      # row 3: every key masked
    keep[5, :6] = False                  # row 5: keys 0..5 masked, the rest hidden by causality
    out = nva.attention(q, k, v, keep, is_causal=True)
    ref = sdpa64(q, k, v, keep, is_causal=True)
    assert torch.all(out[:, :, [3, 5]] == 0)
    _assert_close_to_sdpa(out, q, k, v, attn_mask=keep, is_causal=True)
    _, lse = nva._attention.ops.attention_fwd(q, k, v, nva._validation.normalize_mask(keep, q, k), 0.2, True, True)
    assert torch.isneginf(lse[:, :, [3, 5]]).all() and torch.isfinite(lse[:, :, :3]).all()
    assert ref.isfinite().all()


def _largest_resident_kv_len(head_dim, itemsize):
    """The longest key sequence the kernel's own limit (``kv_fits``, its trace-time assert) accepts."""
    module = _backend.sim_kernel_module()
    kv_len = 1
    while module.kv_fits(kv_len + 1, head_dim, itemsize):
        kv_len += 1
    return kv_len


def test_static_kernel_limits_agree_with_the_kernel():
    module = _backend.sim_kernel_module()
    from neuron_vit_attn import _validation as val
    assert (val.KERNEL_MIN_HEAD_DIM, val.KERNEL_MAX_HEAD_DIM) == (module.MIN_HEAD_DIM, module.MAX_HEAD_DIM)


@pytest.mark.parametrize("beyond", [False, True])
def test_sim_long_key_sequence_limit(sim, beyond):
    """D = 256 in bf16: at the kernel's K/V SBUF budget the kernel runs; one key more runs the
    reference, with a warning (instead of the kernel's trace-time assert)."""
    kv_len = _largest_resident_kv_len(256, 2) + int(beyond)
    q, k, v = make_qkv(1, 1, 1, 2, kv_len, 256, dtype=torch.bfloat16)
    if beyond:
        with pytest.warns(UserWarning, match=f"{kv_len} keys of head_dim 256"):
            out = nva.attention(q, k, v)
    else:
        with warnings.catch_warnings(), nkisim.trace() as trace:
            warnings.simplefilter("error")      # at the limit the kernel itself must run
            out = nva.attention(q, k, v)
        assert trace.count("nc_matmul") > 0
    _assert_close_to_sdpa(out, q, k, v)


def test_sim_lnc2_launch_uses_both_programs(sim, monkeypatch):
    """NEURON_LOGICAL_NC_CONFIG=2: the op launches attention_fwd[2]; both programs compute a share."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    q, k, v = make_qkv(2, 2, 2, 70, 70, 64, dtype=torch.bfloat16, layout="bshd")
    with nkisim.trace() as trace:
        out = nva.attention(q, k, v)
    assert {i.program_id for i in trace if i.name == "nc_matmul"} == {0, 1}
    _assert_close_to_sdpa(out, q, k, v)


@pytest.mark.parametrize("value", ["4", "two", "0"])
def test_sim_invalid_lnc_value_is_named(sim, monkeypatch, value):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", value)
    q, k, v = make_qkv(1, 2, 2, 20, 20, 32, layout="bshd")
    with pytest.raises(ValueError, match=rf"NEURON_LOGICAL_NC_CONFIG='{value}' is not valid; use 1 or 2"):
        nva.attention(q, k, v)


def test_sim_public_api_skips_the_kernels_lse(sim):
    """nva.attention discards lse, so the op asks the kernel for none: no float32 lse store in the
    trace, and the op's lse output is the empty (B, Hq, 0) placeholder."""
    q, k, v = make_qkv(1, 2, 2, 40, 40, 64, dtype=torch.bfloat16, layout="bshd")
    with nkisim.trace() as trace:
        out = nva.attention(q, k, v)
    stores = [i for i in trace if i.engine == "dma" and i.operand("dst").buffer == "shared_hbm"]
    assert stores and all(i.operand("dst").dtype == "bfloat16" for i in stores)
    _assert_close_to_sdpa(out, q, k, v)
    _, lse = nva._attention.ops.attention_fwd(q, k, v, None, 0.125, False)
    assert lse.shape == (1, 2, 0)
