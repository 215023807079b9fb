"""Run the attention op on emulated ``neuron`` tensors, in a process of its own.

Started by test_ops_neuron_device.py as a subprocess, because renaming PrivateUse1 to "neuron" (and
registering its device module) cannot be undone in a process. ``NeuronTensor`` reports device ``neuron`` (so the dispatcher picks the
op's PrivateUse1 kernel and the autograd key of that device) but keeps its data on CPU: aten ops
on it run on the CPU data and re-wrap the result. The op's neuron kernel then calls the real
NKI kernel (kernels/attention.py, nkisim standing in for nki); the adapter installed as
``_backend.device_kernel`` plays the part of ``nki.jit``'s device-tensor handling (unwrap to the
HBM buffer, wrap the outputs) and records what it was given. Prints one JSON line of findings.
"""

import json
import os
import sys

import torch
from torch.utils._pytree import tree_map

# Rename PrivateUse1 to "neuron" and give it the device guard and hooks that autograd needs
# (the Python-backend setup torch provides for backends without C++ parts).
torch.utils.backend_registration._setup_privateuseone_for_python_backend(rename="neuron")

import nkisim  # noqa: E402

nkisim.install()

import neuron_vit_attn as nva  # noqa: E402
from neuron_vit_attn import _backend  # noqa: E402
from neuron_vit_attn._ops import ops  # noqa: E402

CPU = torch.device("cpu")
NEURON = torch.device("neuron", 0)     # autograd's engine needs a device index
PRIVATEUSE1 = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)
findings = {"op_calls": 0, "kernel_calls": []}


class NeuronTensor(torch.Tensor):
    """A tensor the dispatcher sees on the ``neuron`` device, with CPU data inside."""

    @staticmethod
    def __new__(cls, data: torch.Tensor):
        wrapper = torch.Tensor._make_wrapper_subclass(cls, data.shape, strides=data.stride(),
                                                      storage_offset=data.storage_offset(), dtype=data.dtype,
                                                      device=NEURON, requires_grad=data.requires_grad)
        wrapper.cpu_data = data
        return wrapper

    def __repr__(self):
        return f"NeuronTensor({self.cpu_data!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is ops.attention_fwd.default:
            findings["op_calls"] += 1
            return func.redispatch(PRIVATEUSE1, *args, **kwargs)     # -> the op's PrivateUse1 kernel
        if func is torch.ops.aten._to_copy.default and kwargs.get("device") == CPU:
            return unwrap(args[0]).to(**kwargs)
        result = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        return tree_map(wrap, result)


def unwrap(x):
    if isinstance(x, NeuronTensor):
        return x.cpu_data
    return CPU if isinstance(x, torch.device) and x.type == "neuron" else x


def wrap(x):
    return NeuronTensor(x) if isinstance(x, torch.Tensor) and not isinstance(x, NeuronTensor) else x


# Factories that name the device (autograd's zero gradients for unused outputs, ...) reach the
# PrivateUse1 key with no tensor argument: allocate on CPU and wrap.
_aten_neuron = torch.library.Library("aten", "IMPL")


def _empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return NeuronTensor(torch.empty(size, dtype=dtype, memory_format=memory_format))


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return NeuronTensor(torch.empty_strided(size, stride, dtype=dtype))


_aten_neuron.impl("empty.memory_format", _empty_memory_format, "PrivateUse1")
_aten_neuron.impl("empty_strided", _empty_strided, "PrivateUse1")


def device_kernel_adapter():
    """What nki.jit does with device tensors: the kernel reads their buffers, outputs come back on device."""
    kernel = _backend.device_kernel.__wrapped__()

    def launch(q, k, v, mask, **consts):
        buffers = [unwrap(t) for t in (q, k, v)]
        findings["kernel_calls"].append({
            "layout": consts["layout"], "kernel_shapes": [list(b.shape) for b in buffers],
            "buffers_contiguous": all(b.is_contiguous() for b in buffers),
            "buffer_ptrs": [b.data_ptr() for b in buffers],
            "all_on_neuron": all(t.device.type == "neuron" for t in (q, k, v) + (() if mask is None else (mask,))),
        })
        with nkisim.trace() as trace:
            out = kernel(*buffers, None if mask is None else unwrap(mask), **consts)
        findings["kernel_calls"][-1]["nc_matmul"] = trace.count("nc_matmul")
        return tree_map(wrap, out)
    return launch


def main():
    real_device_kernel = _backend.device_kernel
    _backend.device_kernel = lambda: device_kernel_adapter()
    _backend.device_kernel.__wrapped__ = real_device_kernel

    gen = torch.Generator().manual_seed(0)
    # Transformers' layout: (B, H, S, D) views of a contiguous (B, S, H, D) projection; GQA, causal.
    q_cpu = torch.randn(1, 24, 4, 32, generator=gen).transpose(1, 2).requires_grad_(True)
    k_cpu = torch.randn(1, 24, 2, 32, generator=gen).transpose(1, 2).requires_grad_(True)
    v_cpu = torch.randn(1, 24, 2, 32, generator=gen).transpose(1, 2).requires_grad_(True)
    projections = [t.detach().transpose(1, 2).contiguous() for t in (q_cpu, k_cpu, v_cpu)]   # (B, S, H, D)
    findings["projection_ptrs"] = [p.data_ptr() for p in projections]
    q, k, v = (NeuronTensor(p).transpose(1, 2).detach().requires_grad_(True) for p in projections)
    findings["input_device"] = str(q.device)

    out = nva.attention(q, k, v, is_causal=True, enable_gqa=True)
    findings["out_device"] = str(out.device)
    expected = torch.nn.functional.scaled_dot_product_attention(q_cpu, k_cpu, v_cpu, is_causal=True, enable_gqa=True)
    findings["forward_max_err"] = (unwrap(out) - expected).abs().max().item()

    grad_out = torch.randn(expected.shape, generator=gen)
    grads = torch.autograd.grad(out, (q, k, v), NeuronTensor(grad_out))
    expected_grads = torch.autograd.grad(expected, (q_cpu, k_cpu, v_cpu), grad_out)
    findings["grad_devices"] = sorted({str(g.device) for g in grads})
    findings["backward_max_err"] = max((unwrap(g) - e).abs().max().item() for g, e in zip(grads, expected_grads))

    mask = NeuronTensor(torch.rand(1, 1, 24, 24, generator=gen) > 0.2)
    out2, weights = nva.flash_attn_forward(None, q.detach(), k.detach(), v.detach(), mask, is_causal=False)
    ref2 = torch.nn.functional.scaled_dot_product_attention(q_cpu.detach(), k_cpu.detach(), v_cpu.detach(),
                                                            attn_mask=unwrap(mask), enable_gqa=True)
    findings["flash_out_shape"] = list(out2.shape)
    findings["flash_max_err"] = (unwrap(out2) - ref2.transpose(1, 2)).abs().max().item()

    os.environ["NEURON_VIT_ATTN_BACKEND"] = "reference"
    calls_before = len(findings["kernel_calls"])
    nva.attention(q.detach(), k.detach(), v.detach(), enable_gqa=True)
    findings["reference_backend_kernel_calls"] = len(findings["kernel_calls"]) - calls_before
    print(json.dumps(findings))


if __name__ == "__main__":
    sys.exit(main())
