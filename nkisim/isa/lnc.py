"""Communication between the two NeuronCores of an LNC=2 launch: ``core_barrier`` and ``sendrecv``
(nki-reference.md section 1.3). Both need trn2+ and a ``kernel[2]`` launch, whose programs run in
two threads (``runtime.LncGroup``).

* ``core_barrier(data, cores=(0, 1))``: both programs wait until both arrived; ``data`` is the
  shared_hbm tensor they synchronise on.
* ``sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id)``: send ``src`` (SBUF) to
  ``send_to_rank`` and receive into ``dst`` (SBUF) what ``recv_from_rank`` sent with the same
  ``pipe_id``. ``dma_engine.gpsimd_dma`` limits the bytes per partition (1024/512/256 B for
  32/16/8-bit types).
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .. import runtime
from ..errors import DtypeError, KernelError, ShapeError, limit_error
from ..tensor import SBUF, SHARED_HBM
from . import _checks as chk
from .enums import dma_engine as dma_engine_enum
from .enums import engine as engine_enum

GPSIMD_DMA_BYTES = {4: 1024, 2: 512, 1: 256}


def _lnc2(instr, run):
    chk.target_at_least(instr, f"nisa.{instr}", run.target, 3)
    if run.num_programs != 2:
        raise KernelError(f"{instr}: needs an LNC=2 launch (kernel[2]); this launch has {run.num_programs} program")


def core_barrier(data, cores, engine=engine_enum.gpsimd, name=None):
    instr = "core_barrier"
    run = runtime.begin(instr)
    _lnc2(instr, run)
    if tuple(cores) != (0, 1):
        raise ShapeError(f"{instr}: cores must be (0, 1), got {tuple(cores)}")
    chk.tensor(instr, "data", data)
    if data.buffer != SHARED_HBM:
        raise ShapeError(f"{instr}: operand 'data' is in {data.buffer}; it must be the shared_hbm tensor both cores use")
    run.group.barrier(run.program_id)
    return run.emit(instr, chk.engine_name(engine, instr) if engine is not None else "gpsimd", reads=[("data", data)],
                    label=name)


def sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id, dma_engine=dma_engine_enum.dma, name=None):
    instr = "sendrecv"
    run = runtime.begin(instr)
    _lnc2(instr, run)
    operands = [("src", src), ("dst", dst)]
    chk.on_chip_operands(instr, operands, allowed=(SBUF,), compute=False)
    if src.dtype != dst.dtype or tuple(src.shape) != tuple(dst.shape):
        raise DtypeError(f"{instr}: src {src.shape} {dt.name(src.dtype)} and dst {dst.shape} {dt.name(dst.dtype)} "
                         f"must have the same shape and dtype")
    for role, rank in (("send_to_rank", send_to_rank), ("recv_from_rank", recv_from_rank)):
        if int(rank) not in (0, 1):
            raise limit_error(ShapeError, instr, role, "rank", rank, "0 or 1")
    if dma_engine == dma_engine_enum.gpsimd_dma:
        limit = GPSIMD_DMA_BYTES[src.itemsize]
        if src.free_size * src.itemsize > limit:
            raise limit_error(ShapeError, instr, "src", "bytes per partition (gpsimd_dma)",
                              src.free_size * src.itemsize, limit)
    payload = np.array(src.numpy())
    received = run.group.exchange(run.program_id, pipe_id, int(send_to_rank), int(recv_from_rank), payload)
    dst.assign(received.reshape(dst.shape))
    return run.emit(instr, "dma", reads=[("src", src)], writes=[("dst", dst)], label=name, pipe_id=pipe_id)
