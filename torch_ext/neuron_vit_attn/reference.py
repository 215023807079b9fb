"""Eager attention reference: the oracle for tests, the CPU default, and the fallback for inputs the
NKI kernel does not cover.

Algorithm (plain softmax attention, same semantics as
``torch.nn.functional.scaled_dot_product_attention``)::

    scores = (q @ k^T) * scale + mask            mask additive (0 / -inf), or bool (True = attend)
    scores[i, j] = -inf  where j > i             if is_causal (top-left aligned, as SDPA)
    lse    = logsumexp(scores, -1)
    out    = exp(scores - lse) @ v

GQA: query head ``h`` uses key/value head ``h // (Hq // Hkv)`` (SDPA's ``enable_gqa``).
The math runs in float32 for bf16/fp16/fp32 inputs and in float64 for float64 inputs; the output is
cast back to the input dtype. A query row whose keys are all masked gets output 0 and lse -inf,
as SDPA does. Everything here is differentiable with torch autograd: the custom op's backward
recomputes through :func:`attention_with_lse`.
"""

from __future__ import annotations

import math

import torch

_NEG_INF = float("-inf")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype of the reference (and the dtype of lse and of the normalized mask)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def additive_mask(attn_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A bool mask (True = attend) becomes 0/-inf; a float mask is cast. Shape is unchanged."""
    if attn_mask is None:
        return None
    if attn_mask.dtype == torch.bool:
        # Tensor-method factories (not torch.zeros(device=...)) keep tensor subclasses working.
        zero = attn_mask.new_zeros((), dtype=dtype)
        return torch.where(attn_mask, zero, zero - math.inf)
    return attn_mask.to(dtype)


def _repeat_kv_heads(t: torch.Tensor, group: int) -> torch.Tensor:
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def _probabilities(query, key, value, mask, scale, is_causal):
    """Softmax probabilities (B, Hq, Sq, Sk), lse (B, Hq, Sq) and the head-repeated value, in the
    accumulation dtype."""
    acc = compute_dtype(query.dtype)
    group = query.shape[1] // key.shape[1]
    q = query.to(acc)
    k = _repeat_kv_heads(key.to(acc), group)
    v = _repeat_kv_heads(value.to(acc), group)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores + mask.to(acc)
    if is_causal:
        sq, sk = scores.shape[-2], scores.shape[-1]
        keep = scores.new_ones((sq, sk), dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, _NEG_INF)
    lse = torch.logsumexp(scores, dim=-1)
    # Rows with every key masked have lse = -inf; shifting by 0 instead makes exp() give 0, not NaN.
    shift = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    probs = torch.exp(scores - shift.unsqueeze(-1))
    return probs, lse, v


def attention_with_lse(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       mask: torch.Tensor | None, scale: float, is_causal: bool):
    """Reference for the custom op's contract: ``(out, lse)``.

    query (B, Hq, Sq, D), key (B, Hkv, Sk, D), value (B, Hkv, Sk, Dv), any strides; ``mask`` None or
    an additive float mask broadcastable to (B, Hq, Sq, Sk). Returns ``out`` (B, Hq, Sq, Dv) in the
    query's dtype and ``lse`` (B, Hq, Sq) in :func:`compute_dtype` (natural log).
    """
    probs, lse, v = _probabilities(query, key, value, mask, scale, is_causal)
    return torch.matmul(probs, v).to(query.dtype), lse


def attention_reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attn_mask: torch.Tensor | None = None, *, dropout_p: float = 0.0,
                        scale: float | None = None, is_causal: bool = False,
                        enable_gqa: bool = False, training: bool = True) -> torch.Tensor:
    """SDPA-compatible eager attention (no validation: call :func:`neuron_vit_attn.attention` for that).

    ``enable_gqa`` is accepted for signature parity; grouping follows from the head counts.
    ``dropout_p`` drops attention probabilities (kept ones scaled by 1/(1-p)) when ``training`` is
    True, as ``torch.nn.functional.dropout`` does; the NKI kernel has no dropout, so this is the
    only path that implements it.
    """
    del enable_gqa
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    mask = additive_mask(attn_mask, compute_dtype(query.dtype))
    probs, _, v = _probabilities(query, key, value, mask, scale, is_causal)
    if dropout_p > 0.0 and training:
        probs = torch.nn.functional.dropout(probs, p=dropout_p, training=True)
    return torch.matmul(probs, v).to(query.dtype)
