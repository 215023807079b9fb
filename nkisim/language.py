"""``nki.language`` in nkisim (nki-reference.md sections 1.2, 2.8, 2.9).

Allocation (``ndarray``, ``zeros``...), buffers, dtypes, ``tile_size``, program ids, loop
helpers, and the experimental convenience layer (``load``, ``store``, ``matmul``, ``exp``,
``sum``...). Every convenience function lowers to ``nki.isa`` instructions, so it appears in
the trace as the instructions the compiler would emit (e.g. ``nl.exp(x)`` -> ``activation``).
New allocations hold NaN (floats) or 4 (integers), as in the official simulator.
"""

from __future__ import annotations

import contextlib
import enum

import numpy as np

from . import dtypes as _dt
from . import isa as _isa
from . import runtime as _runtime
from . import target as _target
from .dtypes import (bfloat16, bool_, float4_e2m1fn_x4, float8_e4m3, float8_e4m3fn, float8_e4m3fn_x4,  # noqa: F401
                     float8_e5m2, float8_e5m2_x4, float8_e8m0fnu, float16, float32, int8, int16, int32, tfloat32,
                     uint8, uint16, uint32)
from .errors import KernelError, ShapeError
from .isa.registers import VirtualRegister  # noqa: F401
from .ops import ALL as _OPS
from .tensor import HBM, ON_CHIP, PRIVATE_HBM, PSUM, SBUF, SHARED_HBM, BufferKind, NkiTensor, ds  # noqa: F401

globals().update(_OPS)   # nl.add, nl.exp, ... : operators usable as op= and as functions

sbuf, psum, hbm, shared_hbm, private_hbm = SBUF, PSUM, HBM, SHARED_HBM, PRIVATE_HBM
DType = dtype = np.dtype        # annotation type of NKI dtypes (the stub says ``DType = str``)


class fp32:  # noqa: N801 - the legacy NKI name
    """``nl.fp32.min`` / ``.max`` (legacy constants still used for range_select/affine_select fills)."""
    min = float(np.finfo(np.float32).min)
    max = float(np.finfo(np.float32).max)
FP32_MIN = -3.4028235e38


class _TileSize:
    """Hardware tile limits (nki-reference.md section 2.9); SBUF sizes follow the selected target.
    ``gemm_moving_fmax`` stays 512 (the documented constant) although trn3 accepts larger N."""
    pmax = 128
    psum_bank_fmax = 512
    psum_fmax = 512
    psum_bank_fmax_bytes = 2048
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    psum_min_align = 4
    sbuf_min_align = 4

    @property
    def psum_num_banks(self) -> int:
        return _target.get().psum_banks

    @property
    def sbuf_fmax_bytes(self) -> int:
        return _target.get().sbuf_bytes_per_partition

    @property
    def sbuf_fmax(self) -> int:
        return self.sbuf_fmax_bytes // 4

    @property
    def sbuf_size_bytes(self) -> int:
        return self.sbuf_fmax_bytes * self.pmax

    @property
    def total_available_sbuf_size(self) -> int:
        """Deprecated: usable SBUF bytes *per partition*."""
        return self.sbuf_fmax_bytes


tile_size = _TileSize()


class MemoryRegion(enum.Enum):
    sbuf = SBUF
    psum = PSUM
    hbm = HBM
    private_hbm = PRIVATE_HBM
    shared_hbm = SHARED_HBM


