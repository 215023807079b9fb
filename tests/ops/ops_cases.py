"""Shared helpers for the op-layer tests: input builders in both layouts and the SDPA oracle."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

KERNEL_FILE = Path(__file__).resolve().parents[2] / "kernels" / "attention.py"
requires_kernel = pytest.mark.skipif(not KERNEL_FILE.exists(), reason="kernels/attention.py (the NKI kernel) is absent")

LAYOUTS = ("bhsd", "bshd")


def make_qkv(batch, q_heads, kv_heads, q_len, kv_len, head_dim, *, dtype=torch.float32, layout="bhsd",
             seed=0, requires_grad=False):
    """q/k/v as SDPA takes them: contiguous (B, H, S, D) for ``bhsd``, or (B, H, S, D) views of
    contiguous (B, S, H, D) projections for ``bshd`` (what Transformers passes)."""
    gen = torch.Generator().manual_seed(seed)

    def one(heads, seq):
        if layout == "bshd":
            t = torch.randn(batch, seq, heads, head_dim, generator=gen).to(dtype).transpose(1, 2)
        else:
            t = torch.randn(batch, heads, seq, head_dim, generator=gen).to(dtype)
        if requires_grad:
            t.requires_grad_(True)
        return t

    return one(q_heads, q_len), one(kv_heads, kv_len), one(kv_heads, kv_len)


def sdpa64(query, key, value, attn_mask=None, **kwargs):
    """The oracle: torch's SDPA in float64 on upcast inputs (bool masks stay bool)."""
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.double()
    return F.scaled_dot_product_attention(query.double(), key.double(), value.double(), attn_mask=attn_mask, **kwargs)
