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
    chk.on_chip_operands(instr, operands)
    chk.same_partitions(instr, operands)
    chk.same_free_size(instr, operands)
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
