"""``nki.isa`` in nkisim: the NKI 0.6 instruction set, ``dst`` first, one module per engine.

| module | instructions |
|---|---|
| ``tensor_engine`` | nc_matmul, nc_transpose |
| ``vector_engine`` | tensor_tensor, tensor_scalar, tensor_reduce, tensor_copy, memset, reciprocal |
| ``scalar_engine`` | activation, activation_reduce |
| ``gpsimd`` | iota, affine_select |
| ``dma`` | dma_copy |

Every instruction validates its operands against the hardware rules of nki-reference.md
(raising ``nkisim.errors`` classes), executes in NumPy, and returns the recorded
:class:`nkisim.trace.Instruction`.
"""

from ..target import get as _get_target
from .dma import dma_copy
from .enums import dge_mode, dma_engine, engine, matmul_perf_mode, nc_version, oob_mode, reduce_cmd
from .gpsimd import affine_select, iota
from .scalar_engine import activation, activation_reduce
from .tensor_engine import nc_matmul, nc_transpose
from .vector_engine import memset, reciprocal, tensor_copy, tensor_reduce, tensor_scalar, tensor_tensor


def get_nc_version() -> nc_version:
    """NeuronCore version of the target selected by NEURON_PLATFORM_TARGET_OVERRIDE."""
    return nc_version(_get_target().nc_version)


__all__ = [
    "dma_copy", "affine_select", "iota", "activation", "activation_reduce", "nc_matmul", "nc_transpose", "memset",
    "reciprocal", "tensor_copy", "tensor_reduce", "tensor_scalar", "tensor_tensor",
    "dge_mode", "dma_engine", "engine", "matmul_perf_mode", "nc_version", "oob_mode", "reduce_cmd", "get_nc_version",
]
