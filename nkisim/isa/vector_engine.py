"""VectorE instructions (some also run on ScalarE/GpSimd): nki-reference.md section 2.3.

All arithmetic reads inputs as fp32, computes in fp32 and rounds to the destination dtype (RNE).
Bitvec operators act on integer bit patterns with no cast. Operands live in SBUF or PSUM
(GpSimd: SBUF only); ``tensor_tensor`` never reads both inputs from PSUM.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .. import ops as ops_mod
from .. import runtime
from ..errors import DtypeError, MemoryPlacementError, ShapeError, TargetError
from ..tensor import PSUM, NkiTensor
from . import _checks as chk


TRN3_ALU_OPS = ("abs_max", "abs_min")


def _op(instr: str, role: str, op) -> ops_mod.Op:
    if not isinstance(op, ops_mod.Op):
        raise ShapeError(f"{instr}: '{role}' must be an NKI operator such as nl.add, got {op!r}")
    if op.name in TRN3_ALU_OPS:
        chk.target_at_least(instr, f"operator nl.{op.name}", runtime.begin(instr).target, 4)
    return op


def _apply_binary(instr: str, op: ops_mod.Op, a, b, a_dtype, b_dtype, out_dtype):
    """``op(a, b)`` on fp32 values, or on integer bit patterns for bitvec operators."""
    if op.bitvec:
        for d in (a_dtype, b_dtype, out_dtype):
            if d is not None and not dt.is_int(d):
                raise DtypeError(f"{instr}: bitvec operator {op.name} needs integer dtypes, got {dt.name(d)}")
        return op.binary(np.asarray(a), None if b is None else np.asarray(b))
    if op.binary is not None:
        return op.binary(a, b)
    if op.alu_unary:
        return op.unary(a)
    raise ShapeError(f"{instr}: {op.name} is not an ALU operator (activation functions run on ScalarE via activation)")


def tensor_tensor(dst, data1, data2, op, engine=None, name=None):
    instr = "tensor_tensor"
    run = runtime.begin(instr)
    op = _op(instr, "op", op)
    if op.binary is None:
        raise ShapeError(f"{instr}: op={op!r} is unary; tensor_tensor needs a binary ALU operator (nl.add, "
                         f"nl.multiply, ...); unary ops run through tensor_scalar or activation")
    operands = [("dst", dst), ("data1", data1), ("data2", data2)]
    chk.elementwise_operands(instr, operands)
    if data1.buffer == PSUM and data2.buffer == PSUM:
        raise MemoryPlacementError(f"{instr}: operands 'data1' and 'data2' are both in psum; at most one input may "
                                   f"be in PSUM")
    eng = chk.engine_name(engine, instr)
    ints_only = all(dt.is_int(t.dtype) and t.itemsize == 4 for t in (dst, data1, data2))
    any_psum = any(t.buffer == PSUM for _, t in operands)
    if eng == "unknown":
        # nl.power runs on GpSimd; all-int32/uint32 arithmetic defaults to GpSimd for exact integer
        # math, falling back to VectorE when an operand is in PSUM (docstring of tensor_tensor).
        eng = "gpsimd" if (op is ops_mod.power or (ints_only and not op.bitvec and not any_psum)) else "vector"
    if eng == "gpsimd":
        chk.gpsimd_no_psum(instr, operands)
    for role, t in operands:
        chk.not_packed(instr, role, t)
    if op.bitvec:
        a, b = data1.numpy().reshape(data1.shape[0], -1), data2.numpy().reshape(data2.shape[0], -1)
        with np.errstate(all="ignore"):
            result = _apply_binary(instr, op, a, b, data1.dtype, data2.dtype, dst.dtype)
    elif ints_only and eng == "gpsimd" and op.name in _EXACT_INT_OPS:
        a = data1.numpy().reshape(data1.shape[0], -1).astype(np.int64)
        b = data2.numpy().reshape(data2.shape[0], -1).astype(np.int64)
        result = _EXACT_INT_OPS[op.name](a, b)
    else:
        a, b = chk.values_2d(data1), chk.values_2d(data2)
        with np.errstate(all="ignore"):
            result = _apply_binary(instr, op, a, b, data1.dtype, data2.dtype, dst.dtype)
    chk.write_2d(dst, result)
    return run.emit(instr, eng, reads=[("data1", data1), ("data2", data2)], writes=[("dst", dst)], label=name,
                    op=op.name)


# GpSimd integer arithmetic on int32/uint32 (exact; results saturate on the cast to dst).
_EXACT_INT_OPS = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum,
    "equal": np.equal, "not_equal": np.not_equal, "greater": np.greater, "greater_equal": np.greater_equal,
    "less": np.less, "less_equal": np.less_equal,
}


def _resolve_engine(instr, engine, default="vector"):
    eng = chk.engine_name(engine, instr)
    return default if eng == "unknown" else eng


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False, engine=None,
                  name=None):
    """``(data op0 operand0) op1 operand1``; operands are scalars or [P, 1] fp32 tiles."""
    instr = "tensor_scalar"
    run = runtime.begin(instr)
    op0 = _op(instr, "op0", op0)
    op1 = None if op1 is None else _op(instr, "op1", op1)
    operands = [("dst", dst), ("data", data)]
    chk.elementwise_operands(instr, operands)
    eng = chk.engine_name(engine, instr)
    uses_rsqrt = ops_mod.rsqrt in (op0, op1)
    if eng == "unknown":
        # rsqrt is a GpSimd/ScalarE ALU op (not VectorE): the compiler places it on GpSimd.
        eng = "gpsimd" if uses_rsqrt else "vector"
    elif eng == "vector" and uses_rsqrt:
        raise TargetError(f"{instr}: nl.rsqrt is not a VectorE ALU operator; use engine=nisa.engine.gpsimd, or "
                          f"nisa.activation(op=nl.rsqrt) on ScalarE")
    target = run.target
    if eng == "gpsimd":
        chk.gpsimd_no_psum(instr, operands)
    if op1 is not None and op0.bitvec != op1.bitvec:
        raise ShapeError(f"{instr}: op0={op0.name} and op1={op1.name} must both be bitvec or both arithmetic")
    if op1 is None and operand1 is not None:
        raise ShapeError(f"{instr}: operand1 is given but op1 is None; both must be None when unused")
    for op in (op0, op1):
        if op is not None and op.name in ("square", "relu") and eng != "scalar":
            chk.target_at_least(instr, f"unary operator nl.{op.name}", target, 4)
    if (op0.bitvec or (op1 is not None and op1.bitvec)) and eng != "vector":
        raise TargetError(f"{instr}: bitvec operators run on VectorE only, engine is {eng}")
    if eng == "scalar" and target.nc_version == 3:
        pair = (op0.name, None if op1 is None else op1.name)
        if pair not in (("multiply", "add"), ("multiply", None), ("add", None)):
            raise TargetError(f"{instr}: ScalarE on trn2 supports (multiply, add), (multiply, None), (add, None); "
                              f"got {pair}")
    p = data.shape[0]
    reads = [("data", data)]
    result = _scalar_stage(instr, data, op0, operand0, reverse0, "operand0", p, reads, dst.dtype)
    if op1 is not None:
        result = _scalar_stage(instr, result, op1, operand1, reverse1, "operand1", p, reads, dst.dtype)
    chk.write_2d(dst, result)
    return run.emit(instr, eng, reads=reads, writes=[("dst", dst)], label=name, op0=op0.name,
                    op1=None if op1 is None else op1.name)


def _scalar_stage(instr, data, op, operand, reverse, role, p, reads, out_dtype):
    """One ``tensor_scalar`` stage: ``data op operand`` (or reversed)."""
    if op.alu_unary and op.binary is None:
        values = chk.values_2d(data) if isinstance(data, NkiTensor) else data
        return op.unary(values)
    if op.bitvec:
        if isinstance(data, NkiTensor):
            if not dt.is_int(data.dtype):
                raise DtypeError(f"{instr}: bitvec operator {op.name} needs an integer data tensor, got "
                                 f"{dt.name(data.dtype)}")
            values = data.numpy().reshape(p, -1)
        else:
            values = data              # the integer result of the first stage
        if isinstance(operand, NkiTensor):
            reads.append((role, operand))
            scalar = operand.numpy().reshape(p, 1).astype(values.dtype)
        else:
            scalar = np.array([[operand]]).astype(values.dtype)
        return op.binary(scalar, values) if reverse else op.binary(values, scalar)
    values = chk.values_2d(data) if isinstance(data, NkiTensor) else data
    scalar = chk.scalar_operand(instr, role, operand, p)
    if isinstance(operand, NkiTensor):
        reads.append((role, operand))
    with np.errstate(all="ignore"):
        return op.binary(scalar, values) if reverse else op.binary(values, scalar)


def _normalize_axes(instr, data, axis):
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    axes = tuple(sorted(a % data.ndim for a in axes))
    if 0 in axes and data.on_chip:
        raise ShapeError(f"{instr}: cannot reduce along the partition dim (axis 0); transpose first, or use a matmul "
                         f"with a ones vector")
    trailing = tuple(range(data.ndim - len(axes), data.ndim))
    if axes != trailing:
        raise ShapeError(f"{instr}: axis {axes} must be trailing free axes {trailing} of the rank-{data.ndim} data")
    return axes


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    instr = "tensor_reduce"
    run = runtime.begin(instr)
    op = _op(instr, "op", op)
    operands = [("dst", dst), ("data", data)]
    chk.on_chip_operands(instr, operands)
    axes = _normalize_axes(instr, data, axis)
    chk.same_partitions(instr, operands)
    if op.identity is None:
        raise ShapeError(f"{instr}: {op.name} is not a reduction operator (legal: add, multiply, maximum, minimum, "
                         f"logical and/or/xor, bitwise and/or/xor)")
    kept = [n for i, n in enumerate(data.shape) if i not in axes]
    expected = int(np.prod(kept[1:])) if len(kept) > 1 else 1
    if dst.free_size != expected:
        raise ShapeError(f"{instr}: dst has {dst.free_size} elements per partition, the reduction of {data.shape} over "
                         f"axis {axes} gives {expected}")
    # The compiler maps the kept free dims of data onto dst dim by dim (keepdims or not), so a dst
    # that refactors them (e.g. [16, 4, 2] for kept [16, 8]) is refused even with equal counts.
    kept_free = [n for n in kept[1:] if n != 1]
    if [n for n in dst.shape[1:] if n != 1] != kept_free:
        raise ShapeError(f"{instr}: dst shape {dst.shape} cannot hold the reduction of {data.shape} over axis {axes}: "
                         f"its free dims must be the kept dims {tuple(kept[1:])} (size-1 dims aside)")
    if negate and op.bitvec:
        raise ShapeError(f"{instr}: negate=True is only for arithmetic operators, not {op.name}")
    if op.bitvec:
        values = data.numpy()
        result = op.reduce(values, axis=axes)
    else:
        values = data.read_fp32()
        with np.errstate(all="ignore"):
            result = op.reduce(values, axis=axes).astype(np.float32)
        if negate:
            result = -result
    chk.write_2d(dst, np.asarray(result).reshape(dst.shape[0], -1))
    return run.emit(instr, "vector", reads=[("data", data)], writes=[("dst", dst)], label=name, op=op.name,
                    negate=negate)


def tensor_copy(dst, src, engine=None, name=None):
    """Copy with cast via fp32; VectorE/GpSimd are bit-exact when the dtypes match."""
    instr = "tensor_copy"
    run = runtime.begin(instr)
    operands = [("dst", dst), ("src", src)]
    chk.elementwise_operands(instr, operands)
    eng = _resolve_engine(instr, engine)
    if eng == "gpsimd":
        chk.gpsimd_no_psum(instr, operands)
    if eng == "scalar" and run.target.nc_version == 2:
        raise TargetError(f"{instr}: ScalarE has no tensor_copy on trn1; use activation(op=nl.copy)")
    if eng not in ("vector", "scalar", "gpsimd"):
        raise TargetError(f"{instr}: engine must be vector, scalar or gpsimd, got {eng}")
    if src.dtype == dst.dtype and eng != "scalar":
        dst.numpy()[...] = src.numpy().reshape(dst.shape)
    else:
        chk.not_packed(instr, "src", src)
        chk.write_2d(dst, chk.values_2d(src))
    return run.emit(instr, eng, reads=[("src", src)], writes=[("dst", dst)], label=name)


def memset(dst, value, engine=None, name=None):
    instr = "memset"
    run = runtime.begin(instr)
    chk.on_chip_operands(instr, [("dst", dst)])
    eng = _resolve_engine(instr, engine)
    if eng == "gpsimd":
        chk.gpsimd_no_psum(instr, [("dst", dst)])
    if dt.is_int(dst.dtype) and not isinstance(value, (int, np.integer)):
        # NKI 0.3.0 "strict type matching": no silent float -> int conversion, even for 2.0.
        raise DtypeError(f"{instr}: value {value!r} must be an integer literal for dtype {dt.name(dst.dtype)}")
    if dt.is_packed(dst.dtype) and value != 0:
        raise DtypeError(f"{instr}: packed dtype {dt.name(dst.dtype)} can only be set to 0")
    dst.write(np.array(value, dtype=np.float32 if dt.is_float(dst.dtype) else np.int64))
    return run.emit(instr, eng, writes=[("dst", dst)], label=name, value=float(value))


def reciprocal(dst, data, name=None):
    """VectorE reciprocal: more precise than ScalarE ``activation(op=nl.reciprocal)``, ~8x slower."""
    instr = "reciprocal"
    run = runtime.begin(instr)
    operands = [("dst", dst), ("data", data)]
    chk.elementwise_operands(instr, operands)
    with np.errstate(all="ignore"):
        chk.write_2d(dst, (1.0 / chk.values_2d(data).astype(np.float64)).astype(np.float32))
    return run.emit(instr, "vector", reads=[("data", data)], writes=[("dst", dst)], label=name)


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None):
    """``(data op0 operand0) op1 operand1``: operand0 a scalar or [P, 1] tile, operand1 a full tile.
    Arithmetic operators only; ``data`` and ``operand1`` are not both in PSUM. operand0 tiles may have
    any dtype (the docstring says "all input tiles can be any supported NKI data type")."""
    instr = "scalar_tensor_tensor"
    run = runtime.begin(instr)
    op0, op1 = _op(instr, "op0", op0), _op(instr, "op1", op1)
    for role, op in (("op0", op0), ("op1", op1)):
        if op.bitvec or op.binary is None:
            raise ShapeError(f"{instr}: {role}={op.name} must be a binary arithmetic operator (no bitvec, no unary)")
    operands = [("dst", dst), ("data", data), ("operand1", operand1)]
    chk.elementwise_operands(instr, operands)
    if data.buffer == PSUM and operand1.buffer == PSUM:
        raise MemoryPlacementError(f"{instr}: operands 'data' and 'operand1' are both in psum; at most one may be in PSUM")
    for role, t in operands:
        chk.not_packed(instr, role, t)
    p = data.shape[0]
    reads = [("data", data)]
    scalar = chk.scalar_operand(instr, "operand0", operand0, p, fp32_only=False)
    if isinstance(operand0, NkiTensor):
        chk.on_chip_operands(instr, [("operand0", operand0)])
        reads.append(("operand0", operand0))
    reads.append(("operand1", operand1))
    values, other = chk.values_2d(data), chk.values_2d(operand1)
    with np.errstate(all="ignore"):
        tmp = op0.binary(scalar, values) if reverse0 else op0.binary(values, scalar)
        result = op1.binary(other, tmp) if reverse1 else op1.binary(tmp, other)
    chk.write_2d(dst, result)
    return run.emit(instr, "vector", reads=reads, writes=[("dst", dst)], label=name, op0=op0.name, op1=op1.name)


PREDICATE_DTYPES = (dt.uint8, dt.uint16, dt.uint32)


def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None):
    """``dst = src where predicate != 0`` (``== 0`` with ``reverse_pred``), dst untouched elsewhere.
    predicate is uint8/uint16/uint32; src (a tile or a number) has dst's dtype; src and predicate
    are not both in PSUM. Copies are bit-exact."""
    instr = "tensor_copy_predicated"
    run = runtime.begin(instr)
    operands = [("dst", dst), ("predicate", predicate)]
    if isinstance(src, NkiTensor):
        operands.append(("src", src))
    chk.elementwise_operands(instr, operands)
    if predicate.dtype not in PREDICATE_DTYPES:
        raise DtypeError(f"{instr}: operand 'predicate' dtype is {dt.name(predicate.dtype)}, allowed uint8, uint16, "
                         f"uint32")
    p = dst.shape[0]
    mask = predicate.numpy().reshape(p, -1) != 0
    if reverse_pred:
        mask = ~mask
    current = dst.numpy().reshape(p, -1).copy() if dst.is_contiguous() else np.array(dst.numpy()).reshape(p, -1)
    reads = [("predicate", predicate)]
    if isinstance(src, NkiTensor):
        if src.dtype != dst.dtype:
            raise DtypeError(f"{instr}: src dtype {dt.name(src.dtype)} must equal dst dtype {dt.name(dst.dtype)}")
        if src.buffer == PSUM and predicate.buffer == PSUM:
            raise MemoryPlacementError(f"{instr}: operands 'src' and 'predicate' are both in psum; at most one may be")
        values = np.array(src.numpy()).reshape(p, -1)
        reads.insert(0, ("src", src))
    else:
        values = dt.cast(np.full((p, 1), src, dtype=np.float32), dst.dtype)
    dst.numpy()[...] = np.where(mask, values, current).reshape(dst.shape)
    # dst is read as well: unselected elements keep their old value.
    return run.emit(instr, "vector", reads=reads + [("dst_in", dst)], writes=[("dst", dst)], label=name)
