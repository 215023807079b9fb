"""Per-engine accumulator registers and the ``reduce_cmd`` protocol (nki-reference.md 2.2, 2.3, 6.5).

ScalarE and VectorE each keep 128 fp32 registers, one per partition lane (indexed by the absolute
partition, so a tile on partitions 32..63 uses lanes 32..63). They live for one kernel launch
(one logical-core program). The instructions that use them:

* ScalarE: ``activation`` / ``activation_reduce`` (reduce_op must be ``nl.add``).
* VectorE: ``tensor_scalar_reduce``, ``exponential``, ``range_select``, ``select_reduce``.

``reduce_cmd`` semantics, from the NKI 0.6 docstrings:

* ``idle``: registers untouched by ScalarE. On VectorE the docs say the state "may still be
  modified" and is undefined, so nkisim sets the VectorE registers to NaN (a later ``reduce``
  then yields NaN, as it could on hardware). Asking for ``reduce_res`` with ``idle`` on VectorE
  reads undefined registers and is an error.
* ``reset``: registers = identity (0 for add); no reduction.
* ``reduce``: registers = reduce_op(registers, row reduction of this instruction).
* ``reset_reduce``: registers = identity, then as ``reduce``.
* ``load_reduce``: registers = ``reduce_init`` (scalar or [P, 1] fp32), then as ``reduce``
  (VectorE only).

The activation pseudo-code reads ``result = reduce_op(regs, reduce(output)); regs += result``,
which taken literally would count the old registers twice; nkisim implements the evident intent,
``regs = regs + reduce(output)``. Reductions use the fp32 values before the cast to ``dst``.
When ``reduce_res`` is given it receives the registers after the update (rounded to its dtype;
``reduce_res_negate`` negates what is written, not the registers).
"""

from __future__ import annotations

import numpy as np

from .. import ops as ops_mod
from ..errors import ShapeError, TargetError
from ..tensor import NkiTensor
from . import _checks as chk
from .enums import reduce_cmd as reduce_cmd_enum

LANES = 128


def registers(run, engine: str) -> np.ndarray:
    """The 128 fp32 accumulator registers of ``engine`` ("scalar" or "vector") in this launch."""
    regs = getattr(run, "accumulators", None)
    if regs is None:
        regs = run.accumulators = {"scalar": np.zeros(LANES, np.float32), "vector": np.zeros(LANES, np.float32)}
    return regs[engine]


def normalize_cmd(instr: str, cmd, allowed) -> reduce_cmd_enum:
    if cmd is None:
        cmd = reduce_cmd_enum.idle
    chk.enum_arg(instr, "reduce_cmd", cmd, reduce_cmd_enum)
    if cmd not in allowed:
        raise ShapeError(f"{instr}: reduce_cmd={cmd.name} is not supported, allowed: "
                         f"{', '.join(c.name for c in allowed)}")
    return cmd


def check_reduce_res(instr: str, reduce_res, partitions: int) -> None:
    if reduce_res is None:
        return
    chk.on_chip_operands(instr, [("reduce_res", reduce_res)])
    if tuple(reduce_res.shape) != (partitions, 1):
        raise ShapeError(f"{instr}: operand 'reduce_res' has shape {reduce_res.shape}, must be [{partitions}, 1]")


def update(instr: str, run, engine: str, cmd, values: np.ndarray, reduce_op: ops_mod.Op, start_partition: int,
           reduce_res=None, writes=None, reduce_init=None, negate_res: bool = False, reads=None) -> None:
    """Apply ``cmd`` with ``reduce_op`` over the free dim of ``values`` ([P, F] fp32)."""
    regs = registers(run, engine)
    p = values.shape[0]
    lanes = slice(start_partition, start_partition + p)
    identity = np.float32(reduce_op.identity)
    if cmd == reduce_cmd_enum.idle:
        if engine == "vector":
            regs[lanes] = np.nan
            if reduce_res is not None:
                raise ShapeError(f"{instr}: reduce_res with reduce_cmd=idle reads the VectorE accumulators, whose "
                                 f"state is undefined after idle; use reduce_cmd=reset_reduce (or reduce)")
    elif cmd == reduce_cmd_enum.reset:
        regs[lanes] = identity
    else:
        if cmd == reduce_cmd_enum.reset_reduce:
            regs[lanes] = identity
        elif cmd == reduce_cmd_enum.load_reduce:
            if engine != "vector":
                raise TargetError(f"{instr}: reduce_cmd=load_reduce is only available on VectorE instructions")
            if reduce_init is None:
                raise ShapeError(f"{instr}: reduce_cmd=load_reduce needs reduce_init (scalar or [{p}, 1] float32)")
            init = chk.scalar_operand(instr, "reduce_init", reduce_init, p)
            if isinstance(reduce_init, NkiTensor) and reads is not None:
                reads.append(("reduce_init", reduce_init))
            regs[lanes] = np.broadcast_to(init, (p, 1))[:, 0]
        with np.errstate(all="ignore"):
            row = reduce_op.reduce(values, axis=1).astype(np.float32) if values.shape[1] else \
                np.full(p, identity, np.float32)
            regs[lanes] = reduce_op.binary(regs[lanes], row)
    if reduce_res is not None:
        out = regs[lanes].reshape(p, 1)
        reduce_res.write((-out if negate_res else out).reshape(reduce_res.shape))
        if writes is not None:
            writes.append(("reduce_res", reduce_res))