class NKIObject:
    """Base class for kernel dataclasses and configuration objects, with NKI's initializer
    semantics (language guide, "Class Support"): unless a class defines ``__init__`` itself, its
    fields (annotated or plain class attributes, in declaration order) are positional or keyword
    parameters defaulting to the class value (None when there is none), then ``__post_init__``
    runs. ``@dataclass`` is optional and does not replace this initializer (it only adds
    ``__eq__``/``__repr__``), so ``SectionParams(section_idx=0)`` works for a ``@dataclass`` whose
    attributes are not annotated, as in NKI."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" not in cls.__dict__:
            cls.__init__ = NKIObject._nki_init

    @staticmethod
    def _fields(cls) -> list:
        names: list = []
        for klass in reversed(cls.__mro__[:-1]):
            for name in list(getattr(klass, "__annotations__", {})) + list(vars(klass)):
                value = vars(klass).get(name)
                if name.startswith("__") or name in names or callable(value) or \
                        isinstance(value, (staticmethod, classmethod, property)):
                    continue
                names.append(name)
        return names

    def _nki_init(self, *args, **kwargs):
        import dataclasses
        cls = type(self)
        fields = NKIObject._fields(cls)
        if len(args) > len(fields):
            raise TypeError(f"{cls.__name__}() takes {len(fields)} positional arguments, got {len(args)}")
        values = dict(zip(fields, args))
        values.update(kwargs)
        factories = {f.name: f.default_factory for f in getattr(cls, "__dataclass_fields__", {}).values()
                     if f.default_factory is not dataclasses.MISSING}
        for name in fields:
            if name in values:
                setattr(self, name, values.pop(name))
            elif name in factories:
                setattr(self, name, factories[name]())
            elif not hasattr(cls, name):
                setattr(self, name, None)
        for name, value in values.items():
            setattr(self, name, value)
        post_init = getattr(self, "__post_init__", None)
        if post_init is not None:
            post_init()

    __init__ = _nki_init


def is_hbm(buffer):
    return _buffer(buffer) in (HBM, SHARED_HBM, PRIVATE_HBM)


def is_on_chip(buffer):
    return _buffer(buffer) in ON_CHIP


def is_psum(buffer):
    return _buffer(buffer) == PSUM


def is_sbuf(buffer):
    return _buffer(buffer) == SBUF


# ---- allocation ----------------------------------------------------------------------------------

def _buffer(buffer) -> str:
    if isinstance(buffer, MemoryRegion):
        buffer = buffer.value
    if isinstance(buffer, BufferKind) and buffer in (SBUF, PSUM, HBM, SHARED_HBM, PRIVATE_HBM):
        return buffer
    if isinstance(buffer, str) and buffer in (SBUF, PSUM, HBM, SHARED_HBM, PRIVATE_HBM):
        raise KernelError(f"buffer={buffer!r}: string buffer names are not accepted since NKI 0.3.0; use "
                          f"nl.{buffer}")
    raise KernelError(f"unknown buffer {buffer!r}: use nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm or nl.private_hbm")


def ndarray(shape, dtype, buffer=SBUF, name="", address=None):
    """Allocate an uninitialised tensor (NaN / 4 filled)."""
    run = _runtime.begin("ndarray")
    shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    buffer = _buffer(buffer)
    dtype = _dt.normalize(dtype)
    if buffer in ON_CHIP:
        if len(shape) < 2 and shape != (1,):
            # A (1,) on-chip tensor is allowed: the register_load/register_store examples use one.
            raise ShapeError(f"ndarray: on-chip tensors are at least 2-D [partition, free...], got shape {shape}")
        if shape[0] > tile_size.pmax:
            raise ShapeError(f"ndarray: partition dim {shape[0]} exceeds {tile_size.pmax} (nl.tile_size.pmax) "
                             f"for {buffer} tensor {name or ''}".rstrip())
        if address is not None and buffer == PSUM and int(address[1]) % tile_size.psum_bank_fmax_bytes:
            raise ShapeError(f"ndarray: PSUM address {address} must start on a 2 KiB bank boundary")
    return run.allocate(shape, dtype, buffer, name, address=address)


def _filled(shape, dtype, buffer, value, name=""):
    t = ndarray(shape, dtype, buffer=buffer, name=name)
    if _dt.is_int(t.dtype) and float(value).is_integer():
        value = int(value)          # nl.full(..., 1.0, nl.int32): memset itself wants an integer
    if t.on_chip:
        _isa.memset(t, value)
    else:
        t.write(np.array(value))
    return t


def zeros(shape, dtype, buffer=SBUF, name=""):
    return _filled(shape, dtype, buffer, 0, name)


def ones(shape, dtype, buffer=SBUF, name=""):
    return _filled(shape, dtype, buffer, 1, name)


def full(shape, fill_value, dtype, buffer=SBUF, name=""):
    return _filled(shape, dtype, buffer, fill_value, name)


def zeros_like(x, dtype=None, buffer=None, name=""):
    return zeros(x.shape, dtype or x.dtype, buffer=buffer or SBUF, name=name)


def empty_like(x, dtype=None, buffer=None, name=""):
    return ndarray(x.shape, dtype or x.dtype, buffer=buffer or x.buffer, name=name)


# ---- programs and loops -----------------------------------------------------------------------------

def program_id(axis=0):
    if axis != 0:
        raise KernelError(f"program_id({axis}): NKI 0.6 launches have one axis (kernel[lnc])")
    return _runtime.begin("program_id").program_id


def num_programs(axes=0):
    return _runtime.begin("num_programs").num_programs


def program_ndim():
    return 1


def affine_range(start, stop=None, step=1):
    """Deprecated alias of ``range`` (fully unrolled at trace time)."""
    return range(start) if stop is None else range(start, stop, step)


sequential_range = static_range = affine_range


@contextlib.contextmanager
def no_reorder():
    yield


def device_print(print_prefix, tensor):
    """Prints immediately, as the official CPU simulator does."""
    print(print_prefix, np.array(tensor.numpy()))


# ---- runtime loops, registers, convenience layer --------------------------------------------------------

def dynamic_range(start, stop=None, step=1):
    """Deprecated (0.6.0) runtime loop: simulated like ``range``."""
    return range(start, stop, step) if stop is not None else range(start)


from .isa.registers import fori_loop, while_loop  # noqa: E402
from .language_ops import *  # noqa: E402,F401,F403
from .language_ops import apply_op  # noqa: E402,F401
