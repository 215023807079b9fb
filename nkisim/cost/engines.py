"""Engine cycles of one compute instruction (TensorE, VectorE, ScalarE, GpSimdE).

Formulas are the published per-instruction costs of nki-reference.md 4.3(a), with ``N`` the
elements per partition of the largest input, plus the architecture-guide rules of 4.3(b):

* trn2/trn3 VectorE perf mode: ``tensor_copy``/``tensor_scalar`` 4x when input and output are both
  SBUF, both 16-bit floats and unit-stride, 2x for 16-bit floats otherwise (strided or one side
  PSUM); ``tensor_tensor`` 2x when both inputs are SBUF and all operands 16-bit floats. trn3 ScalarE
  2x for ``tensor_scalar``/``tensor_copy`` on 16-bit floats; trn3 VectorE ``exponential`` 4x.
* an innermost free stride above 16 bytes halves SBUF bandwidth: the N-dependent part doubles;
* tiny instructions (N < 128) pay the ~100-cycle static overhead (the dependency part of that
  rule is applied by the scheduler, which knows when an instruction waited).

Instructions without a formula (new ISA calls land in nkisim over time) get the documented
default ``max(MIN_II, N)`` on their engine (``GPSIMD_START + N`` on GpSimd) and are reported by
name in the profile, so a missing formula is visible instead of silently wrong or crashing.
"""

from __future__ import annotations

import math

from ..dtypes import itemsize
from . import constants as C

SIXTEEN_BIT_FLOATS = ("bfloat16", "float16")
SBUF, PSUM = "sbuf", "psum"

# Instructions priced by a formula below; anything else falls back to the default and is reported.
KNOWN = {
    "nc_matmul", "nc_transpose", "tensor_tensor", "tensor_scalar", "scalar_tensor_tensor", "tensor_reduce",
    "tensor_scalar_reduce", "tensor_tensor_scan", "tensor_copy", "tensor_copy_predicated", "memset",
    "reciprocal", "bn_stats", "bn_aggr", "range_select", "dropout", "nc_stream_shuffle", "max8",
    "nc_find_index8", "nc_match_replace8", "iota", "affine_select", "activation", "activation_reduce",
    "exponential", "topk", "tensor_scalar_cumulative", "select_reduce", "activate2",
}


def _max_ii(n: float) -> float:
    return max(C.MIN_II, n)


def _ins(instr):
    return [o for o in instr.operands if not o.write]


def _outs(instr):
    return [o for o in instr.operands if o.write]


def _all_16bit(ops) -> bool:
    return bool(ops) and all(o.dtype in SIXTEEN_BIT_FLOATS for o in ops)


def _unit_stride(ops) -> bool:
    return all(o.inner_stride <= 1 for o in ops)


def _strided(instr) -> bool:
    return any(o.inner_stride * itemsize(o.dtype) > C.STRIDED_ACCESS_BYTES for o in instr.operands
               if o.buffer in (SBUF, PSUM))


def _full_tile_inputs(instr):
    """Inputs that are full tiles (not the [P, 1] scalar operands of tensor_scalar/activation)."""
    ins = _ins(instr)
    n = instr_elements(instr)
    return [o for o in ins if o.free_elems == n] or ins


def instr_elements(instr) -> int:
    ins = _ins(instr) or instr.operands
    return max((o.free_elems for o in ins), default=0)


def vector_perf_factor(instr, target) -> float:
    """trn2/trn3 VectorE perf mode for tensor_copy/tensor_scalar (4.3b); 1 elsewhere."""
    if target.nc_version < 3:
        return 1.0
    ins, outs = _full_tile_inputs(instr), _outs(instr)
    ops = ins + outs
    if not _all_16bit(ops):
        return 1.0
    if all(o.buffer == SBUF for o in ops) and _unit_stride(ops):
        return 4.0
    return 2.0


def matmul_cycles(instr, target) -> float:
    """nc_matmul: max(min(64, N_stationary), N_moving), x4 for fp32 (x2 in transpose mode on v3+,
    x2 with a one/zero operand hint)."""
    a = instr.attrs
    m, n = a.get("m", 128), a.get("n", 512)
    cycles = max(min(C.MM_INIT_CYCLES, m), n)
    if a.get("dtype") in ("float32",) or a.get("stationary_dtype") == "float32":
        if a.get("is_transpose") and target.nc_version >= 3:
            cycles *= C.FP32_TRANSPOSE_FACTOR
        elif a.get("onezero"):
            cycles *= C.ONEZERO_FP32_FACTOR
        else:
            cycles *= C.FP32_MATMUL_FACTOR
    return cycles


