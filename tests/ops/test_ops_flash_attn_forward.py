"""flash_attn_forward: the Transformers 5.22.2 attention-interface contract, and the layers."""

import pytest
import torch
from torch import nn

import neuron_vit_attn as nva
from ops_cases import make_qkv, sdpa64


class VisionAttention(nn.Module):
    """Stands in for a Transformers attention module: only the attributes the interface reads."""
    is_causal = False


class DecoderAttention(nn.Module):
    is_causal = True


def test_public_api():
    assert nva.supports_flash_attn is True
    assert set(nva.__all__) == {"attention", "attention_reference", "flash_attn_forward", "layers",
                                "supports_flash_attn"}
    assert {"Attention", "ViTAttention"} <= set(nva.layers.__all__)


def test_vision_call_returns_bshd_contiguous_and_no_weights():
    q, k, v = make_qkv(2, 3, 3, 197, 197, 64, layout="bshd")
    out, weights = nva.flash_attn_forward(VisionAttention(), q, k, v, None, dropout=0.0, scaling=0.125)
    assert weights is None
    assert out.shape == (2, 197, 3, 64) and out.is_contiguous()
    torch.testing.assert_close(out.double(), sdpa64(q, k, v, scale=0.125).transpose(1, 2), rtol=1e-5, atol=1e-5)


def test_is_causal_follows_module_and_kwarg_like_sdpa_path():
    q, k, v = make_qkv(1, 2, 2, 6, 6, 32, dtype=torch.float64)
    causal = sdpa64(q, k, v, is_causal=True).transpose(1, 2)
    full = sdpa64(q, k, v).transpose(1, 2)
    torch.testing.assert_close(nva.flash_attn_forward(DecoderAttention(), q, k, v, None)[0], causal)
    torch.testing.assert_close(nva.flash_attn_forward(VisionAttention(), q, k, v, None)[0], full)
    torch.testing.assert_close(nva.flash_attn_forward(VisionAttention(), q, k, v, None, is_causal=True)[0], causal)
    # A mask replaces is_causal (the mask function already encoded causality), as in sdpa_attention_forward.
    mask = torch.ones(1, 1, 6, 6, dtype=torch.bool)
    torch.testing.assert_close(nva.flash_attn_forward(DecoderAttention(), q, k, v, mask)[0], full)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_attention_mask_and_gqa(kind):
    q, k, v = make_qkv(2, 4, 2, 5, 8, 32, dtype=torch.float64, layout="bshd")
    keep = torch.rand(2, 1, 5, 8) > 0.3
    keep[..., 0] = True
    # Transformers' float masks hold finfo(dtype).min where a key is masked.
    masked = torch.tensor(torch.finfo(torch.float32).min, dtype=torch.float64)
    mask = keep if kind == "bool" else torch.where(keep, torch.tensor(0.0, dtype=torch.float64), masked)
    out, _ = nva.flash_attn_forward(VisionAttention(), q, k, v, mask, scaling=0.2)
    torch.testing.assert_close(out, sdpa64(q, k, v, mask, scale=0.2, enable_gqa=True).transpose(1, 2))


def test_position_bias_is_added_to_the_mask():
    q, k, v = make_qkv(1, 2, 2, 5, 5, 32, dtype=torch.float64)
    bias = torch.randn(1, 2, 5, 5, dtype=torch.float64)
    keep = torch.rand(1, 1, 5, 5) > 0.3
    keep[..., 0] = True
    out, _ = nva.flash_attn_forward(VisionAttention(), q, k, v, keep, position_bias=bias)
    expected = sdpa64(q, k, v, torch.where(keep, bias, float("-inf")))
    torch.testing.assert_close(out, expected.transpose(1, 2))


def test_dropout_in_training_falls_back_with_a_warning():
    q, k, v = make_qkv(1, 2, 2, 6, 6, 32)
    with pytest.warns(UserWarning, match="dropout .* has no NKI kernel"):
        out, _ = nva.flash_attn_forward(VisionAttention(), q, k, v, None, dropout=0.1)
    assert out.shape == (1, 6, 2, 32)


def test_softcap_is_rejected():
    q, k, v = make_qkv(1, 2, 2, 6, 6, 32)
    with pytest.raises(ValueError, match="does not support softcap"):
        nva.flash_attn_forward(VisionAttention(), q, k, v, None, softcap=30.0)


def test_attention_layer():
    q, k, v = make_qkv(1, 4, 2, 6, 6, 32, dtype=torch.float64)
    out = nva.layers.Attention()(q, k, v, is_causal=True, scale=0.3)
    torch.testing.assert_close(out, sdpa64(q, k, v, is_causal=True, scale=0.3, enable_gqa=True))


def test_vit_attention_layer_matches_transformers_vit_attention():
    from transformers import ViTConfig
    from transformers.models.vit.modeling_vit import ViTAttention

    config = ViTConfig(hidden_size=64, num_attention_heads=2, intermediate_size=64, attn_implementation="sdpa")
    torch.manual_seed(0)
    module = ViTAttention(config).eval()
    hidden = torch.randn(2, 17, 64)
    expected, _ = module(hidden)
    got, weights = nva.layers.ViTAttention.forward(module, hidden)
    assert weights is None
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_flash_attn_forward_compiles_fullgraph():
    q, k, v = make_qkv(1, 4, 2, 12, 12, 32, layout="bshd")
    module = VisionAttention()

    def fn(q, k, v):
        return nva.flash_attn_forward(module, q, k, v, None, dropout=0.0, scaling=0.2)[0]

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), fn(q, k, v), rtol=1e-6, atol=1e-6)
