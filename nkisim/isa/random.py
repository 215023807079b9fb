"""Pseudo-random instructions: ``rng``, ``rand2``, ``dropout``, ``set_rng_seed`` (nki-reference.md 2.3).

The hardware PRNG (XORWOW on NeuronCore-v4) is not reproduced bit for bit: nkisim draws from a
NumPy generator per kernel launch and program, seeded with 0 (or the ``set_rng_seed`` /
``nl.random_seed`` value), so runs are deterministic and distributions match, values do not.
``rand_set_state``/``rand_get_state`` are not simulated.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .. import runtime
from ..errors import DtypeError, ShapeError
from ..tensor import NkiTensor
from . import _checks as chk
from .enums import engine as engine_enum

RNG_DTYPES = (dt.int8, dt.int16, dt.int32, dt.uint8, dt.uint16, dt.uint32)


def generator(run) -> np.random.Generator:
    gen = getattr(run, "rng", None)
    if gen is None:
        gen = run.rng = np.random.default_rng([0, run.program_id])
    return gen


def seed(run, value: int) -> None:
    run.rng = np.random.default_rng([int(value) & 0xFFFFFFFF, run.program_id])


def set_rng_seed(src_seeds, name=None):
    instr = "set_rng_seed"
    run = runtime.begin(instr)
    chk.on_chip_operands(instr, [("src_seeds", src_seeds)], compute=False)
    if src_seeds.size != 1 or src_seeds.itemsize != 4:
        raise ShapeError(f"{instr}: src_seeds must be a [1, 1] 32-bit tensor, got {src_seeds.shape} "
                         f"{dt.name(src_seeds.dtype)}")
    seed(run, int(np.asarray(src_seeds.numpy()).view(np.uint32 if src_seeds.itemsize == 4 else None).reshape(-1)[0]))
    return run.emit(instr, "vector", reads=[("src_seeds", src_seeds)], label=name)


def rng(dst, engine=engine_enum.vector, name=None):
    """32 random bits per element, truncated to dst's integer type (least significant bits)."""
    instr = "rng"
    run = runtime.begin(instr)
    chk.on_chip_operands(instr, [("dst", dst)])
    eng = chk.engine_name(engine, instr)
    if eng == "gpsimd":
        chk.target_at_least(instr, "engine=gpsimd", run.target, 3)
        chk.gpsimd_no_psum(instr, [("dst", dst)])
    if dst.dtype not in RNG_DTYPES:
        raise DtypeError(f"{instr}: dst dtype {dt.name(dst.dtype)} must be an integer type "
                         f"(int8/16/32, uint8/16/32)")
    bits = generator(run).integers(0, 2 ** 32, size=dst.shape, dtype=np.uint64).astype(np.uint32)
    dst.assign(bits.astype(dt.storage(dst.dtype), casting="unsafe"))
    return run.emit(instr, eng if eng != "unknown" else "vector", writes=[("dst", dst)], label=name)


def rand2(dst, min, max, name=None):  # noqa: A002 - NKI's parameter names
    """Uniform values in [min, max) (scalars or [P, 1] fp32 tiles), fp32 rounded to dst."""
    instr = "rand2"
    run = runtime.begin(instr)
    chk.on_chip_operands(instr, [("dst", dst)])
    p = dst.shape[0]
    reads = []
    lo = chk.scalar_operand(instr, "min", min, p)
    hi = chk.scalar_operand(instr, "max", max, p)
    reads += [(role, v) for role, v in (("min", min), ("max", max)) if isinstance(v, NkiTensor)]
    u = generator(run).random((p, dst.free_size), dtype=np.float32)
    dst.write((lo + (hi - lo) * u).reshape(dst.shape))
    return run.emit(instr, "vector", reads=reads, writes=[("dst", dst)], label=name)


def dropout(dst, data, prob, name=None):
    """Zero each element with probability ``prob`` (scalar or [P, 1]); kept elements are unscaled."""
    instr = "dropout"
    run = runtime.begin(instr)
    operands = [("dst", dst), ("data", data)]
    chk.elementwise_operands(instr, operands)
    if dst.dtype != data.dtype:
        raise DtypeError(f"{instr}: dst dtype {dt.name(dst.dtype)} must equal data dtype {dt.name(data.dtype)}")
    p = data.shape[0]
    reads = [("data", data)]
    if isinstance(prob, NkiTensor):
        if dt.is_int(data.dtype) and prob.dtype != dt.float32:
            raise DtypeError(f"{instr}: operand 'prob' must be float32 for integer data, got {dt.name(prob.dtype)}")
        chk.on_chip_operands(instr, [("prob", prob)])
        reads.append(("prob", prob))
    drop = chk.scalar_operand(instr, "prob", prob, p, fp32_only=False)
    keep = generator(run).random((p, data.free_size), dtype=np.float32) >= drop
    values = np.array(data.numpy()).reshape(p, -1)
    dst.assign(np.where(keep, values, np.zeros((), values.dtype)).reshape(dst.shape))
    return run.emit(instr, "vector", reads=reads, writes=[("dst", dst)], label=name)
