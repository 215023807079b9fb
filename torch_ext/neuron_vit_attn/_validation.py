"""Input checks and input preparation for :func:`neuron_vit_attn.attention`.

``check_attention_inputs`` raises a ``TypeError``/``ValueError`` that says what was wrong and how to
fix it, before any work is done. It accepts what ``torch.nn.functional.scaled_dot_product_attention``
accepts (layout (B, H, S, D), GQA only with ``enable_gqa=True``, bool or float masks broadcastable
to (B, Hq, Sq, Sk)), restricted to floating dtypes bf16/fp16/fp32/fp64.

``kernel_unsupported_reason`` names what the NKI kernel cannot serve (float64, head dims outside
32..256, a value head dim different from the query's, empty tensors, scale <= 0); callers then fall back to the
eager reference with a one-time warning (``warn_once``) instead of failing.

``normalize_mask`` turns a user mask into the kernel's mask contract: additive float
(Bm, Hm, Sq, Sk) with Bm in {1, B} and Hm in {1, Hq}, contiguous; broadcasts over the two sequence
dims are materialised, those over batch and heads are kept (the kernel reuses one mask slice).
"""

from __future__ import annotations

import math
import warnings

import torch

from .reference import additive_mask, compute_dtype

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
KERNEL_MIN_HEAD_DIM = 32
KERNEL_MAX_HEAD_DIM = 256
_RANK = 4
_LAYOUT_HELP = "expected (batch, heads, seq_len, head_dim) as for torch.nn.functional.scaled_dot_product_attention"

_warned: set = set()


def warn_once(key: str, message: str) -> None:
    """Emit ``message`` as a UserWarning the first time ``key`` is seen in this process."""
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, UserWarning, stacklevel=3)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_attention_inputs(query, key, value, attn_mask, *, dropout_p: float, scale, is_causal,
                           enable_gqa: bool) -> None:
    """Raise TypeError/ValueError for anything the attention op cannot take; see the module docstring."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != _RANK:
            raise ValueError(f"attention: {name} must be 4-D, got shape {tuple(t.shape)}; {_LAYOUT_HELP}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"attention: {name} has dtype {_dtype_name(t.dtype)}; supported are bfloat16, float16, "
                            f"float32 (NKI kernel) and float64 (reference only); cast with .to(torch.bfloat16)")
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(f"attention: query, key and value must share a dtype, got {_dtype_name(query.dtype)}, "
                        f"{_dtype_name(key.dtype)}, {_dtype_name(value.dtype)}")
    if not (query.device == key.device == value.device):
        raise ValueError(f"attention: query, key and value must be on one device, got {query.device}, "
                         f"{key.device}, {value.device}; move them with .to(query.device)")
    batch, q_heads, _, head_dim = query.shape
    kv_batch, kv_heads, kv_len, kv_head_dim = key.shape
    if kv_batch != batch or value.shape[0] != batch:
        raise ValueError(f"attention: batch sizes differ: query {batch}, key {kv_batch}, value {value.shape[0]}")
    if kv_head_dim != head_dim:
        raise ValueError(f"attention: head dims differ: query {head_dim}, key {kv_head_dim}; {_LAYOUT_HELP}")
    if value.shape[1] != kv_heads or value.shape[2] != kv_len:
        raise ValueError(f"attention: key {tuple(key.shape)} and value {tuple(value.shape)} must have the same "
                         f"heads and sequence length")
    if not enable_gqa and kv_heads != q_heads:
        raise ValueError(f"attention: query has {q_heads} heads but key/value have {kv_heads}; pass "
                         f"enable_gqa=True for grouped-query attention (or repeat the key/value heads)")
    if enable_gqa and (kv_heads == 0 or q_heads % kv_heads != 0):
        raise ValueError(f"attention: grouped-query attention needs query heads ({q_heads}) divisible by "
                         f"key/value heads ({kv_heads})")
    _check_mask(attn_mask, query, key)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"attention: dropout_p must be a float in [0, 1), got {dropout_p!r}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale)):
        raise ValueError(f"attention: scale must be a finite float or None (1/sqrt(head_dim)), got {scale!r}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"attention: is_causal must be a bool, got {type(is_causal).__name__}")


def _check_mask(attn_mask, query, key) -> None:
    if attn_mask is None:
        return
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attention: attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and not attn_mask.dtype.is_floating_point:
        raise TypeError(f"attention: attn_mask must be bool (True = attend) or an additive float mask, got "
                        f"{_dtype_name(attn_mask.dtype)}")
    if attn_mask.device != query.device:
        raise ValueError(f"attention: attn_mask is on {attn_mask.device} but query is on {query.device}")
    target = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    ok = attn_mask.dim() <= _RANK
    if ok:
        padded = (1,) * (_RANK - attn_mask.dim()) + tuple(attn_mask.shape)
        ok = all(m in (1, t) for m, t in zip(padded, target))
    if not ok:
        raise ValueError(f"attention: attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                         f"(batch, heads, q_len, kv_len) = {target}")


def normalize_mask(attn_mask, query, key):
    """The kernel's mask: additive float (Bm, Hm, Sq, Sk), contiguous, in the reference's compute dtype."""
    if attn_mask is None:
        return None
    mask = additive_mask(attn_mask, compute_dtype(query.dtype))
    while mask.dim() < _RANK:
        mask = mask.unsqueeze(0)
    return mask.expand(mask.shape[0], mask.shape[1], query.shape[2], key.shape[2]).contiguous()


def kernel_unsupported_reason(query, key, value, scale: float) -> str | None:
    """Why the NKI kernel cannot serve these (validated) inputs, or None if it can."""
    head_dim = query.shape[-1]
    if query.dtype not in KERNEL_DTYPES:
        return f"dtype {_dtype_name(query.dtype)} (the NKI kernel takes bfloat16, float16, float32)"
    if not KERNEL_MIN_HEAD_DIM <= head_dim <= KERNEL_MAX_HEAD_DIM:
        return f"head_dim {head_dim} (the NKI kernel takes {KERNEL_MIN_HEAD_DIM}..{KERNEL_MAX_HEAD_DIM})"
    if value.shape[-1] != head_dim:
        return f"value head_dim {value.shape[-1]} != query head_dim {head_dim}"
    if query.numel() == 0 or key.numel() == 0:
        return "empty tensors"
    if scale <= 0:
        return f"scale {scale} (the NKI kernel takes scale > 0)"
    return None
