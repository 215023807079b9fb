"""Operand validation shared by the instructions (nki-reference.md sections 1.4, 2, 6.6).

Every check raises an ``nkisim.errors`` class whose message names the instruction, the
operand, the offending value and the limit.
"""

from __future__ import annotations

import numbers

import numpy as np

from .. import dtypes as dt
from ..errors import (AccessPatternError, DtypeError, MemoryPlacementError, PartitionError, ShapeError,
                      TargetError, limit_error)
from ..tensor import HBM_BUFFERS, ON_CHIP, PSUM, SBUF, NkiTensor

PMAX = 128
MAX_FREE_DIMS = 4   # engines address up to a 4-D free access pattern per partition


def tensor(instr: str, role: str, t) -> NkiTensor:
    if not isinstance(t, NkiTensor):
        raise ShapeError(f"{instr}: operand '{role}' must be an NKI tensor, got {type(t).__name__}")
    return t


def buffer(instr: str, role: str, t: NkiTensor, allowed: tuple) -> None:
    if t.buffer not in allowed:
        raise MemoryPlacementError(
            f"{instr}: operand '{role}' is in {t.buffer}, allowed buffers are {', '.join(allowed)}")


def partitions(instr: str, role: str, t: NkiTensor, compute: bool = True) -> None:
    """Partition count <= 128; compute engines also need an aligned start partition."""
    if not t.on_chip:
        return
    p = t.shape[0]
    if p > PMAX:
        raise limit_error(PartitionError, instr, role, "partition dim", p, f"{PMAX} (nl.tile_size.pmax)")
    if not compute or p == 0:
        return
    start = t.start_partition
    if p > 64:
        allowed = (0,)
    elif p > 32:
        allowed = (0, 64)
    else:
        allowed = (0, 32, 64, 96)
    if start not in allowed:
        raise limit_error(PartitionError, instr, role, f"start partition (for {p} partitions)", start,
                          f"one of {allowed} (partition quadrant alignment)")
    if len(t.free_pattern()) > MAX_FREE_DIMS:
        raise limit_error(AccessPatternError, instr, role, "free access pattern rank", len(t.free_pattern()),
                          f"{MAX_FREE_DIMS} dims")


def same_partitions(instr: str, roles_tensors: list) -> None:
    counts = {role: t.shape[0] for role, t in roles_tensors}
    if len(set(counts.values())) > 1:
        raise ShapeError(f"{instr}: operands have different partition counts {counts}; they must match")


def same_free_size(instr: str, roles_tensors: list) -> None:
    sizes = {role: t.free_size for role, t in roles_tensors}
    if len(set(sizes.values())) > 1:
        raise ShapeError(f"{instr}: operands have different element counts per partition {sizes}; they must match")


def on_chip_operands(instr: str, roles_tensors: list, allowed=ON_CHIP, compute: bool = True) -> None:
    for role, t in roles_tensors:
        tensor(instr, role, t)
        buffer(instr, role, t, allowed)
        partitions(instr, role, t, compute)


def elementwise_operands(instr: str, roles_tensors: list, allowed=ON_CHIP) -> None:
    """The usual elementwise contract: on-chip operands with equal partitions and elements per partition."""
    on_chip_operands(instr, roles_tensors, allowed)
    same_partitions(instr, roles_tensors)
    same_free_size(instr, roles_tensors)


def not_packed(instr: str, role: str, t: NkiTensor) -> None:
    if dt.is_packed(t.dtype):
        raise DtypeError(f"{instr}: operand '{role}' has packed MX dtype {dt.name(t.dtype)}; only nc_matmul_mx reads it")


def scalar_operand(instr: str, role: str, value, partitions_: int, *, allow_none: bool = False,
                   fp32_only: bool = True) -> np.ndarray | None:
    """A compile-time scalar or a ``[P, 1]`` tile (fp32 unless ``fp32_only=False``), as fp32
    broadcastable to ``(P, 1)``."""
    if value is None:
        if allow_none:
            return None
        raise ShapeError(f"{instr}: operand '{role}' is required")
    if isinstance(value, NkiTensor):
        buffer(instr, role, value, ON_CHIP)
        if value.shape[0] != partitions_ or value.free_size != 1:
            raise ShapeError(f"{instr}: operand '{role}' has shape {value.shape}; a vector operand must be "
                             f"[{partitions_}, 1] (one value per partition)")
        if fp32_only and value.dtype != dt.float32:
            raise DtypeError(f"{instr}: operand '{role}' is {dt.name(value.dtype)}; scalar/vector operands must be "
                             f"float32 (hardware reads them as fp32)")
        return value.read_fp32().reshape(partitions_, 1)
    if isinstance(value, (bool, np.bool_)):
        raise ShapeError(f"{instr}: operand '{role}' is a bool; pass a number")
    if isinstance(value, (numbers.Number, np.number)):
        return np.array([[value]], dtype=np.float32)
    raise ShapeError(f"{instr}: operand '{role}' must be a number or a [P, 1] float32 tile, got {type(value).__name__}")


def target_at_least(instr: str, what: str, target, version: int) -> None:
    if target.nc_version < version:
        names = {3: "trn2", 4: "trn3"}
        raise TargetError(f"{instr}: {what} needs NeuronCore-v{version} ({names.get(version)}) or newer; "
                          f"target is {target.name} (NeuronCore-v{target.nc_version})")


def enum_arg(instr: str, role: str, value, enum_cls, allow_none: bool = True):
    """An enum parameter: a member of ``enum_cls`` (raw integers are refused since NKI 0.3.0)."""
    if value is None and allow_none:
        return None
    if not isinstance(value, enum_cls):
        raise DtypeError(f"{instr}: '{role}' must be a nisa.{enum_cls.__name__} member, got {value!r}; raw integer "
                         f"enum constants are not accepted since NKI 0.3.0")
    return value


def engine_name(engine, instr: str = "instruction") -> str:
    """Engine enum (or None/unknown) -> trace name."""
    from .enums import engine as engine_enum
    enum_arg(instr, "engine", engine, engine_enum)
    if engine is None or engine == engine_enum.unknown:
        return "unknown"
    return {engine_enum.tensor: "tensor", engine_enum.vector: "vector", engine_enum.scalar: "scalar",
            engine_enum.gpsimd: "gpsimd", engine_enum.dma: "dma", engine_enum.sync: "sync"}[engine]


def gpsimd_no_psum(instr: str, roles_tensors: list) -> None:
    for role, t in roles_tensors:
        if isinstance(t, NkiTensor) and t.buffer == PSUM:
            raise MemoryPlacementError(f"{instr}: operand '{role}' is in psum; GpSimd cannot access PSUM")


def values_2d(t: NkiTensor) -> np.ndarray:
    """fp32 values as ``[P, free]`` (HBM tensors as ``[1, size]``)."""
    return t.read_fp32().reshape(t.partitions, -1)


def write_2d(t: NkiTensor, values: np.ndarray) -> None:
    t.write(np.asarray(values).reshape(t.shape))


__all__ = ["SBUF", "PSUM", "HBM_BUFFERS", "ON_CHIP"]
