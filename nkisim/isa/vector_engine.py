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
from ..tensor import PSUM, SBUF, NkiTensor
from . import _checks as chk


def _op(instr: str, role: str, op) -> ops_mod.Op:
    if not isinstance(op, ops_mod.Op):
        raise ShapeError(f"{instr}: '{role}' must be an NKI operator such as nl.add, got {op!r}")
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
    operands = [("dst", dst), ("data1", data1), ("data2", data2)]
    chk.on_chip_operands(instr, operands)
    chk.same_partitions(instr, operands)
    chk.same_free_size(instr, operands)
    if data1.buffer == PSUM and data2.buffer == PSUM:
        raise MemoryPlacementError(f"{instr}: operands 'data1' and 'data2' are both in psum; at most one input may "
                                   f"be in PSUM")
    eng = chk.engine_name(engine)
    ints_only = all(dt.is_int(t.dtype) and t.itemsize == 4 for t in (data1, data2))
    if eng == "unknown":
        eng = "gpsimd" if (op is ops_mod.power or (ints_only and not op.bitvec)) else "vector"
    if eng == "gpsimd":
        chk.gpsimd_no_psum(instr, operands)
    for role, t in operands:
        chk.not_packed(instr, role, t)
    if op.bitvec:
        a, b = data1.numpy().reshape(data1.shape[0], -1), data2.numpy().reshape(data2.shape[0], -1)
    elif ints_only:
        a = data1.numpy().reshape(data1.shape[0], -1).astype(np.float64)
        b = data2.numpy().reshape(data2.shape[0], -1).astype(np.float64)
    else:
        a, b = chk.values_2d(data1), chk.values_2d(data2)
    with np.errstate(all="ignore"):
        result = _apply_binary(instr, op, a, b, data1.dtype, data2.dtype, dst.dtype)
    chk.write_2d(dst, result)
    return run.emit(instr, eng, reads=[("data1", data1), ("data2", data2)], writes=[("dst", dst)], label=name,
                    op=op.name)


def _resolve_engine(instr, engine, default="vector"):
    eng = chk.engine_name(engine)
    return default if eng == "unknown" else eng


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False, engine=None,
                  name=None):
    """``(data op0 operand0) op1 operand1``; operands are scalars or [P, 1] fp32 tiles."""
    instr = "tensor_scalar"
    run = runtime.begin(instr)
    op0 = _op(instr, "op0", op0)
    op1 = None if op1 is None else _op(instr, "op1", op1)
    operands = [("dst", dst), ("data", data)]
    chk.on_chip_operands(instr, operands)
    chk.same_partitions(instr, operands)
    chk.same_free_size(instr, operands)
    eng = _resolve_engine(instr, engine)
    target = run.target
    if eng == "gpsimd":
        chk.gpsimd_no_psum(instr, operands)
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
        if not isinstance(data, NkiTensor) or not dt.is_int(data.dtype):
            raise DtypeError(f"{instr}: bitvec operator {op.name} needs an integer data tensor")
        values = data.numpy().reshape(p, -1)
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
    chk.same_partitions(instr, operands)
    if op.identity is None:
        raise ShapeError(f"{instr}: {op.name} is not a reduction operator (legal: add, multiply, maximum, minimum, "
                         f"logical and/or/xor, bitwise and/or/xor)")
    axes = _normalize_axes(instr, data, axis)
    kept = [n for i, n in enumerate(data.shape) if i not in axes]
    expected = int(np.prod(kept[1:])) if len(kept) > 1 else 1
    if dst.free_size != expected:
        raise ShapeError(f"{instr}: dst has {dst.free_size} elements per partition, the reduction of {data.shape} over "
                         f"axis {axes} gives {expected}")
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
    chk.on_chip_operands(instr, operands)
    chk.same_partitions(instr, operands)
    chk.same_free_size(instr, operands)
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
    if dt.is_int(dst.dtype) and not float(value).is_integer():
        raise DtypeError(f"{instr}: value {value!r} must be an integer for dtype {dt.name(dst.dtype)}")
    if dt.is_packed(dst.dtype) and value != 0:
        raise DtypeError(f"{instr}: packed dtype {dt.name(dst.dtype)} can only be set to 0")
    dst.write(np.array(value, dtype=np.float32 if dt.is_float(dst.dtype) else np.int64))
    return run.emit(instr, eng, writes=[("dst", dst)], label=name, value=float(value))


def reciprocal(dst, data, name=None):
    """VectorE reciprocal: more precise than ScalarE ``activation(op=nl.reciprocal)``, ~8x slower."""
    instr = "reciprocal"
    run = runtime.begin(instr)
    operands = [("dst", dst), ("data", data)]
    chk.on_chip_operands(instr, operands)
    chk.same_partitions(instr, operands)
    chk.same_free_size(instr, operands)
    with np.errstate(all="ignore"):
        chk.write_2d(dst, (1.0 / chk.values_2d(data).astype(np.float64)).astype(np.float32))
    return run.emit(instr, "vector", reads=[("data", data)], writes=[("dst", dst)], label=name)
