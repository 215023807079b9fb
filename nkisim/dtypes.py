"""NKI data types, stored as NumPy / ml_dtypes arrays, and the casts the engines perform.

NKI dtypes are NumPy dtypes where one exists (``nl.bfloat16 == np.dtype(ml_dtypes.bfloat16)``),
so kernels can pass ``tensor.dtype`` around and tests can build inputs with NumPy. ``tfloat32``
and the packed x4 MX types have no NumPy equivalent and are :class:`SpecialDtype` objects.

Casting rule (nki-reference.md sections 2 and 2.7): engines compute in fp32 and round to the
destination dtype with round-to-nearest-even; fp32 -> integer rounds to nearest even and saturates
(NaN becomes 0). There are no 64-bit types: float64/int64 inputs are rejected.
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np

from .errors import DtypeError


class SpecialDtype:
    """A dtype NumPy lacks: stored in ``storage`` with ``itemsize`` bytes per element."""

    def __init__(self, name: str, storage, itemsize: int):
        self.name = name
        self.storage = np.dtype(storage)
        self.itemsize = itemsize

    def __repr__(self):
        return f"nl.{self.name}"


uint8 = np.dtype(np.uint8)
int8 = np.dtype(np.int8)
uint16 = np.dtype(np.uint16)
int16 = np.dtype(np.int16)
uint32 = np.dtype(np.uint32)
int32 = np.dtype(np.int32)
float8_e4m3 = np.dtype(ml_dtypes.float8_e4m3)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e8m0fnu = np.dtype(ml_dtypes.float8_e8m0fnu)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float32 = np.dtype(np.float32)
tfloat32 = SpecialDtype("tfloat32", np.float32, 4)
float8_e5m2_x4 = SpecialDtype("float8_e5m2_x4", np.uint32, 4)
float8_e4m3fn_x4 = SpecialDtype("float8_e4m3fn_x4", np.uint32, 4)
float4_e2m1fn_x4 = SpecialDtype("float4_e2m1fn_x4", np.uint16, 2)
bool_ = uint8  # NKI stores bool_ as uint8

ALL = {
    d.name if isinstance(d, SpecialDtype) else str(d): d
    for d in (uint8, int8, uint16, int16, uint32, int32, float8_e4m3, float8_e5m2, float8_e4m3fn,
              float8_e8m0fnu, float16, bfloat16, float32, tfloat32, float8_e5m2_x4,
              float8_e4m3fn_x4, float4_e2m1fn_x4)
}
FLOAT_TYPES = (float8_e4m3, float8_e5m2, float8_e4m3fn, float8_e8m0fnu, float16, bfloat16, float32)
FP8_TYPES = (float8_e4m3, float8_e5m2, float8_e4m3fn)
MATMUL_TYPES = FP8_TYPES + (bfloat16, float16, float32, tfloat32)


def normalize(dtype):
    """Return the NKI dtype for a NumPy/ml_dtypes dtype, a dtype name, or an NKI dtype."""
    if isinstance(dtype, SpecialDtype):
        return dtype
    if isinstance(dtype, str) and dtype in ALL:
        return ALL[dtype]
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        raise DtypeError(f"unsupported dtype {dtype!r}: NKI dtypes are {', '.join(ALL)}") from None
    if np_dtype == np.bool_:
        return bool_
    key = str(np_dtype)
    if key not in ALL:
        raise DtypeError(f"unsupported dtype {key}: NKI has no 64-bit types; NKI dtypes are {', '.join(ALL)}")
    return ALL[key]


def name(dtype) -> str:
    dtype = normalize(dtype)
    return dtype.name if isinstance(dtype, SpecialDtype) else str(dtype)


PRECISE_ENV = "NKI_PRECISE_FP"


def precise() -> bool:
    """``NKI_PRECISE_FP`` (default 1, as in the official simulator): low-precision tensors are
    stored in their own ml_dtypes type. ``NKI_PRECISE_FP=0`` stores bf16/fp8 as fp32 without
    rounding, to separate algorithmic errors from precision loss; outputs are rounded once when
    they are handed back."""
    return os.environ.get(PRECISE_ENV, "1") != "0"


def low_precision(dtype) -> bool:
    """The dtypes ``NKI_PRECISE_FP=0`` widens: bf16 and the fp8 formats (the ml_dtypes types)."""
    dtype = normalize(dtype)
    return not isinstance(dtype, SpecialDtype) and (dtype == bfloat16 or dtype in FP8_TYPES)


def logical(dtype) -> np.dtype:
    """NumPy dtype of the NKI dtype itself (what kernel outputs are returned as)."""
    dtype = normalize(dtype)
    return dtype.storage if isinstance(dtype, SpecialDtype) else dtype


def storage(dtype) -> np.dtype:
    """NumPy dtype a tensor of ``dtype`` is stored in (fp32 for bf16/fp8 when NKI_PRECISE_FP=0)."""
    dtype = normalize(dtype)
    if not precise() and low_precision(dtype):
        return float32
    return dtype.storage if isinstance(dtype, SpecialDtype) else dtype


def itemsize(dtype) -> int:
    return normalize(dtype).itemsize


def is_float(dtype) -> bool:
    dtype = normalize(dtype)
    return dtype is tfloat32 or (not isinstance(dtype, SpecialDtype) and dtype in FLOAT_TYPES)


def is_int(dtype) -> bool:
    dtype = normalize(dtype)
    return not isinstance(dtype, SpecialDtype) and np.issubdtype(dtype, np.integer)


def is_packed(dtype) -> bool:
    dtype = normalize(dtype)
    return isinstance(dtype, SpecialDtype) and dtype is not tfloat32


def to_fp32(values: np.ndarray, dtype) -> np.ndarray:
    """Upcast stored values to fp32, the way every engine reads its inputs."""
    if is_packed(dtype):
        raise DtypeError(f"{name(dtype)} is a packed MX type: only nc_matmul_mx and copies read it")
    return np.asarray(values).astype(np.float32, copy=False)


def _round_tf32(values: np.ndarray) -> np.ndarray:
    """Round fp32 to tf32 (10 mantissa bits) with round-to-nearest-even, kept in fp32 storage."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    finite = np.isfinite(values)
    lsb = (bits >> 13) & 1
    rounded = ((bits + 0x0FFF + lsb) & 0xFFFFE000).astype(np.uint32)
    return np.where(finite, rounded.view(np.float32), values).astype(np.float32)


