"""Stateless layers for ``kernels.kernelize``: only ``forward``, no ``__init__``, no parameters.

``kernelize`` binds ``forward`` to the module it replaces, so a layer reads that module's attributes.

- :class:`Attention`: attention over given q/k/v (SDPA's parameters); for modules whose forward
  takes ``(query, key, value, attn_mask=None, is_causal=False, scale=None)``.
- :class:`ViTAttention`: replaces the forward of Transformers 5.22.2 ``ViTAttention``
  (``q_proj``/``k_proj``/``v_proj``/``o_proj``, ``head_dim``, ``scaling``, ``attention_dropout``);
  the projections stay torch, attention runs in this package. The (B, H, S, D) views of the
  projections reach the kernel without a copy (``layout="bshd"``).
"""

import torch
from torch import nn

from ._attention import attention


class Attention(nn.Module):
    has_backward = True
    can_torch_compile = True

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                scale: float | None = None) -> torch.Tensor:
        return attention(query, key, value, attn_mask, scale=scale, is_causal=is_causal,
                         enable_gqa=key.shape[1] != query.shape[1])


class ViTAttention(nn.Module):
    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        dropout = self.attention_dropout if self.training else 0.0
        out = attention(query, key, value, attention_mask, dropout_p=dropout, scale=self.scaling)
        out = out.transpose(1, 2).reshape(*input_shape, -1)
        return self.o_proj(out), None


__all__ = ["Attention", "ViTAttention"]
