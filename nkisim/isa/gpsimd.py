"""GpSimdE instructions: ``iota``, ``affine_select``, ``nonzero_with_count`` (nki-reference.md 2.4).

Both evaluate the affine index expression ``offset + p * channel_multiplier + sum(step_i * j_i)``
over the partition ``p`` and the free loop nest ``pattern = [[step, num], ...]`` (up to 4-D),
in int32. GpSimd cannot access PSUM.
"""

from __future__ import annotations

import math

import numpy as np

from .. import dtypes as dt
from .. import ops as ops_mod
from .. import runtime
from ..errors import DtypeError, ShapeError, limit_error
from ..tensor import SBUF, NkiTensor
from . import _checks as chk

_INT_COMPARE = {"equal": np.equal, "not_equal": np.not_equal, "greater": np.greater,
                "greater_equal": np.greater_equal, "less": np.less, "less_equal": np.less_equal}


def affine_values(instr: str, role: str, pattern, partitions: int, offset: int, channel_multiplier: int) -> np.ndarray:
    """``[P, prod(num)]`` int64 array of the affine expression."""
    pattern = [[int(s), int(n)] for s, n in pattern]
    if not 1 <= len(pattern) <= 4:
        raise limit_error(ShapeError, instr, role, "pattern rank", len(pattern), "1 to 4 [step, num] pairs")
    free = np.zeros(1, dtype=np.int64)
    for step, num in pattern:
        free = (free[:, None] + step * np.arange(num, dtype=np.int64)[None, :]).reshape(-1)
    part = np.arange(partitions, dtype=np.int64)[:, None] * int(channel_multiplier)
    return int(offset) + part + free[None, :]


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    instr = "iota"
    run = runtime.begin(instr)
    chk.gpsimd_no_psum(instr, [("dst", dst)])
    chk.on_chip_operands(instr, [("dst", dst)], allowed=(SBUF,))
    n = math.prod(int(num) for _, num in pattern)
    if dst.free_size != n:
        raise ShapeError(f"{instr}: dst has {dst.free_size} elements per partition, pattern {pattern} generates {n}")
    values = affine_values(instr, "pattern", pattern, dst.shape[0], offset, channel_multiplier)
    chk.write_2d(dst, values.astype(np.int32))
    return run.emit(instr, "gpsimd", writes=[("dst", dst)], label=name)


def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op=ops_mod.equal, offset=0,
                  name=None):
    """``dst = on_true_tile where cmp_op(affine, 0) else on_false_value`` (causal masks)."""
    instr = "affine_select"
    run = runtime.begin(instr)
    operands = [("dst", dst), ("on_true_tile", on_true_tile)]
    chk.gpsimd_no_psum(instr, operands)
    chk.elementwise_operands(instr, operands, allowed=(SBUF,))
    n = math.prod(int(num) for _, num in pattern)
    if dst.free_size != n:
        raise ShapeError(f"{instr}: dst has {dst.free_size} elements per partition, pattern {pattern} generates {n}")
    if not isinstance(cmp_op, ops_mod.Op) or cmp_op.name not in _INT_COMPARE:
        raise ShapeError(f"{instr}: cmp_op must be a comparison operator such as nl.greater_equal, got {cmp_op!r}")
    if isinstance(on_false_value, NkiTensor) or not isinstance(on_false_value, (int, float, np.number)):
        raise ShapeError(f"{instr}: on_false_value must be a float32 scalar, got {type(on_false_value).__name__}")
    # The affine value is int32 on hardware; compare exactly in int64 rather than through fp32.
    affine = affine_values(instr, "pattern", pattern, dst.shape[0], offset, channel_multiplier)
    keep = _INT_COMPARE[cmp_op.name](affine, 0)
    values = np.where(keep, chk.values_2d(on_true_tile), np.float32(on_false_value))
    chk.write_2d(dst, values)
    return run.emit(instr, "gpsimd", reads=[("on_true_tile", on_true_tile)], writes=[("dst", dst)], label=name,
                    cmp_op=cmp_op.name)


GPSIMD_CORE_PARTITIONS = 16     # each of the 8 GpSimd cores serves 16 partitions


def nonzero_with_count(dst, src, index_offset=0, padding_val=-1, name=None):
    """trn2+: per GpSimd core (partitions 0, 16, ..., 112 only), the indices (+ ``index_offset``) of
    the nonzero elements of ``src``, then ``padding_val`` fill, then the count in the extra last slot.
    Other partitions of ``dst`` are left unmodified."""
    instr = "nonzero_with_count"
    run = runtime.begin(instr)
    chk.target_at_least(instr, "nisa.nonzero_with_count", run.target, 3)
    operands = [("dst", dst), ("src", src)]
    chk.gpsimd_no_psum(instr, operands)
    chk.on_chip_operands(instr, operands, allowed=(SBUF,))
    chk.same_partitions(instr, operands)
    if dst.free_size != src.free_size + 1:
        raise ShapeError(f"{instr}: dst has {dst.free_size} elements per partition, it needs src's "
                         f"{src.free_size} + 1 (the count)")
    if src.dtype not in (dt.float32, dt.int32) or dst.dtype != dt.int32:
        raise DtypeError(f"{instr}: src must be float32 or int32 and dst int32, got {dt.name(src.dtype)} and "
                         f"{dt.name(dst.dtype)}")
    values = np.asarray(src.numpy()).reshape(src.shape[0], -1)
    out = np.array(dst.numpy()).reshape(dst.shape[0], -1)
    for p in range(0, src.shape[0], GPSIMD_CORE_PARTITIONS):
        hits = np.flatnonzero(values[p] != 0)
        row = np.full(out.shape[1], int(padding_val), dtype=np.int64)
        row[:hits.size] = hits + int(index_offset)
        row[-1] = hits.size
        out[p] = row
    dst.assign(out.reshape(dst.shape).astype(np.int32))
    return run.emit(instr, "gpsimd", reads=[("src", src)], writes=[("dst", dst)], label=name)


def nc_n_gather(dst, data, indices, name=None):
    """``dst[p, j] = data[p, indices[p, j]]`` over each partition's flattened free dims (GpSimd,
    SBUF only, uint32 indices, bit-exact; dst has data's dtype and indices' element count)."""
    instr = "nc_n_gather"
    run = runtime.begin(instr)
    operands = [("dst", dst), ("data", data), ("indices", indices)]
    chk.gpsimd_no_psum(instr, operands)
    chk.on_chip_operands(instr, operands, allowed=(SBUF,))
    chk.same_partitions(instr, operands)
    chk.same_free_size(instr, [("dst", dst), ("indices", indices)])
    if indices.dtype != dt.uint32:
        raise DtypeError(f"{instr}: operand 'indices' dtype is {dt.name(indices.dtype)}, it must be uint32")
    if dst.dtype != data.dtype:
        raise DtypeError(f"{instr}: dst dtype {dt.name(dst.dtype)} must equal data dtype {dt.name(data.dtype)}")
    p = data.shape[0]
    idx = np.asarray(indices.numpy()).reshape(p, -1).astype(np.int64)
    if idx.size and idx.max() >= data.free_size:
        raise limit_error(ShapeError, instr, "indices", "maximum index", int(idx.max()),
                          f"{data.free_size - 1} (elements per partition of data - 1)")
    gathered = np.take_along_axis(np.asarray(data.numpy()).reshape(p, -1), idx, axis=1)
    dst.assign(gathered.reshape(dst.shape))
    return run.emit(instr, "gpsimd", reads=[("data", data), ("indices", indices)], writes=[("dst", dst)],
                    label=name)