def cast(values: np.ndarray, dtype) -> np.ndarray:
    """Round fp32 (or any numeric) values to ``dtype``'s storage: RNE for floats, RNE+saturate for ints."""
    dtype = normalize(dtype)
    values = np.asarray(values)
    if not precise() and low_precision(dtype):
        return values.astype(np.float32)
    if dtype is tfloat32:
        return _round_tf32(values.astype(np.float32))
    if is_packed(dtype):
        return values.astype(dtype.storage)
    if np.issubdtype(dtype, np.integer):
        if np.issubdtype(values.dtype, np.integer):
            info = np.iinfo(dtype)
            return np.clip(values, info.min, info.max).astype(dtype)
        v = np.nan_to_num(np.rint(values.astype(np.float64)), nan=0.0)
        info = np.iinfo(dtype)
        return np.clip(v, info.min, info.max).astype(dtype)
    if values.dtype == dtype:
        return values
    if values.dtype != np.float32 and dtype != np.float32 and not np.issubdtype(values.dtype, np.integer):
        # Double rounding through fp32 is what the engines do (fp32 ALU, then output cast).
        values = values.astype(np.float32)
    return values.astype(dtype)


def fill_value(dtype):
    """What a new allocation holds, as in the official simulator: NaN for floats, 4 for integers."""
    return np.nan if is_float(dtype) else 4
