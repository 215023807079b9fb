"""``nki.isa`` in nkisim: the NKI 0.6 instruction set, ``dst`` first, one module per engine.

| module | instructions |
|---|---|
| ``tensor_engine`` | nc_matmul, nc_transpose |
| ``vector_engine`` | tensor_tensor, tensor_scalar, scalar_tensor_tensor, tensor_reduce, tensor_copy, tensor_copy_predicated, memset, reciprocal |
| ``vector_reduce`` | tensor_scalar_reduce, exponential (trn3), range_select (trn2+), select_reduce, bn_stats, bn_aggr, max8, nc_find_index8, nc_match_replace8 |
| ``vector_scan`` | tensor_tensor_scan, tensor_scalar_cumulative, tensor_partition_reduce (GpSimd), nc_stream_shuffle |
| ``scalar_engine`` | activation, activation_reduce, activate2 (trn3) |
| ``gpsimd`` | iota, affine_select, nonzero_with_count (trn2+), nc_n_gather |
| ``dma`` | dma_copy (incl. vector_offset gather/scatter), dma_transpose (trn2+), dma_compute |
| ``lnc`` | core_barrier, sendrecv (LNC=2 launches run as two threads) |
| ``random`` | rng, rand2, dropout, set_rng_seed (NumPy PRNG, not the hardware's) |
| ``registers`` | VirtualRegister, register_alloc/move/load/store (and nl.fori_loop / nl.while_loop) |

Every instruction validates its operands against the hardware rules of nki-reference.md
(raising ``nkisim.errors`` classes), executes in NumPy, and returns the recorded
:class:`nkisim.trace.Instruction` (nkisim's ``NkiInstruction``).
"""

from ..errors import NkiError as NkiValidationError  # noqa: F401
from ..errors import NotSimulatedError
from ..target import get as _get_target
from ..trace import Instruction as NkiInstruction  # noqa: F401
from .dma import dma_compute, dma_copy, dma_transpose
from .enums import dge_mode, dma_engine, engine, matmul_perf_mode, nc_version, oob_mode, reduce_cmd
from .gpsimd import affine_select, iota, nc_n_gather, nonzero_with_count
from .lnc import core_barrier, sendrecv
from .random import dropout, rand2, rng, set_rng_seed
from .registers import VirtualRegister, register_alloc, register_load, register_move, register_store
from .scalar_engine import activate2, activation, activation_reduce
from .tensor_engine import nc_matmul, nc_transpose
from .vector_engine import (memset, reciprocal, scalar_tensor_tensor, tensor_copy, tensor_copy_predicated,
                            tensor_reduce, tensor_scalar, tensor_tensor)
from .vector_reduce import (bn_aggr, bn_stats, exponential, max8, nc_find_index8, nc_match_replace8, range_select,
                            select_reduce, tensor_scalar_reduce)
from .vector_scan import nc_stream_shuffle, tensor_partition_reduce, tensor_scalar_cumulative, tensor_tensor_scan

# Deprecated engine constants kept by NKI 0.6. They shadow the submodule attributes of the same
# name (nkisim.isa.tensor_engine is the enum member here): import submodule contents with
# ``from nkisim.isa.vector_engine import tensor_tensor``, which goes through sys.modules.
tensor_engine, vector_engine, scalar_engine = engine.tensor, engine.vector, engine.scalar
gpsimd_engine, unknown_engine = engine.gpsimd, engine.unknown


def _not_simulated(api: str, why: str):
    def instruction(*args, **kwargs):
        raise NotSimulatedError(f"nisa.{api} is part of NKI 0.6 but not simulated by nkisim ({why})")
    instruction.__name__ = api
    return instruction


# NKI 0.6 instructions without a simulation here: MX and
# random-number instructions, gathers and top-k helpers.
_MISSING = {
    "nc_matmul_mx": "MX formats", "quantize_mx": "MX formats",
    "rand_set_state": "PRNG state", "rand_get_state": "PRNG state",
    "local_gather": "cross-partition gathers", "sequence_bounds": "segment helpers",
    "topk": "the 16-partition snake layout of its docs is ambiguous",
}
globals().update({api: _not_simulated(api, why) for api, why in _MISSING.items()})


def get_nc_sub_version() -> int:
    """Silicon revision within the generation: nkisim models the first revision (0)."""
    return 0


def get_nc_version() -> nc_version:
    """NeuronCore version of the target selected by NEURON_PLATFORM_TARGET_OVERRIDE."""
    return nc_version(_get_target().nc_version)


__all__ = [
    "activate2", "dma_compute", "dma_copy", "dma_transpose", "affine_select", "iota", "activation", "activation_reduce", "nc_matmul",
    "nc_transpose", "memset", "reciprocal", "scalar_tensor_tensor", "tensor_copy", "tensor_copy_predicated",
    "tensor_reduce", "tensor_scalar", "tensor_tensor", "bn_aggr", "bn_stats", "exponential", "max8", "range_select",
    "select_reduce", "tensor_scalar_reduce", "nc_stream_shuffle", "tensor_partition_reduce",
    "tensor_scalar_cumulative", "tensor_tensor_scan", "VirtualRegister", "register_alloc", "register_load", "register_move",
    "register_store", "dge_mode", "dma_engine", "engine", "matmul_perf_mode", "nc_version", "oob_mode", "reduce_cmd",
    "get_nc_version", "get_nc_sub_version", "NkiInstruction", "NkiValidationError", "core_barrier", "sendrecv",
    "dropout", "rand2", "rng", "set_rng_seed", "nc_find_index8", "nc_match_replace8", "nonzero_with_count", "nc_n_gather",
]
