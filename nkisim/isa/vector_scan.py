"""Scans, partition reductions and partition shuffles (nki-reference.md section 2.3).

* ``tensor_tensor_scan`` (VectorE): ``res[:, 0] = op1(op0(data0[:, 0], initial), data1[:, 0])``,
  ``res[:, i] = op1(op0(data0[:, i], res[:, i-1]), data1[:, i])`` over the flattened free dim.
* ``tensor_scalar_cumulative`` (VectorE): ``reg = op1(op0(x[i], imm0), reg); dst[i] = reg`` with the
  register set by ``reduce_cmd`` (reset_reduce: identity of op1 -- 0 for add/subtract, 1 for
  multiply, -inf/+inf for max/min; reduce: the shared VectorE accumulator; load_reduce: imm1).
  The running value stays in the VectorE accumulators afterwards.
* ``tensor_partition_reduce`` (GpSimd): reduce across partitions (add, average, maximum,
  bitwise_or, bitwise_and) into a one-partition ``dst``.
* ``nc_stream_shuffle`` (VectorE): per 32-partition quadrant, output partition i copies input
  partition ``shuffle_mask[i]`` (255 leaves it unmodified).
All arithmetic in fp32 (scans are sequential loops over the free dim, vectorised over partitions).
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .. import ops as ops_mod
from .. import runtime
from ..errors import DtypeError, MemoryPlacementError, ShapeError
from ..tensor import PSUM, NkiTensor
from . import _accumulators as acc
from . import _checks as chk
from .enums import reduce_cmd as rc

QUADRANT = 32
SHUFFLE_KEEP = 255
CUMULATIVE_OPS = ("add", "subtract", "multiply", "maximum", "minimum")
CUMULATIVE_IDENTITY = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": -np.inf, "minimum": np.inf}
PARTITION_REDUCE_OPS = ("add", "average", "maximum", "bitwise_or", "bitwise_and")


def _arith(instr, role, op):
    if not isinstance(op, ops_mod.Op) or op.binary is None or op.bitvec:
        raise ShapeError(f"{instr}: {role} must be a binary arithmetic operator, got {op!r}")
    return op


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None):
    instr = "tensor_tensor_scan"
    run = runtime.begin(instr)
    op0, op1 = _arith(instr, "op0", op0), _arith(instr, "op1", op1)
    operands = [("dst", dst), ("data0", data0), ("data1", data1)]
    chk.elementwise_operands(instr, operands)
    if data0.buffer == PSUM and data1.buffer == PSUM:
        raise MemoryPlacementError(f"{instr}: operands 'data0' and 'data1' are both in psum; at most one may be")
    p = data0.shape[0]
    reads = [("data0", data0), ("data1", data1)]
    state = chk.scalar_operand(instr, "initial", initial, p)[:, 0] * np.ones(p, np.float32)
    if isinstance(initial, NkiTensor):
        reads.append(("initial", initial))
    a, b = chk.values_2d(data0), chk.values_2d(data1)
    out = np.empty_like(a)
    with np.errstate(all="ignore"):
        for i in range(a.shape[1]):
            tmp = op0.binary(state, a[:, i]) if reverse0 else op0.binary(a[:, i], state)
            state = op1.binary(b[:, i], tmp) if reverse1 else op1.binary(tmp, b[:, i])
            out[:, i] = state
    chk.write_2d(dst, out)
    return run.emit(instr, "vector", reads=reads, writes=[("dst", dst)], label=name, op0=op0.name, op1=op1.name)


def tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None, reduce_cmd=rc.reset_reduce, name=None):
    instr = "tensor_scalar_cumulative"
    run = runtime.begin(instr)
    op0 = _arith(instr, "op0", op0)
    if not isinstance(op1, ops_mod.Op) or op1.name not in CUMULATIVE_OPS:
        raise ShapeError(f"{instr}: op1 must be one of nl.{', nl.'.join(CUMULATIVE_OPS)}, got {op1!r}")
    operands = [("dst", dst), ("src", src)]
    chk.elementwise_operands(instr, operands)
    for role, t in operands:
        if t.dtype in (dt.int32, dt.uint32):
            raise DtypeError(f"{instr}: operand '{role}' dtype {dt.name(t.dtype)} is not supported (no int32/uint32)")
    cmd = acc.normalize_cmd(instr, reduce_cmd, (rc.reset_reduce, rc.reduce, rc.load_reduce))
    p = src.shape[0]
    reads = [("src", src)]
    scalar = chk.scalar_operand(instr, "imm0", imm0, p)
    if isinstance(imm0, NkiTensor):
        reads.append(("imm0", imm0))
    regs = acc.registers(run, "vector")
    lanes = slice(src.start_partition, src.start_partition + p)
    if cmd == rc.reset_reduce:
        regs[lanes] = CUMULATIVE_IDENTITY[op1.name]
    elif cmd == rc.load_reduce:
        init = chk.scalar_operand(instr, "imm1", imm1, p)
        regs[lanes] = np.broadcast_to(init, (p, 1))[:, 0]
        if isinstance(imm1, NkiTensor):
            reads.append(("imm1", imm1))
    state = regs[lanes].copy()
    values = chk.values_2d(src)
    out = np.empty_like(values)
    with np.errstate(all="ignore"):
        for i in range(values.shape[1]):
            state = op1.binary(op0.binary(values[:, i:i + 1], scalar)[:, 0], state)
            out[:, i] = state
    regs[lanes] = state
    chk.write_2d(dst, out)
    return run.emit(instr, "vector", reads=reads, writes=[("dst", dst)], label=name, op0=op0.name, op1=op1.name,
                    reduce_cmd=int(cmd))


def tensor_partition_reduce(dst, op, data, name=None):
    instr = "tensor_partition_reduce"
    run = runtime.begin(instr)
    if not isinstance(op, ops_mod.Op) or op.name not in PARTITION_REDUCE_OPS:
        raise ShapeError(f"{instr}: op must be one of nl.{', nl.'.join(PARTITION_REDUCE_OPS)}, got {op!r}")
    operands = [("dst", dst), ("data", data)]
    chk.gpsimd_no_psum(instr, operands)
    chk.on_chip_operands(instr, operands)
    chk.same_free_size(instr, operands)
    if dst.shape[0] != 1:
        raise ShapeError(f"{instr}: dst has {dst.shape[0]} partitions; the partition reduction writes 1")
    if op.bitvec:
        result = op.reduce(data.numpy().reshape(data.shape[0], -1), axis=0)
    else:
        with np.errstate(all="ignore"):
            result = op.reduce(chk.values_2d(data), axis=0).astype(np.float32)
    chk.write_2d(dst, np.asarray(result).reshape(1, -1))
    return run.emit(instr, "gpsimd", reads=[("data", data)], writes=[("dst", dst)], label=name, op=op.name)


def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    instr = "nc_stream_shuffle"
    run = runtime.begin(instr)
    operands = [("dst", dst), ("src", src)]
    chk.on_chip_operands(instr, operands, compute=False)
    chk.same_free_size(instr, operands)
    if src.dtype != dst.dtype:
        raise DtypeError(f"{instr}: dst dtype {dt.name(dst.dtype)} must equal src dtype {dt.name(src.dtype)}")
    mask = [int(m) for m in shuffle_mask]
    if len(mask) != QUADRANT or any(not (0 <= m < QUADRANT or m == SHUFFLE_KEEP) for m in mask):
        raise ShapeError(f"{instr}: shuffle_mask must list {QUADRANT} source partitions in 0..31 (or 255), got {mask}")
    active = -(-max(src.shape[0], dst.shape[0]) // QUADRANT) * QUADRANT
    allowed = {128: (0,), 96: (0,), 64: (0, 64), 32: (0, 32, 64, 96)}[active]
    for role, t in operands:
        if t.start_partition not in allowed:
            raise ShapeError(f"{instr}: operand '{role}' start partition is {t.start_partition}, limit one of "
                             f"{allowed} for {active} active partitions")
    values = np.array(src.numpy()).reshape(src.shape[0], -1)
    result = np.array(dst.numpy()).reshape(dst.shape[0], -1)
    for p in range(dst.shape[0]):
        source = mask[p % QUADRANT]
        if source != SHUFFLE_KEEP:
            src_p = (p // QUADRANT) * QUADRANT + source
            if src_p >= src.shape[0]:
                raise ShapeError(f"{instr}: output partition {p} reads src partition {src_p}, src has {src.shape[0]}")
            result[p] = values[src_p]
    dst.numpy()[...] = result.reshape(dst.shape)
    return run.emit(instr, "vector", reads=[("src", src)], writes=[("dst", dst)], label=name)
