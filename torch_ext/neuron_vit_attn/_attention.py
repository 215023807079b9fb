"""Public entry points: :func:`attention` (SDPA-style) and :func:`flash_attn_forward` (Transformers).

Both validate their inputs, prepare the mask and call the ``attention_fwd`` custom op (``_op.py``),
which picks the NKI kernel or the eager reference (``_backend.py``). Views and transposes happen
here, outside the op, so the op never returns a view of its inputs.
"""

from __future__ import annotations

import math

import torch

from . import _op  # noqa: F401  (registers the custom op)
from ._ops import ops
from ._validation import check_attention_inputs, normalize_mask, warn_once
from .reference import additive_mask, attention_reference, compute_dtype

_DROPOUT_WARNING = ("neuron_vit_attn: attention dropout (p={p}) has no NKI kernel; this call and later ones with "
                    "dropout run the eager reference (same distribution as SDPA's dropout, not the same "
                    "random mask). This warning is shown once.")


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attn_mask: torch.Tensor | None = None, *, dropout_p: float = 0.0, scale: float | None = None,
              is_causal: bool = False, enable_gqa: bool = False) -> torch.Tensor:
    """Scaled dot-product attention with the layout and semantics of
    ``torch.nn.functional.scaled_dot_product_attention``.

    query (B, Hq, Sq, D), key (B, Hkv, Sk, D), value (B, Hkv, Sk, Dv); returns (B, Hq, Sq, Dv) in
    the query's dtype. Contiguous (B, H, S, D) tensors and (B, H, S, D) views of contiguous
    (B, S, H, D) projections are both read without a copy.

    - ``attn_mask``: bool (True = attend) or additive float, broadcastable to (B, Hq, Sq, Sk).
    - ``is_causal``: top-left aligned causal mask, as SDPA; may be combined with ``attn_mask``.
    - ``scale``: defaults to 1/sqrt(D).
    - ``enable_gqa``: allow Hkv < Hq with Hq % Hkv == 0 (query head h uses kv head h // (Hq/Hkv)).
    - ``dropout_p`` > 0: no kernel exists; falls back to the eager reference with a one-time warning.
    - under ``torch.autocast``, q/k/v are cast to the autocast dtype first, as SDPA does.

    Bad input raises ``TypeError``/``ValueError`` before any work. The backend is chosen by
    ``NEURON_VIT_ATTN_BACKEND`` (auto | sim | reference; see ``_backend.py``). Autograd works; the
    backward recomputes through the eager reference until an NKI backward kernel exists.
    """
    check_attention_inputs(query, key, value, attn_mask, dropout_p=dropout_p, scale=scale, is_causal=is_causal,
                           enable_gqa=enable_gqa)
    query, key, value = _autocast(query, key, value)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    if dropout_p > 0.0:
        warn_once("dropout", _DROPOUT_WARNING.format(p=dropout_p))
        return attention_reference(query, key, value, attn_mask, dropout_p=dropout_p, scale=scale,
                                   is_causal=is_causal)
    mask = normalize_mask(attn_mask, query, key)
    out, _ = ops.attention_fwd(query, key, value, mask, float(scale), is_causal)
    return out


def _autocast(query, key, value):
    """Under ``torch.autocast`` SDPA runs in the autocast dtype (float64 excepted): so does this op.
    (The meta device has no autocast state.)"""
    device_type = query.device.type
    if device_type == "meta" or query.dtype == torch.float64 or not torch.is_autocast_enabled(device_type):
        return query, key, value
    dtype = torch.get_autocast_dtype(device_type)
    return query.to(dtype), key.to(dtype), value.to(dtype)


def _merge_position_bias(position_bias, attention_mask, dtype):
    """An additive mask holding ``position_bias`` plus ``attention_mask`` (as Transformers' SDPA path)."""
    bias = position_bias.to(dtype)
    if attention_mask is None:
        return bias
    return bias + additive_mask(attention_mask, dtype)


def flash_attn_forward(module: torch.nn.Module | None, query: torch.Tensor, key: torch.Tensor,
                       value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                       scaling: float | None = None, is_causal: bool | None = None,
                       position_bias: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Transformers attention-interface entry (``attn_implementation="<org>/neuron-vit-attn"``).

    Same contract and mask handling as Transformers' ``sdpa_attention_forward``: query/key/value
    (B, H, S, D) (often non-contiguous views), ``attention_mask`` None, bool or additive float;
    returns ``(out, None)`` with ``out`` (B, S, H, D) contiguous (no attention weights).
    ``is_causal`` defaults to ``module.is_causal`` (True if absent, as SDPA's path does) and only
    applies when there is no mask and more than one query. Fewer key/value heads than query heads
    means GQA. ``dropout`` > 0 (training) falls back to the eager reference with a one-time warning.
    ``softcap`` and paged caches are not supported (ValueError).
    """
    if kwargs.get("softcap") is not None:
        raise ValueError("neuron_vit_attn.flash_attn_forward does not support softcap; use attn_implementation='eager'")
    if kwargs.get("cache") is not None:
        raise ValueError("neuron_vit_attn.flash_attn_forward does not support paged caches (continuous batching); "
                         "use attn_implementation='sdpa' there")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    is_causal = bool(query.shape[2] > 1 and attention_mask is None and is_causal)
    if position_bias is not None:
        attention_mask = _merge_position_bias(position_bias, attention_mask, compute_dtype(query.dtype))
    out = attention(query, key, value, attention_mask, dropout_p=float(dropout), scale=scaling,
                    is_causal=is_causal, enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None
