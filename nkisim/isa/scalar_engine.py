"""ScalarE instructions: ``activation`` and ``activation_reduce`` (nki-reference.md section 2.2).

``dst = op(data * scale + bias)`` per element in fp32, rounded to dst's dtype. ``scale`` is an
fp32 scalar or ``[P, 1]`` fp32 tile; ``bias`` is a ``[P, 1]`` tile (trn1) or also a scalar
(trn2+). The engine keeps 128 fp32 accumulator registers, one per partition lane, driven by
``reduce_cmd`` (idle, reset, reduce, reset_reduce; see ``_accumulators.py`` for the exact rules);
``reduce_res`` (a ``[P, 1]`` tile), when given, receives the registers afterwards, also with
``idle`` (the docstring's pseudo-code: ``if reduce_res: reduce_res = reduce_regs``).

So ``activation(..., reduce_op=nl.add, reduce_res=s, reduce_cmd=reduce_cmd.reset_reduce)`` is a
fused exp-and-row-sum, and a chain ``reset`` ... ``reduce`` ... with ``reduce_res`` on the last
call sums across several instructions.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .. import ops as ops_mod
from .. import runtime
from ..errors import DtypeError, ShapeError, TargetError
from ..tensor import NkiTensor
from . import _checks as chk
from . import _accumulators as acc
from .enums import reduce_cmd as reduce_cmd_enum

ACTIVATION_CMDS = (reduce_cmd_enum.idle, reduce_cmd_enum.reset, reduce_cmd_enum.reduce, reduce_cmd_enum.reset_reduce)


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd_enum.idle,
               name=None):
    instr = "activation"
    run = runtime.begin(instr)
    target = run.target
    if not isinstance(op, ops_mod.Op) or not op.activation:
        raise ShapeError(f"{instr}: op must be an activation function (nl.exp, nl.gelu, nl.copy, ...), got {op!r}")
    operands = [("dst", dst), ("data", data)]
    chk.elementwise_operands(instr, operands)
    chk.not_packed(instr, "data", data)
    p = data.shape[0]
    reads = [("data", data)]
    scale_v = chk.scalar_operand(instr, "scale", scale, p)
    if isinstance(scale, NkiTensor):
        reads.append(("scale", scale))
    bias_v = np.zeros((1, 1), np.float32)
    if bias is not None:
        if isinstance(bias, NkiTensor):
            chk.on_chip_operands(instr, [("bias", bias)])
            if bias.shape[0] != p or bias.free_size != 1:
                raise ShapeError(f"{instr}: operand 'bias' has shape {bias.shape}, must be [{p}, 1]")
            if bias.dtype is dt.tfloat32:
                raise DtypeError(f"{instr}: operand 'bias' cannot be tfloat32")
            bias_v = bias.read_fp32().reshape(p, 1)
            reads.append(("bias", bias))
        else:
            if target.nc_version < 3:
                raise TargetError(f"{instr}: a scalar bias needs trn2 or newer; on {target.name} bias must be a "
                                  f"[P, 1] tile")
            bias_v = np.array([[bias]], dtype=np.float32)
    with np.errstate(all="ignore"):
        pre = (chk.values_2d(data) * scale_v + bias_v).astype(np.float32)
        out = op.unary(pre)
    chk.write_2d(dst, out)
    cmd = acc.normalize_cmd(instr, reduce_cmd, ACTIVATION_CMDS)
    writes = [("dst", dst)]
    if reduce_op is not None and reduce_op is not ops_mod.add:
        raise ShapeError(f"{instr}: reduce_op must be nl.add (ScalarE accumulates sums), got {reduce_op!r}")
    acc.check_reduce_res(instr, reduce_res, p)
    acc.update(instr, run, "scalar", cmd, out, ops_mod.add, data.start_partition, reduce_res, writes)
    return run.emit(instr, "scalar", reads=reads, writes=writes, label=name, op=op.name,
                    reduce=reduce_res is not None, reduce_cmd=int(cmd))


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    """``activation`` with ``reduce_cmd=reset_reduce``: kept for compatibility."""
    return activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
                      reduce_cmd=reduce_cmd_enum.reset_reduce, name=name)


ACTIVATE2_PAIRS = {("multiply", "add"), ("multiply", "subtract"), ("multiply", "bypass"), ("add", "bypass"),
                   ("subtract", "bypass"), ("bypass", "bypass")}
ACTIVATE2_REDUCE = ("add", "maximum", "minimum", "abs_max", "abs_min")


def activate2(dst, op, data, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False, reverse1=False, reduce_op=None,
              reduce_res=None, reduce_cmd=reduce_cmd_enum.idle, name=None):
    """trn3 only: ``op((data op0 imm0) op1 imm1)`` with ``nl.bypass`` stages, ``nl.prelu`` slope
    ``relu_param``, and a ScalarE accumulator reduction with add/max/min/abs_max/abs_min."""
    instr = "activate2"
    run = runtime.begin(instr)
    chk.target_at_least(instr, "nisa.activate2", run.target, 4)
    if not isinstance(op, ops_mod.Op) or not (op.activation or op is ops_mod.prelu):
        raise ShapeError(f"{instr}: op must be an activation function, got {op!r}")
    pair = (getattr(op0, "name", op0), getattr(op1, "name", op1))
    if pair not in ACTIVATE2_PAIRS:
        raise ShapeError(f"{instr}: (op0, op1) = {pair} is not supported; allowed {sorted(ACTIVATE2_PAIRS)}")
    operands = [("dst", dst), ("data", data)]
    chk.elementwise_operands(instr, operands)
    p = data.shape[0]
    reads = [("data", data)]
    values = chk.values_2d(data)
    with np.errstate(all="ignore"):
        for stage, role, imm, reverse in ((op0, "imm0", imm0, reverse0), (op1, "imm1", imm1, reverse1)):
            if stage is ops_mod.bypass:
                continue
            scalar = chk.scalar_operand(instr, role, imm, p)
            if isinstance(imm, NkiTensor):
                reads.append((role, imm))
            values = stage.binary(scalar, values) if reverse else stage.binary(values, scalar)
        if op is ops_mod.prelu:
            slope = chk.scalar_operand(instr, "relu_param", relu_param, p)
            out = np.where(values > 0, values, values * slope).astype(np.float32)
        else:
            out = op.unary(values.astype(np.float32))
    chk.write_2d(dst, out)
    cmd = acc.normalize_cmd(instr, reduce_cmd, ACTIVATION_CMDS)
    reduce_op = ops_mod.add if reduce_op is None else reduce_op
    if reduce_op.name not in ACTIVATE2_REDUCE:
        raise ShapeError(f"{instr}: reduce_op must be one of nl.{', nl.'.join(ACTIVATE2_REDUCE)}, got {reduce_op!r}")
    writes = [("dst", dst)]
    acc.check_reduce_res(instr, reduce_res, p)
    acc.update(instr, run, "scalar", cmd, out, reduce_op, data.start_partition, reduce_res, writes)
    return run.emit(instr, "scalar", reads=reads, writes=writes, label=name, op=op.name, op0=pair[0], op1=pair[1],
                    reduce_cmd=int(cmd))
