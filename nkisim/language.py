"""``nki.language`` in nkisim (nki-reference.md sections 1.2, 2.8, 2.9).

Allocation (``ndarray``, ``zeros``...), buffers, dtypes, ``tile_size``, program ids, loop
helpers, and the experimental convenience layer (``load``, ``store``, ``matmul``, ``exp``,
``sum``...). Every convenience function lowers to ``nki.isa`` instructions, so it appears in
the trace as the instructions the compiler would emit (e.g. ``nl.exp(x)`` -> ``activation``).
New allocations hold NaN (floats) or 4 (integers), as in the official simulator.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from . import dtypes as _dt
from . import isa as _isa
from . import runtime as _runtime
from .dtypes import (bfloat16, bool_, float4_e2m1fn_x4, float8_e4m3, float8_e4m3fn, float8_e4m3fn_x4,  # noqa: F401
                     float8_e5m2, float8_e5m2_x4, float8_e8m0fnu, float16, float32, int8, int16, int32, tfloat32,
                     uint8, uint16, uint32)
from .errors import KernelError, ShapeError
from .ops import ALL as _OPS
from .tensor import HBM, ON_CHIP, PRIVATE_HBM, PSUM, SBUF, SHARED_HBM, NkiTensor, ds  # noqa: F401

globals().update(_OPS)   # nl.add, nl.exp, ... : operators usable as op= and as functions

sbuf, psum, hbm, shared_hbm, private_hbm = SBUF, PSUM, HBM, SHARED_HBM, PRIVATE_HBM
FP32_MIN = -3.4028235e38


class tile_size:  # noqa: N801 - NKI's name
    """Hardware tile limits (nki-reference.md section 2.9)."""
    pmax = 128
    psum_bank_fmax = 512
    psum_fmax = 512
    psum_bank_fmax_bytes = 2048
    psum_num_banks = 8
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    psum_min_align = 4
    sbuf_min_align = 4
    total_available_sbuf_size = 212984   # trn2 usable bytes per partition (deprecated constant)


# ---- allocation ----------------------------------------------------------------------------------

def _buffer(buffer) -> str:
    if buffer in (SBUF, PSUM, HBM, SHARED_HBM, PRIVATE_HBM):
        return buffer
    raise KernelError(f"unknown buffer {buffer!r}: use nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm or nl.private_hbm")


def ndarray(shape, dtype, buffer=SBUF, name="", address=None):
    """Allocate an uninitialised tensor (NaN / 4 filled)."""
    run = _runtime.begin("ndarray")
    shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    buffer = _buffer(buffer)
    dtype = _dt.normalize(dtype)
    if buffer in ON_CHIP:
        if len(shape) < 2:
            raise ShapeError(f"ndarray: on-chip tensors are at least 2-D [partition, free...], got shape {shape}")
        if shape[0] > tile_size.pmax:
            raise ShapeError(f"ndarray: partition dim {shape[0]} exceeds {tile_size.pmax} (nl.tile_size.pmax) "
                             f"for {buffer} tensor {name or ''}".rstrip())
        if address is not None and buffer == PSUM and int(address[1]) % tile_size.psum_bank_fmax_bytes:
            raise ShapeError(f"ndarray: PSUM address {address} must start on a 2 KiB bank boundary")
    return run.allocate(shape, dtype, buffer, name)


def _filled(shape, dtype, buffer, value, name=""):
    t = ndarray(shape, dtype, buffer=buffer, name=name)
    if t.on_chip:
        _isa.memset(t, value)
    else:
        t.write(np.array(value))
    return t


def zeros(shape, dtype, buffer=SBUF, name=""):
    return _filled(shape, dtype, buffer, 0, name)


def ones(shape, dtype, buffer=SBUF, name=""):
    return _filled(shape, dtype, buffer, 1, name)


def full(shape, fill_value, dtype, buffer=SBUF, name=""):
    return _filled(shape, dtype, buffer, fill_value, name)


def zeros_like(a, dtype=None, buffer=None, name=""):
    return zeros(a.shape, dtype or a.dtype, buffer=buffer or a.buffer, name=name)


def empty_like(a, dtype=None, buffer=None, name=""):
    return ndarray(a.shape, dtype or a.dtype, buffer=buffer or a.buffer, name=name)


# ---- programs and loops -----------------------------------------------------------------------------

def program_id(axis=0):
    if axis != 0:
        raise KernelError(f"program_id({axis}): NKI 0.6 launches have one axis (kernel[lnc])")
    return _runtime.begin("program_id").program_id


def num_programs(axes=0):
    return _runtime.begin("num_programs").num_programs


def program_ndim():
    return 1


def affine_range(*args):
    """Deprecated alias of ``range`` (fully unrolled at trace time)."""
    return range(*args)


sequential_range = static_range = affine_range


@contextlib.contextmanager
def no_reorder():
    yield


def device_print(prefix, tensor):
    print(prefix, tensor.numpy())


# ---- convenience layer -------------------------------------------------------------------------------

def load(src, dtype=None, name=""):
    """HBM -> new SBUF tile (``dma_copy``)."""
    out = ndarray(src.shape, dtype or src.dtype, buffer=SBUF, name=name)
    _isa.dma_copy(dst=out, src=src)
    return out


def store(dst, value):
    """SBUF -> HBM (``dma_copy``); PSUM values must be copied to SBUF first."""
    _isa.dma_copy(dst=dst, src=value)


def matmul(x, y, transpose_x=False):
    """``x.T @ y`` into a new fp32 PSUM tile; only ``transpose_x=True`` is supported (as in NKI 0.5+)."""
    if not transpose_x:
        raise KernelError("nl.matmul: only transpose_x=True is supported (x is [K, M], y is [K, N]); "
                          "transpose x first or call nisa.nc_matmul")
    out = ndarray((x.free_size, y.free_size), float32, buffer=PSUM)
    _isa.nc_matmul(dst=out, stationary=x, moving=y)
    return out


def transpose(x):
    """TensorE transpose into a new PSUM tile."""
    out = ndarray((x.free_size, x.shape[0]), x.dtype, buffer=PSUM)
    _isa.nc_transpose(dst=out, data=x)
    return out


def apply_op(op, x, y=None, dtype=None):
    """``nl.<op>(x[, y])``: activation functions -> ``activation``; ALU ops -> ``tensor_tensor`` or
    ``tensor_scalar`` (a Python scalar operand). Result is a new SBUF tile."""
    if not isinstance(x, NkiTensor):
        raise KernelError(f"nl.{op.name}: first argument must be a tensor, got {type(x).__name__}")
    out = ndarray(x.shape, dtype or x.dtype, buffer=SBUF)
    if y is None:
        if op is _OPS["copy"]:     # nl.copy(x): VectorE tensor_copy, bit-exact when dtypes match (0.6.0)
            _isa.tensor_copy(dst=out, src=x)
        elif op.activation:
            _isa.activation(dst=out, op=op, data=x)
        elif op.alu_unary or op.bitvec:
            _isa.tensor_scalar(dst=out, data=x, op0=op, operand0=0)
        else:
            raise KernelError(f"nl.{op.name} needs two operands")
    elif isinstance(y, NkiTensor):
        if y.shape != x.shape:
            raise ShapeError(f"nl.{op.name}: shapes {x.shape} and {y.shape} differ; nki.language binary ops do not "
                             f"broadcast (use nisa.tensor_scalar with a [P, 1] operand)")
        _isa.tensor_tensor(dst=out, data1=x, data2=y, op=op)
    else:
        _isa.tensor_scalar(dst=out, data=x, op0=op, operand0=y)
    return out


def _reduce(op, x, axis, keepdims=False, dtype=None):
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    axes = tuple(a % x.ndim for a in axes)
    shape = [1 if i in axes else n for i, n in enumerate(x.shape)] if keepdims else \
        [n for i, n in enumerate(x.shape) if i not in axes]
    if len(shape) < 2:
        shape = shape + [1] * (2 - len(shape))
    out = ndarray(tuple(shape), dtype or x.dtype, buffer=SBUF)
    _isa.tensor_reduce(dst=out, op=_OPS[op], data=x, axis=axes, keepdims=keepdims)
    return out


def sum(x, axis, keepdims=False, dtype=None):  # noqa: A001 - NKI's name
    return _reduce("add", x, axis, keepdims, dtype)


def max(x, axis, keepdims=False, dtype=None):  # noqa: A001
    return _reduce("maximum", x, axis, keepdims, dtype)


def min(x, axis, keepdims=False, dtype=None):  # noqa: A001
    return _reduce("minimum", x, axis, keepdims, dtype)


def prod(x, axis, keepdims=False, dtype=None):
    return _reduce("multiply", x, axis, keepdims, dtype)


def mean(x, axis, keepdims=False, dtype=None):
    total = sum(x, axis, keepdims, dtype=float32)
    count = math.prod(x.shape[a % x.ndim] for a in ((axis,) if isinstance(axis, int) else axis))
    out = ndarray(total.shape, dtype or x.dtype, buffer=SBUF)
    _isa.tensor_scalar(dst=out, data=total, op0=_OPS["multiply"], operand0=1.0 / count)
    return out


def softmax(x, axis=-1, dtype=None):
    """Row softmax over the free dim: max, exp with fused bias and row sum, reciprocal, scale."""
    if (axis % x.ndim) != x.ndim - 1 or x.ndim != 2:
        raise KernelError("nl.softmax: nkisim supports [P, F] tiles reduced over the last axis")
    p = x.shape[0]
    neg_max = ndarray((p, 1), float32)
    _isa.tensor_reduce(dst=neg_max, op=_OPS["maximum"], data=x, axis=1, negate=True, keepdims=True)
    e = ndarray(x.shape, float32)
    s = ndarray((p, 1), float32)
    _isa.activation(dst=e, op=_OPS["exp"], data=x, bias=neg_max, reduce_op=_OPS["add"], reduce_res=s,
                    reduce_cmd=_isa.reduce_cmd.reset_reduce)
    inv = ndarray((p, 1), float32)
    _isa.reciprocal(dst=inv, data=s)
    out = ndarray(x.shape, dtype or x.dtype)
    _isa.tensor_scalar(dst=out, data=e, op0=_OPS["multiply"], operand0=inv)
    return out
