"""The ``attention_fwd`` torch custom op: schema, device kernels, fake implementation, autograd.

Schema (namespace from ``_ops.py``)::

    attention_fwd(Tensor query, Tensor key, Tensor value, Tensor? mask, float scale, bool is_causal,
                  bool return_lse=False) -> (Tensor out, Tensor lse)

Inputs follow the kernel contract after :func:`neuron_vit_attn.attention` has validated and
prepared them: q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D) with any strides; mask None or additive float
(Bm, Hm, Sq, Sk) in the reference's compute dtype (float32, or float64 for float64 inputs).
Outputs are fresh tensors (never views of inputs, as ``opcheck`` requires): ``out`` (B, Hq, Sq, Dv)
with the strides of q's layout (``_backend.output_layout``), ``lse`` (B, Hq, Sq) contiguous when
``return_lse``, else an empty (B, Hq, 0) tensor: nothing in this package reads lse yet (the backward
recomputes), and on trn2 the kernel's lse costs ~7% of a ViT-B/16 call.

Kernels: CPU -> eager reference, or the NKI kernel in the simulator (NEURON_VIT_ATTN_BACKEND=sim);
PrivateUse1 (the ``neuron`` device of TorchNeuron) -> the NKI kernel through ``nki.jit``.

Backward: no NKI backward kernel exists yet, so the gradient RECOMPUTES the forward through the
eager reference (``reference.attention_with_lse``) under autograd, on the inputs' device. It is
exact (not an approximation of the kernel's numerics) and costs one extra eager forward plus its
backward, with O(Sq * Sk) memory per head.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _backend
from ._ops import add_op_namespace_prefix
from ._validation import kernel_unsupported_reason, warn_once
from .reference import attention_with_lse, compute_dtype

OP_NAME = add_op_namespace_prefix("attention_fwd")


def _fresh_outputs(query, value, out, lse):
    """Copy ``out`` into a tensor with the op's output strides unless it already has them; ``lse``
    None (not requested) becomes the empty (B, Hq, 0) placeholder."""
    if lse is None:
        lse = _lse_output(query, return_lse=False)
    result = _backend.empty_output(query, value)
    if out.stride() == result.stride() and out.dtype == result.dtype:
        return out, lse.contiguous()
    result.copy_(out)
    return result, lse.contiguous()


def _lse_output(query, return_lse):
    """An uninitialised lse output: (B, Hq, Sq) when requested, else the empty (B, Hq, 0) placeholder."""
    batch, heads, q_len, _ = query.shape
    return query.new_empty((batch, heads, q_len if return_lse else 0), dtype=compute_dtype(query.dtype))


def _reference(query, key, value, mask, scale, is_causal, return_lse):
    # Autocast stays enabled below the op's dispatch: without this the fp32 math would run in bf16.
    with torch._C._DisableAutocast():
        out, lse = attention_with_lse(query, key, value, mask, scale, is_causal)
    return _fresh_outputs(query, value, out, lse if return_lse else None)


def _zero_fully_masked_rows(out, lse, mask, is_causal):
    """SDPA gives output 0 and lse -inf for a query row whose keys are all masked (-inf or False);
    the kernel leaves such rows undefined (NaN), as flash attention does. Which rows those are
    follows from the mask alone, so fix them here, in place on the kernel's fresh outputs.
    (Rows masked with a finite minimum, as Transformers' float masks do, are not empty: SDPA and
    the kernel both average them uniformly.)"""
    if mask is None:
        return
    hidden = torch.isneginf(mask)
    if is_causal:
        q_len, kv_len = mask.shape[-2], mask.shape[-1]
        hidden = hidden | mask.new_ones((q_len, kv_len), dtype=torch.bool).triu(1)
    empty = hidden.all(dim=-1)
    out.masked_fill_(empty.unsqueeze(-1), 0.0)
    if lse.shape[-1]:
        lse.masked_fill_(empty, float("-inf"))


def _run_kernel(kernel, query, key, value, mask, scale, is_causal, return_lse):
    out, lse = _backend.run_kernel(kernel, query, key, value, mask, scale, is_causal, return_lse)
    out, lse = _fresh_outputs(query, value, out, lse)
    _zero_fully_masked_rows(out, lse, mask, is_causal)
    return out, lse


def _warn_reference_fallback(reason: str, where: str) -> None:
    warn_once(f"fallback:{where}:{reason}",
              f"neuron_vit_attn: the NKI attention kernel does not support {reason}; running the eager "
              f"reference instead ({where}). This warning is shown once.")


@torch.library.custom_op(OP_NAME, mutates_args=(), device_types="cpu")
def attention_fwd(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Optional[torch.Tensor],
                  scale: float, is_causal: bool, return_lse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU: the eager reference (``auto``, ``reference``) or the NKI kernel in the simulator (``sim``)."""
    args = (query, key, value, mask, scale, is_causal, return_lse)
    if _backend.selected_backend() == "sim":
        return _kernel_or_reference(_backend.sim_kernel_module(), _backend.simulated_kernel,
                                    "NEURON_VIT_ATTN_BACKEND=sim", *args)
    return _reference(*args)


@attention_fwd.register_kernel("privateuseone")
def _attention_fwd_neuron(query, key, value, mask, scale, is_causal, return_lse=False):
    """``neuron`` device: the NKI kernel on the device tensors (reference if forced or unsupported)."""
    args = (query, key, value, mask, scale, is_causal, return_lse)
    if _backend.selected_backend() != "reference":
        return _kernel_or_reference(_backend.device_kernel_module(), _backend.device_kernel, "neuron device", *args)
    return _reference(*args)


def _kernel_or_reference(module, get_kernel, where, query, key, value, mask, scale, is_causal, return_lse):
    """The NKI kernel when it covers the inputs, else the reference with a one-time warning naming why."""
    reason = kernel_unsupported_reason(query, key, value, scale) or _backend.kv_budget_reason(module, query, key)
    if reason is None:
        return _run_kernel(get_kernel(), query, key, value, mask, scale, is_causal, return_lse)
    _warn_reference_fallback(reason, where)
    return _reference(query, key, value, mask, scale, is_causal, return_lse)


@attention_fwd.register_fake
def _attention_fwd_fake(query, key, value, mask, scale, is_causal, return_lse=False):
    return _backend.empty_output(query, value), _lse_output(query, return_lse)


def _setup_context(ctx, inputs, output):
    query, key, value, mask, scale, is_causal, *rest = inputs
    ctx.save_for_backward(query, key, value, mask)
    ctx.scale = scale
    ctx.is_causal = is_causal
    ctx.return_lse = bool(rest and rest[0])


def _backward(ctx, grad_out, grad_lse):
    """Recompute through the eager reference and differentiate it (see the module docstring)."""
    saved = ctx.saved_tensors
    needs = ctx.needs_input_grad[:4]
    with torch.enable_grad(), torch._C._DisableAutocast():
        leaves = [None if t is None else t.detach().requires_grad_(need) for t, need in zip(saved, needs)]
        out, lse = attention_with_lse(*leaves, ctx.scale, ctx.is_causal)
        outputs, grads = [out], [grad_out]
        if ctx.return_lse and grad_lse is not None:
            outputs.append(lse)
            grads.append(grad_lse)
        wanted = [t for t, need in zip(leaves, needs) if need and t is not None]
        computed = iter(torch.autograd.grad(outputs, wanted, grads, allow_unused=True) if wanted else ())
    input_grads = [next(computed) if need and t is not None else None for t, need in zip(leaves, needs)]
    return (*input_grads, None, None, None)


attention_fwd.register_autograd(_backward, setup_context=_setup_context)
