"""Bad input: a clear TypeError/ValueError before any work; unsupported-but-servable input falls
back to the reference with a one-time warning; the backend variable is validated."""

import warnings

import pytest
import torch

import neuron_vit_attn as nva
from ops_cases import make_qkv, requires_kernel, sdpa64


@pytest.fixture
def qkv():
    return make_qkv(2, 4, 4, 8, 8, 32)


def test_wrong_rank(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"query must be 4-D, got shape \(4, 8, 32\)"):
        nva.attention(q[0], k, v)


def test_not_a_tensor(qkv):
    q, k, _ = qkv
    with pytest.raises(TypeError, match="value must be a torch.Tensor, got list"):
        nva.attention(q, k, [1.0])


def test_integer_dtype(qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match="key has dtype int64; supported are bfloat16"):
        nva.attention(q, k.long(), v)


def test_mixed_dtypes(qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match="must share a dtype, got float32, bfloat16, float32"):
        nva.attention(q, k.bfloat16(), v)


def test_batch_mismatch(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="batch sizes differ: query 2, key 1"):
        nva.attention(q, k[:1], v[:1])


def test_head_dim_mismatch(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="head dims differ: query 32, key 16"):
        nva.attention(q, k[..., :16], v)


def test_key_value_shapes_differ(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="must have the same heads and sequence length"):
        nva.attention(q, k, v[:, :, :5])


def test_heads_differ_without_enable_gqa():
    q, k, v = make_qkv(1, 4, 2, 8, 8, 32)
    with pytest.raises(ValueError, match="query has 4 heads but key/value have 2; pass enable_gqa=True"):
        nva.attention(q, k, v)


def test_gqa_heads_not_divisible():
    q, k, v = make_qkv(1, 4, 3, 8, 8, 32)
    with pytest.raises(ValueError, match=r"query heads \(4\) divisible by key/value heads \(3\)"):
        nva.attention(q, k, v, enable_gqa=True)


@pytest.mark.parametrize("shape", [(8, 7), (3, 8, 8), (2, 4, 8, 8, 1)])
def test_mask_not_broadcastable(qkv, shape):
    q, k, v = qkv
    with pytest.raises(ValueError, match="does not broadcast to"):
        nva.attention(q, k, v, torch.zeros(shape))


def test_integer_mask(qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match="attn_mask must be bool .* or an additive float mask, got int64"):
        nva.attention(q, k, v, torch.zeros(8, 8, dtype=torch.long))


def test_tensors_on_different_devices(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="must be on one device, got cpu, meta, cpu"):
        nva.attention(q, k.to("meta"), v)


def test_mask_on_other_device(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="attn_mask is on meta but query is on cpu"):
        nva.attention(q, k, v, torch.zeros(8, 8, device="meta"))


@pytest.mark.parametrize("p", [-0.1, 1.0, "0.1"])
def test_invalid_dropout(qkv, p):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"dropout_p must be a float in \[0, 1\)"):
        nva.attention(q, k, v, dropout_p=p)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "0.1"])
def test_invalid_scale(qkv, scale):
    q, k, v = qkv
    with pytest.raises(ValueError, match="scale must be a finite float or None"):
        nva.attention(q, k, v, scale=scale)


def test_dropout_falls_back_to_reference_once(qkv):
    q, k, v = qkv
    with pytest.warns(UserWarning, match=r"dropout \(p=0.5\) has no NKI kernel"):
        torch.manual_seed(0)
        out = nva.attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(0)
    expected = nva.attention_reference(q, k, v, dropout_p=0.5)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)    # same RNG stream, same eager math
    assert not torch.allclose(out, sdpa64(q, k, v).float(), atol=1e-3)    # dropout really applied
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # the second call must not warn again
        nva.attention(q, k, v, dropout_p=0.5)


@pytest.mark.parametrize("value", ["simulator", "nki", "cuda"])
def test_invalid_backend_value(qkv, backend, value):
    q, k, v = qkv
    backend(value)
    with pytest.raises(ValueError, match=rf"NEURON_VIT_ATTN_BACKEND='{value}' is not valid; use one of auto, sim, reference"):
        nva.attention(q, k, v)


@pytest.mark.parametrize("value", ["auto", "reference", " Reference ", ""])
def test_valid_backend_values_on_cpu_use_the_reference(qkv, backend, value):
    q, k, v = qkv
    backend(value)
    torch.testing.assert_close(nva.attention(q, k, v).double(), sdpa64(q, k, v), rtol=1e-5, atol=1e-5)


@requires_kernel
@pytest.mark.parametrize("dtype,head_dim,scale,reason", [(torch.float32, 16, None, "head_dim 16"),
                                                         (torch.float32, 288, None, "head_dim 288"),
                                                         (torch.float64, 32, None, "dtype float64"),
                                                         (torch.float32, 32, -0.5, "scale -0.5")])
def test_sim_backend_falls_back_for_unsupported_inputs(backend, dtype, head_dim, scale, reason):
    backend("sim")
    q, k, v = make_qkv(1, 1, 1, 4, 4, head_dim, dtype=dtype)
    with pytest.warns(UserWarning, match=f"the NKI attention kernel does not support {reason}.*running the eager"):
        out = nva.attention(q, k, v, scale=scale)
    torch.testing.assert_close(out.double(), sdpa64(q, k, v, scale=scale), rtol=1e-5, atol=1e-5)


def test_sim_backend_without_nkisim_says_how_to_get_it(qkv, backend, monkeypatch):
    import sys
    backend("sim")
    monkeypatch.setitem(sys.modules, "nkisim", None)      # makes `import nkisim` raise ImportError
    q, k, v = qkv
    with pytest.raises(RuntimeError, match="ships with the neuron-vit-attn source repository"):
        nva.attention(q, k, v)