def compute_cycles(instr, target) -> tuple[float, bool]:
    """(engine cycles, formula known) for a non-DMA instruction on ``target``."""
    name, engine = instr.name, instr.engine
    n = instr_elements(instr)
    a = instr.attrs
    known = name in KNOWN
    if engine == "tensor":
        if name == "nc_matmul":
            return matmul_cycles(instr, target), True
        if name == "nc_transpose":          # TensorE: max(P, min(64, F)) back-to-back
            data = _ins(instr)[0]
            return max(data.partitions, min(C.MM_INIT_CYCLES, data.free_elems)), True
        return _max_ii(n), False

    ins = _full_tile_inputs(instr)
    n_part: float       # the N-dependent part of the cost (affected by strides and perf modes)
    fixed = 0.0         # cycles independent of N (GpSimd start, accumulator reads)
    floor = C.MIN_II
    if name == "tensor_tensor":
        mixed = {o.buffer for o in ins} == {SBUF, PSUM}
        cheap_bf16 = (all(o.buffer == SBUF and o.dtype == "bfloat16" for o in instr.operands)
                      and a.get("op") in ("add", "multiply", "subtract") and _unit_stride(instr.operands))
        n_part = n if (mixed or cheap_bf16) else 2 * n
        if target.nc_version >= 3 and all(o.buffer == SBUF for o in ins) and _all_16bit(instr.operands):
            n_part /= 2
    elif name in ("tensor_scalar", "tensor_copy"):
        n_part = n
        if engine == "vector":
            n_part /= vector_perf_factor(instr, target)
        elif engine == "scalar" and target.nc_version >= 4 and _all_16bit(ins + _outs(instr)):
            n_part /= 2
        elif engine == "gpsimd" and (a.get("op0") == "rsqrt" or a.get("op1") == "rsqrt"):
            n_part *= 4     # GpSimd rsqrt (tensor_scalar) has 4x lower throughput than ScalarE (4.3a note)
    elif name == "scalar_tensor_tensor":
        cheap = (all(o.dtype == "bfloat16" for o in ins) and a.get("op0") == "subtract"
                 and a.get("op1") == "multiply" and n % 2 == 0)
        n_part, floor = (n if cheap else 2 * n), 0
    elif name == "tensor_reduce":
        cheap = (all(o.dtype == "bfloat16" for o in instr.operands) and a.get("op") in ("add", "maximum"))
        n_part, floor = (n / 2 if cheap else n), 0
    elif name in ("tensor_scalar_reduce",):
        n_part, fixed = n, C.MIN_II
    elif name == "tensor_tensor_scan":
        n_part = 2 * n
    elif name == "tensor_copy_predicated":
        n_part = 2 * n if all(o.buffer == SBUF for o in ins) else n
    elif name == "memset":
        zero16 = a.get("value", None) == 0 and _all_16bit(_outs(instr))
        n_part = n / 2 if zero16 else n
    elif name == "reciprocal":
        n_part = 8 * n
    elif name == "bn_aggr":
        n_part = 13 * (n / 3)
    elif name in ("max8", "nc_find_index8"):
        n_part, floor = n, 0
    elif name == "nc_match_replace8":
        n_part = n      # 4.3a prints min(MIN_II, N) "(sic)"; read as max like its siblings
    elif name in ("iota", "affine_select"):
        n_part, fixed, floor = n, C.GPSIMD_START, 0
    elif name in ("activation", "activation_reduce", "activate2"):   # activate2 (v4): activation's cost
        n_part = n
        if name == "activation_reduce" or a.get("reduce") or a.get("reduce_cmd", 0) not in (0, None):
            fixed = C.MIN_II    # activation_reduce = max(MIN_II, N) + MIN_II (includes the accumulator read)
    elif name == "exponential":
        n_part = n / 4 if target.nc_version >= 4 else n
    elif name == "topk":
        n_part, floor = 4 * n + a.get("k", 8), 0
    elif engine == "gpsimd":
        n_part, fixed, floor = n, C.GPSIMD_START, 0
    else:  # nc_transpose on VectorE, bn_stats, range_select, dropout, ... and unknown instructions
        n_part = n
    if _strided(instr):
        n_part *= C.STRIDED_ACCESS_FACTOR
    cycles = max(floor, n_part) + fixed
    if n < C.TINY_N:
        cycles += C.STATIC_OVERHEAD_CYCLES
    return cycles, known


def matmul_flops(instr) -> int:
    """Useful TensorE FLOPs: 2*K*M*N for nc_matmul, 0 for transposes (data movement, not math)."""
    if instr.name != "nc_matmul" or instr.attrs.get("is_transpose"):
        return 0
    a = instr.attrs
    return 2 * a.get("k", 0) * a.get("m", 0) * a.get("n", 0)


def pe_blocks(instr) -> frozenset:
    """The 32x32 blocks of the 128x128 PE array a TensorE instruction occupies. With
    ``tile_position``/``tile_size`` (2.1 PE tiling) only its tile; otherwise the whole array."""
    size, pos = instr.attrs.get("tile_size") or (), instr.attrs.get("tile_position") or ()
    grid = 128 // C.PE_BLOCK
    if not size or not pos:
        return frozenset((r, c) for r in range(grid) for c in range(grid))
    rows, cols = size
    r0, c0 = pos
    return frozenset((r, c) for r in range(r0 // C.PE_BLOCK, math.ceil((r0 + rows) / C.PE_BLOCK))
                     for c in range(c0 // C.PE_BLOCK, math.ceil((c0 + cols) / C.PE_BLOCK)))
