"""VectorE instructions that reduce or select (nki-reference.md section 2.3).

``tensor_scalar_reduce``, ``exponential`` (trn3), ``range_select`` (trn2+) and ``select_reduce``
share the VectorE accumulator registers (``_accumulators.py``). ``bn_stats``/``bn_aggr`` compute
per-partition mean and (population) variance; ``max8`` the 8 largest values per partition.
All arithmetic is fp32, rounded to the destination dtype.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .. import ops as ops_mod
from .. import runtime
from ..errors import DtypeError, MemoryPlacementError, ShapeError, limit_error
from ..tensor import PSUM, NkiTensor
from . import _accumulators as acc
from . import _checks as chk
from .enums import reduce_cmd as rc

FP32_MIN = float(np.finfo(np.float32).min)   # -3.4028235e38
BN_STATS_FMAX = 512
BN_STATS_WIDTH = 6      # (count, mean, var*count) for even- and odd-indexed elements
MAX8_MIN, MAX8_MAX = 8, 16384
VECTOR_CMDS = (rc.idle, rc.reduce, rc.reset_reduce, rc.load_reduce)
COMPARISONS = ("equal", "less", "less_equal", "greater", "greater_equal")


def _elementwise_operands(instr, dst, src, src_role="data"):
    operands = [("dst", dst), (src_role, src)]
    chk.elementwise_operands(instr, operands)
    for role, t in operands:
        chk.not_packed(instr, role, t)


def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                         reduce_cmd=rc.reset_reduce, reduce_init=None, reduce_res_negate=False, name=None):
    """``dst = data op0 operand0``; the free-dim ``reduce_op`` (add, multiply, maximum, minimum) of the
    fp32 result goes through the VectorE accumulators into ``reduce_res``. ``reverse0`` is marked
    "not supported yet" in the docs; nkisim applies it as in tensor_scalar rather than rejecting."""
    instr = "tensor_scalar_reduce"
    run = runtime.begin(instr)
    _elementwise_operands(instr, dst, data)
    if not isinstance(op0, ops_mod.Op) or op0.bitvec:
        raise ShapeError(f"{instr}: op0 must be an arithmetic operator, got {op0!r}")
    if reduce_op not in (ops_mod.add, ops_mod.multiply, ops_mod.maximum, ops_mod.minimum):
        raise ShapeError(f"{instr}: reduce_op must be nl.add, nl.multiply, nl.maximum or nl.minimum, got {reduce_op!r}")
    cmd = acc.normalize_cmd(instr, reduce_cmd, (rc.reduce, rc.reset_reduce, rc.load_reduce))
    if reduce_init is not None and cmd != rc.load_reduce:
        raise ShapeError(f"{instr}: reduce_init is only used with reduce_cmd=load_reduce (got {cmd.name})")
    p = data.shape[0]
    reads = [("data", data)]
    values = chk.values_2d(data)
    with np.errstate(all="ignore"):
        if op0.binary is None:
            result = op0.unary(values)
        else:
            scalar = chk.scalar_operand(instr, "operand0", operand0, p)
            if isinstance(operand0, NkiTensor):
                reads.append(("operand0", operand0))
            result = op0.binary(scalar, values) if reverse0 else op0.binary(values, scalar)
    chk.write_2d(dst, result)
    writes = [("dst", dst)]
    acc.check_reduce_res(instr, reduce_res, p)
    acc.update(instr, run, "vector", cmd, result, reduce_op, data.start_partition, reduce_res, writes,
               reduce_init=reduce_init, negate_res=reduce_res_negate, reads=reads)
    return run.emit(instr, "vector", reads=reads, writes=writes, label=name, op0=op0.name, reduce_op=reduce_op.name,
                    reduce_cmd=int(cmd))


def exponential(dst, src, max_value=0.0, reduce_res=None, reduce_cmd=rc.idle, reduce_init=0.0, name=None):
    """trn3 only: ``dst = exp(src - max_value)`` on VectorE with an optional running sum."""
    instr = "exponential"
    run = runtime.begin(instr)
    chk.target_at_least(instr, "nisa.exponential", run.target, 4)
    _elementwise_operands(instr, dst, src, "src")
    cmd = acc.normalize_cmd(instr, reduce_cmd, VECTOR_CMDS)
    p = src.shape[0]
    if cmd != rc.load_reduce and not (isinstance(reduce_init, (int, float)) and reduce_init == 0):
        raise ShapeError(f"{instr}: reduce_init must be unset or 0.0 unless reduce_cmd=load_reduce (got {cmd.name})")
    reads = [("src", src)]
    shift = chk.scalar_operand(instr, "max_value", max_value, p)
    if isinstance(max_value, NkiTensor):
        reads.append(("max_value", max_value))
    with np.errstate(all="ignore"):
        result = np.exp((chk.values_2d(src) - shift).astype(np.float64)).astype(np.float32)
    chk.write_2d(dst, result)
    writes = [("dst", dst)]
    acc.check_reduce_res(instr, reduce_res, p)
    acc.update(instr, run, "vector", cmd, result, ops_mod.add, src.start_partition, reduce_res, writes,
               reduce_init=reduce_init if cmd == rc.load_reduce else None, reads=reads)
    return run.emit(instr, "vector", reads=reads, writes=writes, label=name, reduce_cmd=int(cmd))


def _comparison(instr, role, op):
    if not isinstance(op, ops_mod.Op) or op.name not in COMPARISONS:
        raise ShapeError(f"{instr}: {role} must be one of nl.{', nl.'.join(COMPARISONS)}, got {op!r}")
    return op


def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=rc.reset_reduce, reduce_res=None,
                 reduce_op=ops_mod.maximum, range_start=0, on_false_value=FP32_MIN, name=None):
    """trn2+: keep ``on_true_tile[p, j]`` where ``comp_op0(range_start + j, bound0[p])`` and
    ``comp_op1(range_start + j, bound1[p])`` (compared in fp32), else ``on_false_value`` (must be
    FP32_MIN); the row max goes through the VectorE accumulators. ``j`` is the flattened free index."""
    instr = "range_select"
    run = runtime.begin(instr)
    chk.target_at_least(instr, "nisa.range_select", run.target, 3)
    _elementwise_operands(instr, dst, on_true_tile, "on_true_tile")
    op0, op1 = _comparison(instr, "comp_op0", comp_op0), _comparison(instr, "comp_op1", comp_op1)
    if reduce_op is not ops_mod.maximum:
        raise ShapeError(f"{instr}: reduce_op must be nl.maximum, got {reduce_op!r}")
    if not dt.is_float(on_true_tile.dtype):
        raise DtypeError(f"{instr}: operand 'on_true_tile' dtype is {dt.name(on_true_tile.dtype)}; it must be a float type")
    if float(on_false_value) != FP32_MIN:
        raise limit_error(ShapeError, instr, "on_false_value", "value", on_false_value,
                          f"exactly FP32_MIN ({FP32_MIN}) (hardware constraint)")
    p = on_true_tile.shape[0]
    reads = [("on_true_tile", on_true_tile)]
    bounds = []
    for role, b in (("bound0", bound0), ("bound1", bound1)):
        if not isinstance(b, NkiTensor):
            raise ShapeError(f"{instr}: operand '{role}' must be a [{p}, 1] float32 tile")
        chk.on_chip_operands(instr, [(role, b)])
        bounds.append(chk.scalar_operand(instr, role, b, p))
        reads.append((role, b))
    n = on_true_tile.free_size
    index = (np.float32(int(range_start)) + np.arange(n, dtype=np.float32))[None, :]
    keep = (op0.binary(index, bounds[0]) != 0) & (op1.binary(index, bounds[1]) != 0)
    result = np.where(keep, chk.values_2d(on_true_tile), np.float32(FP32_MIN)).astype(np.float32)
    chk.write_2d(dst, result)
    writes = [("dst", dst)]
    cmd = acc.normalize_cmd(instr, reduce_cmd, VECTOR_CMDS)
    acc.check_reduce_res(instr, reduce_res, p)
    acc.update(instr, run, "vector", cmd, result, ops_mod.maximum, on_true_tile.start_partition, reduce_res, writes)
    return run.emit(instr, "vector", reads=reads, writes=writes, label=name, comp_op0=op0.name, comp_op1=op1.name,
                    reduce_cmd=int(cmd))


SELECT_PREDICATE_DTYPES = (dt.int8, dt.uint8, dt.int16, dt.uint16)


def select_reduce(dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=rc.idle, reduce_op=ops_mod.maximum,
                  reverse_pred=False, name=None):
    """``dst = where(predicate, on_true, on_false)`` with an optional row max through the VectorE
    accumulators. predicate int8/uint8/int16/uint16; on_false a float32 scalar or [P, 1] tile."""
    instr = "select_reduce"
    run = runtime.begin(instr)
    operands = [("dst", dst), ("predicate", predicate), ("on_true", on_true)]
    chk.elementwise_operands(instr, operands)
    if on_true.buffer == PSUM and predicate.buffer == PSUM:
        raise MemoryPlacementError(f"{instr}: operands 'on_true' and 'predicate' are both in psum; at most one may be")
    if predicate.dtype not in SELECT_PREDICATE_DTYPES:
        raise DtypeError(f"{instr}: operand 'predicate' dtype is {dt.name(predicate.dtype)}, allowed int8, uint8, "
                         f"int16, uint16")
    if on_true.dtype in (dt.tfloat32, dt.int32, dt.uint32) or dt.is_packed(on_true.dtype):
        raise DtypeError(f"{instr}: operand 'on_true' dtype {dt.name(on_true.dtype)} is not supported "
                         f"(no tfloat32, int32, uint32)")
    if reduce_op is not ops_mod.maximum:
        raise ShapeError(f"{instr}: reduce_op must be nl.maximum, got {reduce_op!r}")
    p = on_true.shape[0]
    reads = [("predicate", predicate), ("on_true", on_true)]
    false_v = chk.scalar_operand(instr, "on_false", on_false, p)
    if isinstance(on_false, NkiTensor):
        reads.append(("on_false", on_false))
    mask = predicate.numpy().reshape(p, -1) != 0
    if reverse_pred:
        mask = ~mask
    result = np.where(mask, chk.values_2d(on_true), false_v).astype(np.float32)
    chk.write_2d(dst, result)
    writes = [("dst", dst)]
    cmd = acc.normalize_cmd(instr, reduce_cmd, VECTOR_CMDS)
    if reduce_res is not None and not dt.is_float(reduce_res.dtype):
        raise DtypeError(f"{instr}: operand 'reduce_res' dtype {dt.name(reduce_res.dtype)} must be a float type")
    acc.check_reduce_res(instr, reduce_res, p)
    acc.update(instr, run, "vector", cmd, result, ops_mod.maximum, on_true.start_partition, reduce_res, writes)
    return run.emit(instr, "vector", reads=reads, writes=writes, label=name, reduce_cmd=int(cmd))


def bn_stats(dst, data, name=None):
    """Per partition: (count, mean, var*count) of the even-indexed and of the odd-indexed elements of
    the flattened free dim (<= 512 elements); an empty half has count 0, mean 0, var*count 0."""
    instr = "bn_stats"
    run = runtime.begin(instr)
    operands = [("dst", dst), ("data", data)]
    chk.on_chip_operands(instr, operands)
    chk.same_partitions(instr, operands)
    chk.not_packed(instr, "data", data)
    if data.free_size > BN_STATS_FMAX:
        raise limit_error(ShapeError, instr, "data", "free size", data.free_size,
                          f"{BN_STATS_FMAX} (nl.tile_size.bn_stats_fmax); split into chunks and combine with bn_aggr")
    if dst.free_size != BN_STATS_WIDTH:
        raise ShapeError(f"{instr}: dst has {dst.free_size} elements per partition, it must have {BN_STATS_WIDTH}")
    values = chk.values_2d(data).astype(np.float64)
    stats = []
    for half in (values[:, 0::2], values[:, 1::2]):
        count = half.shape[1]
        mean = half.mean(axis=1) if count else np.zeros(values.shape[0])
        m2 = ((half - mean[:, None]) ** 2).sum(axis=1) if count else np.zeros(values.shape[0])
        stats += [np.full(values.shape[0], count, np.float64), mean, m2]
    chk.write_2d(dst, np.stack(stats, axis=1).astype(np.float32))
    return run.emit(instr, "vector", reads=[("data", data)], writes=[("dst", dst)], label=name)


def bn_aggr(dst, data, name=None):
    """Combine (count, mean, var*count) triples (one or more bn_stats outputs) into (mean, variance)
    per partition; the variance is the population (biased) one, since bn_stats stores var*count."""
    instr = "bn_aggr"
    run = runtime.begin(instr)
    operands = [("dst", dst), ("data", data)]
    chk.on_chip_operands(instr, operands)
    chk.same_partitions(instr, operands)
    if data.free_size % 3:
        raise ShapeError(f"{instr}: data has {data.free_size} elements per partition; it must be a multiple of 3 "
                         f"(count, mean, var*count) triples from bn_stats")
    if dst.free_size != 2:
        raise ShapeError(f"{instr}: dst has {dst.free_size} elements per partition, it must have 2 (mean, variance)")
    triples = chk.values_2d(data).astype(np.float64).reshape(data.shape[0], -1, 3)
    count, mean, m2 = triples[..., 0], triples[..., 1], triples[..., 2]
    total = count.sum(axis=1)
    with np.errstate(all="ignore"):
        grand = (count * mean).sum(axis=1) / total
        var = (m2.sum(axis=1) + (count * (mean - grand[:, None]) ** 2).sum(axis=1)) / total
    chk.write_2d(dst, np.stack([grand, var], axis=1).astype(np.float32))
    return run.emit(instr, "vector", reads=[("data", data)], writes=[("dst", dst)], label=name)


def max8(dst, src, name=None):
    """The 8 largest values per partition, descending, from 8..16384 elements read as fp32."""
    instr = "max8"
    run = runtime.begin(instr)
    operands = [("dst", dst), ("src", src)]
    chk.on_chip_operands(instr, operands)
    chk.same_partitions(instr, operands)
    chk.not_packed(instr, "src", src)
    n = src.free_size
    if not MAX8_MIN <= n <= MAX8_MAX:
        raise limit_error(ShapeError, instr, "src", "elements per partition", n, f"{MAX8_MIN}..{MAX8_MAX}")
    if dst.free_size != 8:
        raise ShapeError(f"{instr}: dst has {dst.free_size} elements per partition, it must have 8")
    values = chk.values_2d(src)
    chk.write_2d(dst, -np.sort(-values, axis=1)[:, :8])
    return run.emit(instr, "vector", reads=[("src", src)], writes=[("dst", dst)], label=name)


INDEX8_DTYPES = (dt.uint16, dt.uint32)


def _match8(data_rows: np.ndarray, vals: np.ndarray, order) -> np.ndarray:
    """Per partition, the position matched by each of the 8 values (-1 if none): values are taken in
    ``order`` and each takes the first position equal to it that no earlier value took."""
    p, n = data_rows.shape
    positions = np.full((p, 8), -1, dtype=np.int64)
    for row in range(p):
        taken = np.zeros(n, dtype=bool)
        for i in order:
            hits = np.flatnonzero((data_rows[row] == vals[row, i]) & ~taken)
            if hits.size:
                positions[row, i] = hits[0]
                taken[hits[0]] = True
    return positions


def _index_values(positions: np.ndarray, dtype) -> np.ndarray:
    sentinel = np.iinfo(dt.storage(dtype)).max          # all-ones when a value is absent
    return np.where(positions < 0, sentinel, positions).astype(dt.storage(dtype))


def _index8_operands(instr, dst, data, vals):
    operands = [("dst", dst), ("data", data), ("vals", vals)]
    chk.on_chip_operands(instr, operands)
    chk.same_partitions(instr, operands)
    n = data.free_size
    if not MAX8_MIN <= n <= MAX8_MAX:
        raise limit_error(ShapeError, instr, "data", "elements per partition", n, f"{MAX8_MIN}..{MAX8_MAX}")
    if vals.free_size != 8:
        raise ShapeError(f"{instr}: vals has {vals.free_size} elements per partition, it must have 8")


def nc_find_index8(dst, data, vals, name=None):
    """Index of the first occurrence of each of the 8 ``vals`` in each partition of ``data``;
    duplicate vals take successive occurrences in ascending order; absent -> all-ones sentinel."""
    instr = "nc_find_index8"
    run = runtime.begin(instr)
    _index8_operands(instr, dst, data, vals)
    if dst.dtype not in INDEX8_DTYPES or dst.free_size != 8:
        raise DtypeError(f"{instr}: dst must be uint16 or uint32 with 8 elements per partition, got "
                         f"{dt.name(dst.dtype)} {dst.shape}")
    positions = _match8(chk.values_2d(data), chk.values_2d(vals), range(8))
    dst.assign(_index_values(positions, dst.dtype).reshape(dst.shape))
    return run.emit(instr, "vector", reads=[("data", data), ("vals", vals)], writes=[("dst", dst)], label=name)


def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None):
    """``dst`` = ``data`` with the first occurrence of each of the 8 ``vals`` replaced by ``imm``
    (vals processed in reverse order, i = 7..0, so duplicates fill ``dst_idx`` columns descending)."""
    instr = "nc_match_replace8"
    run = runtime.begin(instr)
    _index8_operands(instr, dst, data, vals)
    chk.same_free_size(instr, [("dst", dst), ("data", data)])
    values = chk.values_2d(data)
    positions = _match8(values, chk.values_2d(vals), range(7, -1, -1))
    out = values.copy()
    rows = np.nonzero(positions >= 0)
    out[rows[0], positions[rows]] = np.float32(imm)
    chk.write_2d(dst, out)
    writes = [("dst", dst)]
    if dst_idx is not None:
        chk.on_chip_operands(instr, [("dst_idx", dst_idx)])
        if dst_idx.free_size != 8 or not dt.is_int(dst_idx.dtype):
            raise DtypeError(f"{instr}: dst_idx must be an integer tile with 8 elements per partition")
        dst_idx.assign(_index_values(positions, dst_idx.dtype).reshape(dst_idx.shape))
        writes.append(("dst_idx", dst_idx))
    return run.emit(instr, "vector", reads=[("data", data), ("vals", vals)], writes=writes, label=name)
