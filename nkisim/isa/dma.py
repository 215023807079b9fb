"""DMA instructions: ``dma_copy`` and ``dma_transpose`` (nki-reference.md section 2.5).

``dma_copy`` moves ``src`` to ``dst`` element by element in row-major order of the two views:
shapes may differ, total element counts must match. Either side may be HBM or SBUF, never PSUM
(NKI 0.3.0+: evict PSUM with ``tensor_copy`` first). Different dtypes are converted through fp32
(not for packed MX types); ``dge_mode=hwdge`` requires equal dtypes.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .. import runtime
from ..errors import DtypeError, MemoryPlacementError, ShapeError
from ..tensor import HBM_BUFFERS, PSUM, SBUF
from . import _checks as chk
from ..errors import limit_error
from .enums import dge_mode as dge_mode_enum
from .enums import engine as engine_enum
from .enums import oob_mode as oob_mode_enum

# dma_transpose default permutation by rank (docstring): 2-D [1, 0], 3-D [2, 1, 0], 4-D [3, 1, 2, 0].
TRANSPOSE_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}
HWDGE_TRANSPOSE_ROWS = 16
HWDGE_TRANSPOSE_LEADING = (1, 2, 4, 8, 16)     # src.shape[0] of a 3-D/4-D hwdge transpose (isa docstring)

DMA_BUFFERS = (SBUF,) + HBM_BUFFERS


def _dma_operands(instr, roles_tensors, allowed=DMA_BUFFERS):
    for role, t in roles_tensors:
        chk.tensor(instr, role, t)
        if t.buffer == PSUM:
            raise MemoryPlacementError(f"{instr}: operand '{role}' is in psum; DMA cannot access PSUM (NKI 0.3.0+), "
                                       f"allowed buffers are {', '.join(allowed)}; evict PSUM with nisa.tensor_copy first")
        chk.buffer(instr, role, t, allowed)
        chk.partitions(instr, role, t, compute=False)


def dma_copy(dst, src, priority=None, oob_mode=oob_mode_enum.error, dge_mode=dge_mode_enum.unknown,
             engine=engine_enum.unknown, name=None):
    instr = "dma_copy"
    run = runtime.begin(instr)
    _dma_operands(instr, (("dst", dst), ("src", src)))
    chk.enum_arg(instr, "dge_mode", dge_mode, dge_mode_enum)
    chk.enum_arg(instr, "oob_mode", oob_mode, oob_mode_enum)
    chk.engine_name(engine, instr)
    if dge_mode == dge_mode_enum.hwdge:
        chk.target_at_least(instr, "dge_mode=hwdge", run.target, 3)
    if priority is not None:
        chk.target_at_least(instr, "priority", run.target, 4)
        if int(priority) not in range(4):
            raise limit_error(ShapeError, instr, "priority", "value", priority, "0..3")
    if dst.size != src.size:
        raise ShapeError(f"{instr}: dst has {dst.size} elements {dst.shape}, src has {src.size} {src.shape}; "
                         f"element counts must match")
    if dst.gather is not None or src.gather is not None:
        if dge_mode == dge_mode_enum.hwdge:
            raise ShapeError(f"{instr}: vector_offset (gather/scatter) DMAs need software DGE; dge_mode=hwdge "
                             f"does not support indirect access")
        return _indirect_copy(instr, run, dst, src, oob_mode, name)
    if dst.dtype != src.dtype:
        if dge_mode == dge_mode_enum.hwdge:
            raise DtypeError(f"{instr}: dge_mode=hwdge cannot cast {dt.name(src.dtype)} -> {dt.name(dst.dtype)}; "
                             f"dtypes must match (use .view())")
        for role, t in (("dst", dst), ("src", src)):
            if dt.is_packed(t.dtype):
                raise DtypeError(f"{instr}: operand '{role}' packed dtype {dt.name(t.dtype)} cannot be cast by DMA")
        dst.write(src.read_fp32().reshape(dst.shape))
    else:
        dst.numpy()[...] = np.reshape(src.numpy(), dst.shape)
    return run.emit(instr, "dma", reads=[("src", src)], writes=[("dst", dst)], label=name,
                    dge_mode=None if dge_mode is None else int(dge_mode))


def _rows_in_bounds(instr, role, t, oob_mode):
    """Which dim-0 rows of an indirect view lie inside its storage; an error unless oob_mode=skip."""
    if t.gather is None:
        return None
    rows = t.indirect_rows()
    idx = t.flat_indices(rows)
    axes = tuple(range(1, t.ndim))
    ok = (idx.min(axis=axes) >= 0) & (idx.max(axis=axes) < t.storage.data.size) if axes else \
        (idx >= 0) & (idx < t.storage.data.size)
    if not ok.all() and oob_mode != oob_mode_enum.skip:
        bad = rows[~ok][:4].tolist()
        raise ShapeError(f"{instr}: operand '{role}' indirect indices {bad} are out of bounds for {t.name} "
                         f"{t.storage.shape} (oob_mode=error; pass oob_mode=nisa.oob_mode.skip to skip them)")
    return ok


def _indirect_copy(instr, run, dst, src, oob_mode, name):
    """Gather (indirect src) / scatter (indirect dst) DMA, dim-0 rows matched one to one."""
    if dst.shape[0] != src.shape[0]:
        raise ShapeError(f"{instr}: indirect copy needs equal dim-0 sizes, dst {dst.shape} vs src {src.shape}")
    src_ok, dst_ok = _rows_in_bounds(instr, "src", src, oob_mode), _rows_in_bounds(instr, "dst", dst, oob_mode)
    mask = np.ones(src.shape[0], bool)
    for ok in (src_ok, dst_ok):
        if ok is not None:
            mask &= ok
    if src_ok is not None and not src_ok.all():
        values = np.zeros(src.shape, dt.storage(src.dtype))
        values[src_ok] = src.storage.data[src.flat_indices()[src_ok]]
    else:
        values = src.numpy()
    if dst.dtype != src.dtype:
        values = dt.cast(dt.to_fp32(values, src.dtype), dst.dtype)
    dst.assign(np.reshape(values, dst.shape), row_mask=mask)
    return run.emit(instr, "dma", reads=[("src", src)], writes=[("dst", dst)], label=name, indirect=True,
                    oob_mode=int(oob_mode))


def dma_transpose(dst, src, axes=None, priority=None, dge_mode=dge_mode_enum.unknown, oob_mode=oob_mode_enum.error,
                  name=None):
    """trn2+: ``dst = src.transpose(axes)`` by DMA, bit-exact; src in HBM or SBUF, dst in SBUF, equal
    2- or 4-byte dtypes; dst shape must equal the permuted src shape, rank included. Supported axes:
    (1, 0), (2, 1, 0), (3, 1, 2, 0) (the default for the rank). ``dge_mode=hwdge`` adds the HW DGE
    limits (2-byte dtype, src.shape[-1] <= 128, 16 rows for 2-D; for 3-D/4-D src.shape[0] in
    {1, 2, 4, 8, 16} with src.shape[0] * src.shape[-2] a multiple of 16); a direct transpose takes
    dge_mode unknown or hwdge only. Indirect (vector_offset) sources are not simulated."""
    instr = "dma_transpose"
    run = runtime.begin(instr)
    chk.target_at_least(instr, "nisa.dma_transpose", run.target, 3)
    _dma_operands(instr, (("src", src),))
    _dma_operands(instr, (("dst", dst),), allowed=(SBUF,))
    if src.dtype != dst.dtype:
        raise DtypeError(f"{instr}: src dtype {dt.name(src.dtype)} must equal dst dtype {dt.name(dst.dtype)}")
    if dt.itemsize(src.dtype) not in (2, 4):
        raise DtypeError(f"{instr}: dtype {dt.name(src.dtype)} has {dt.itemsize(src.dtype)} bytes; DMA transpose "
                         f"handles 2- and 4-byte dtypes")
    rank = len(src.shape)
    if rank not in TRANSPOSE_AXES:
        raise ShapeError(f"{instr}: src has rank {rank}; DMA transpose supports rank 2, 3 or 4")
    axes = TRANSPOSE_AXES[rank] if axes is None else tuple(int(a) for a in axes)
    if axes != TRANSPOSE_AXES[rank]:
        raise ShapeError(f"{instr}: axes {axes} not supported for rank {rank}; use {TRANSPOSE_AXES[rank]}")
    expected = tuple(src.shape[a] for a in axes)
    if tuple(dst.shape) != expected:
        raise ShapeError(f"{instr}: dst shape {dst.shape} must equal the transposed src shape {expected} (rank included)")
    if dge_mode not in (dge_mode_enum.unknown, dge_mode_enum.hwdge):
        raise ShapeError(f"{instr}: a direct DMA transpose takes dge_mode unknown or hwdge, got {dge_mode!r} "
                         f"(software DGE is for indirect transposes)")
    if dge_mode == dge_mode_enum.hwdge:
        if dt.itemsize(src.dtype) != 2:
            raise DtypeError(f"{instr}: dge_mode=hwdge needs a 2-byte dtype, got {dt.name(src.dtype)}")
        if src.shape[-1] > 128:
            raise limit_error(ShapeError, instr, "src", "last dim (hwdge)", src.shape[-1], 128)
        if rank == 2 and src.shape[0] != HWDGE_TRANSPOSE_ROWS:
            raise limit_error(ShapeError, instr, "src", "rows (hwdge, 2-D)", src.shape[0], f"exactly {HWDGE_TRANSPOSE_ROWS}")
        leading_ok = src.shape[0] in HWDGE_TRANSPOSE_LEADING and (src.shape[0] * src.shape[-2]) % HWDGE_TRANSPOSE_ROWS == 0
        if rank > 2 and not leading_ok:
            raise limit_error(ShapeError, instr, "src", "shape (hwdge, 3-D/4-D)", tuple(src.shape),
                              f"shape[0] in {HWDGE_TRANSPOSE_LEADING} and shape[0] * shape[-2] a multiple of "
                              f"{HWDGE_TRANSPOSE_ROWS}")
    dst.numpy()[...] = np.transpose(src.numpy(), axes)
    return run.emit(instr, "dma", reads=[("src", src)], writes=[("dst", dst)], label=name, axes=axes)


MAX_DMA_COMPUTE_SRCS = 16


def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=oob_mode_enum.error, name=None):
    """``dst = reduce_op(srcs[0] * scales[0], ...)`` inside the DMA engines, in fp32: only ``nl.add``
    and unit scales are supported (as documented). Sources or dst may be vector_offset views, which
    gives the scatter/gather read-modify-write forms (all reads happen before the write)."""
    from .. import ops as ops_mod
    instr = "dma_compute"
    run = runtime.begin(instr)
    srcs = list(srcs)
    if not 1 <= len(srcs) <= MAX_DMA_COMPUTE_SRCS:
        raise limit_error(ShapeError, instr, "srcs", "count", len(srcs), f"1..{MAX_DMA_COMPUTE_SRCS}")
    roles = [("dst", dst)] + [(f"srcs[{i}]", s) for i, s in enumerate(srcs)]
    _dma_operands(instr, roles)
    if reduce_op is not ops_mod.add:
        raise ShapeError(f"{instr}: reduce_op must be nl.add (the only one supported), got {reduce_op!r}")
    if scales is not None and any(float(s) != 1.0 for s in scales):
        raise ShapeError(f"{instr}: scales must all be 1.0 (or None), got {list(scales)}")
    if not unique_indices:
        raise ShapeError(f"{instr}: unique_indices=False is not supported (non-unique scatter indices)")
    for role, t in roles[1:]:
        if t.size != dst.size:
            raise ShapeError(f"{instr}: operand '{role}' has {t.size} elements, dst has {dst.size}; counts must match")
    row_mask = None             # gather/scatter rows inside bounds (all rows unless oob_mode=skip)
    for role, t in roles:
        ok = _rows_in_bounds(instr, role, t, oob_mode)
        if ok is not None:
            if t.shape[0] != dst.shape[0]:
                raise ShapeError(f"{instr}: indirect operand '{role}' has {t.shape[0]} rows, dst has {dst.shape[0]}; "
                                 f"they must match")
            row_mask = ok if row_mask is None else row_mask & ok
    total = np.zeros(dst.shape, np.float32)
    for src in srcs:
        if src.gather is not None:      # out-of-bounds rows (skipped below) read a clamped address
            values = src.storage.data[np.clip(src.flat_indices(), 0, src.storage.data.size - 1)]
        else:
            values = src.numpy()
        total += dt.to_fp32(np.asarray(values), src.dtype).reshape(dst.shape)
    dst.assign(dt.cast(total, dst.dtype), row_mask=row_mask)
    return run.emit(instr, "dma", reads=[(f"srcs[{i}]", s) for i, s in enumerate(srcs)], writes=[("dst", dst)],
                    label=name, reduce_op="add")
