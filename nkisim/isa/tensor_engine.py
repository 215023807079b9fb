"""TensorE instructions: ``nc_matmul`` and the TensorE/VectorE ``nc_transpose`` (nki-reference.md 2.1).

``nc_matmul(dst, stationary, moving)`` computes ``dst[M, N] = stationary[K, M].T @ moving[K, N]``
in fp32 (products of 16-bit inputs are exact in fp32; the sum is fp32). Limits: K <= 128 and
equal for both operands, M <= 128, N <= 512 on trn1/trn2 (one PSUM bank of fp32), N <= 4096
(fp32 dst) / 8192 (bf16 dst) on trn3; operands in SBUF, dst in PSUM and inside one 2 KiB bank
per partition on trn1/trn2.

Accumulation state is kept per PSUM element: ``mm_written`` (the value is a matmul result) and
``group_open`` (an accumulation group is open: a matmul wrote it and no other engine touched it
since). ``accumulate=False`` overwrites and opens a group; ``True`` adds onto a matmul result
(anything else is undefined behaviour on hardware and an error here); ``None`` (the compiler's
inference) accumulates where a group is open and overwrites elsewhere, so the usual
``for k: nc_matmul(psum, ...)`` then ``tensor_copy(sbuf, psum)`` loop works, also when the PSUM
tile is reused for the next output tile.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .. import runtime
from ..errors import DtypeError, ShapeError, TargetError, limit_error
from ..tensor import PSUM, SBUF
from . import _checks as chk
from .enums import engine as engine_enum
from .enums import matmul_perf_mode


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              accumulate=None, tile_position=(), tile_size=(), perf_mode=matmul_perf_mode.none, name=None):
    instr = "nc_matmul"
    run = runtime.begin(instr)
    target = run.target
    chk.on_chip_operands(instr, [("stationary", stationary), ("moving", moving)], allowed=(SBUF,))
    chk.on_chip_operands(instr, [("dst", dst)], allowed=(PSUM,))
    chk.enum_arg(instr, "perf_mode", perf_mode, matmul_perf_mode)
    double_row = perf_mode == matmul_perf_mode.double_row

    k, m = stationary.shape[0], stationary.free_size
    k2, n = moving.shape[0], moving.free_size
    if double_row:
        chk.target_at_least(instr, "perf_mode=double_row", target, 3)
        if stationary.dtype not in dt.FP8_TYPES or moving.dtype not in dt.FP8_TYPES:
            raise DtypeError(f"{instr}: perf_mode=double_row needs fp8 operands, got {dt.name(stationary.dtype)} and "
                             f"{dt.name(moving.dtype)}")
        if len(stationary.shape) != 3 or stationary.shape[1] != 2 or len(moving.shape) != 3 or moving.shape[1] != 2:
            raise ShapeError(f"{instr}: perf_mode=double_row needs operands shaped [K, 2, M] and [K, 2, N], got "
                             f"{stationary.shape} and {moving.shape}")
        if is_transpose or tile_size:
            raise ShapeError(f"{instr}: perf_mode=double_row cannot be combined with is_transpose or tile_size")
        m, n = stationary.shape[2], moving.shape[2]
    if k != k2:
        raise ShapeError(f"{instr}: contraction (partition) dims differ: stationary K={k}, moving K={k2}; they must match")
    if m > target.gemm_stationary_fmax:
        raise limit_error(ShapeError, instr, "stationary", "free size (M)", m, "128 (tile_size.gemm_stationary_fmax)")
    n_limit = target.gemm_moving_fmax(dst.itemsize)
    if n > n_limit:
        raise limit_error(ShapeError, instr, "moving", "free size (N)", n,
                          f"{n_limit} (tile_size.gemm_moving_fmax on {target.name})")
    if dst.shape[0] != m or dst.free_size != n:
        raise ShapeError(f"{instr}: dst shape {dst.shape} does not hold the [{m}, {n}] result "
                         f"(stationary {stationary.shape}, moving {moving.shape})")
    if not double_row:
        # The compiler keeps the stationary free dim and the moving free dims: stationary is
        # [K, M]; dst is [M, N] or [M, *moving free dims].
        if len(stationary.shape) != 2:
            raise ShapeError(f"{instr}: operand 'stationary' must be rank-2 [K, M], got shape {stationary.shape}")
        if tuple(dst.shape[1:]) not in ((n,), tuple(moving.shape[1:])):
            raise ShapeError(f"{instr}: dst shape {dst.shape} must preserve stationary free dim and moving free dims: "
                             f"({m}, {n}) or ({m}, {', '.join(map(str, moving.shape[1:]))})")
    _check_dtypes(instr, stationary, moving, dst, target, is_transpose)
    _check_tiling(instr, tile_position, tile_size, k, m, target)
    if target.nc_version < 4:
        _, _, _, lo, hi = dst.region()
        bank = target.psum_bank_bytes
        if hi > lo and lo // bank != (hi - 1) // bank:
            raise limit_error(ShapeError, instr, "dst", "PSUM byte range per partition", f"[{lo}, {hi})",
                              f"one {bank}-byte bank (an accumulation group cannot cross banks)")

    if is_transpose:
        chk.target_at_least(instr, "is_transpose=True", target, 3)
        if moving.shape[0] != n or not np.array_equal(chk.values_2d(moving), np.eye(n, dtype=np.float32)):
            raise ShapeError(f"{instr}: is_transpose=True needs moving to be the [{k}, {k}] identity matrix")
        # Bit-exact: the stationary bits land transposed in PSUM (NaN/Inf preserved).
        dst.numpy()[...] = stationary.numpy().reshape(k, m).T.reshape(dst.shape)
        dst.state_view(dst.storage.mm_written)[...] = True
        dst.state_view(dst.storage.group_open)[...] = False
        return run.emit(instr, "tensor", reads=[("stationary", stationary), ("moving", moving)],
                        writes=[("dst", dst)], label=name, is_transpose=True, accumulate=False,
                        k=k, m=m, n=n, dtype=dt.name(stationary.dtype))

    if double_row:
        s = stationary.read_fp32().reshape(k * 2, m)
        mv = moving.read_fp32().reshape(k * 2, n)
    else:
        s = stationary.read_fp32().reshape(k, m)
        mv = moving.read_fp32().reshape(k, n)
    product = (s.T @ mv).astype(np.float32)

    if isinstance(accumulate, (bool, np.bool_)):
        accumulate = bool(accumulate)
    written = dst.state_view(dst.storage.mm_written)
    group = dst.state_view(dst.storage.group_open)
    current = dst.read_fp32().reshape(m, n)
    if accumulate is True:
        # v2/v3: only a matmul result may be accumulated onto; v4 also accepts PSUM initialised by
        # another engine (e.g. memset). Uninitialised PSUM is undefined behaviour everywhere.
        ok = written if target.nc_version < 4 else dst.state_view(dst.storage.initialized)
        if not ok.all():
            what = "no matmul wrote" if target.nc_version < 4 else "were never written"
            raise ShapeError(f"{instr}: accumulate=True onto PSUM tensor {dst.name} elements that {what} "
                             f"(undefined behaviour on {target.name}); start the group with accumulate=False")
        result = current + product
    elif accumulate is False:
        result = product
    elif accumulate is None:
        result = np.where(group.reshape(m, n), current + product, product)
    else:
        raise ShapeError(f"{instr}: accumulate must be None, True or False, got {accumulate!r}")
    chk.write_2d(dst, result)
    written[...] = True
    group[...] = True
    return run.emit(instr, "tensor", reads=[("stationary", stationary), ("moving", moving)], writes=[("dst", dst)],
                    label=name, accumulate=accumulate, is_transpose=False, k=k * (2 if double_row else 1), m=m, n=n,
                    dtype=dt.name(moving.dtype), stationary_dtype=dt.name(stationary.dtype), double_row=double_row,
                    onezero=bool(is_stationary_onezero or is_moving_onezero),
                    tile_position=tuple(tile_position or ()), tile_size=tuple(tile_size or ()))


def _check_dtypes(instr, stationary, moving, dst, target, is_transpose):
    for role, t in (("stationary", stationary), ("moving", moving)):
        if t.dtype not in dt.MATMUL_TYPES and not (t.dtype is dt.float8_e4m3fn):
            raise DtypeError(f"{instr}: operand '{role}' dtype {dt.name(t.dtype)} is not a matmul type "
                             f"(float8_e4m3, float8_e5m2, bfloat16, float16, tfloat32, float32)")
        if t.dtype is dt.float8_e4m3fn:
            chk.target_at_least(instr, f"operand '{role}' dtype float8_e4m3fn", target, 4)
    wide = {dt.float32, dt.tfloat32}
    if (stationary.dtype in wide) != (moving.dtype in wide):
        raise DtypeError(f"{instr}: stationary is {dt.name(stationary.dtype)} and moving is {dt.name(moving.dtype)}; "
                         f"if one operand is fp32/tf32 the other must be too")
    if {stationary.dtype, moving.dtype} == {dt.float8_e4m3, dt.float8_e4m3fn}:
        raise DtypeError(f"{instr}: legacy float8_e4m3 and float8_e4m3fn operands cannot be mixed")
    if is_transpose:
        if dst.dtype != stationary.dtype and not (stationary.dtype in dt.FP8_TYPES and dst.itemsize == 2):
            raise DtypeError(f"{instr}: is_transpose=True writes the input dtype; dst is {dt.name(dst.dtype)}, "
                             f"stationary is {dt.name(stationary.dtype)}")
        return
    allowed = (dt.float32,) if target.nc_version < 4 else (dt.float32, dt.bfloat16)
    if dst.dtype not in allowed:
        raise DtypeError(f"{instr}: operand 'dst' dtype is {dt.name(dst.dtype)}, allowed "
                         f"{', '.join(dt.name(a) for a in allowed)} on {target.name} (PSUM accumulates in fp32)")


def _check_tiling(instr, tile_position, tile_size, k, m, target):
    if not tile_position and not tile_size:
        return
    if not tile_position or not tile_size:
        raise ShapeError(f"{instr}: tile_position and tile_size must be given together")
    rows, cols = tile_size
    for v in (rows, cols):
        if v not in (32, 64, 128):
            raise limit_error(ShapeError, instr, "tile_size", "value", v, "one of 32, 64, 128")
    if min(rows, cols) == 32:
        chk.target_at_least(instr, "32-wide PE tiles", target, 3)
    r0, c0 = tile_position
    if r0 % rows or c0 % cols or r0 + rows > 128 or c0 + cols > 128:
        raise ShapeError(f"{instr}: tile_position {tile_position} must be multiples of tile_size {tile_size} "
                         f"inside the 128x128 array")
    if k > rows:
        raise limit_error(ShapeError, instr, "stationary", "contraction (K) for the PE tile", k, rows)
    if m > cols:
        raise limit_error(ShapeError, instr, "stationary", "free size (M) for the PE tile", m, cols)


def nc_transpose(dst, data, engine=engine_enum.unknown, name=None):
    """Swap the partition dim with the (flattened) free dim. TensorE: <= [128, 128], SBUF -> PSUM;
    VectorE: <= [32, 32], SBUF/PSUM -> SBUF/PSUM. dst dtype equals data dtype."""
    instr = "nc_transpose"
    run = runtime.begin(instr)
    chk.on_chip_operands(instr, [("dst", dst), ("data", data)])
    eng = chk.engine_name(engine, instr)
    if eng == "unknown":
        eng = "tensor" if (data.buffer == SBUF and dst.buffer == PSUM) else "vector"
    p, f = data.shape[0], data.free_size
    if eng == "tensor":
        chk.buffer(instr, "data", data, (SBUF,))
        chk.buffer(instr, "dst", dst, (PSUM,))
        if f > 128:
            raise limit_error(ShapeError, instr, "data", "free size (TensorE transpose)", f, 128)
        if tuple(dst.shape) != (f, p):
            raise ShapeError(f"{instr}: TensorE transpose writes dst shape ({f}, {p}) exactly, got {dst.shape} "
                             f"(VectorE transposes may reshape dst)")
    elif eng == "vector":
        if p > 32 or f > 32:
            raise limit_error(ShapeError, instr, "data", "shape (VectorE transpose)", f"[{p}, {f}]", "[32, 32]")
    else:
        raise TargetError(f"{instr}: engine must be tensor or vector, got {eng}")
    if dst.dtype != data.dtype:
        raise DtypeError(f"{instr}: dst dtype {dt.name(dst.dtype)} must equal data dtype {dt.name(data.dtype)}")
    if dst.shape[0] != f or dst.free_size != p:
        raise ShapeError(f"{instr}: dst shape {dst.shape} must be [{f}, {p}] for data {data.shape}")
    dst.numpy()[...] = data.numpy().reshape(p, f).T.reshape(dst.shape)
    if dst.buffer == PSUM and eng == "tensor":
        dst.state_view(dst.storage.mm_written)[...] = True
        dst.state_view(dst.storage.group_open)[...] = False
    return run.emit(instr, eng, reads=[("data", data)], writes=[("dst", dst)], label=name,
                    by_tensor_engine=(eng == "tensor"))
