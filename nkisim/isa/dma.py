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
from ..errors import DtypeError, ShapeError
from ..tensor import HBM_BUFFERS, SBUF
from . import _checks as chk
from .enums import dge_mode as dge_mode_enum

DMA_BUFFERS = (SBUF,) + HBM_BUFFERS


def dma_copy(dst, src, priority=None, oob_mode=None, dge_mode=None, engine=None, name=None):
    instr = "dma_copy"
    run = runtime.begin(instr)
    for role, t in (("dst", dst), ("src", src)):
        chk.tensor(instr, role, t)
        chk.buffer(instr, role, t, DMA_BUFFERS)
        chk.partitions(instr, role, t, compute=False)
    if dst.size != src.size:
        raise ShapeError(f"{instr}: dst has {dst.size} elements {dst.shape}, src has {src.size} {src.shape}; "
                         f"element counts must match")
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
