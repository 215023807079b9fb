"""The experimental ``nki.language`` compute layer (nki-reference.md section 2.8), lowered to ISA calls.

Every function allocates its result (SBUF unless stated) and issues ``nki.isa`` instructions, so
the trace shows what the compiler would emit: ``nl.exp(x)`` -> ``activation``; ``nl.add(x, y)`` ->
``tensor_tensor``; ``nl.add(x, 2.0)`` -> ``tensor_scalar``; reductions -> ``tensor_reduce``;
``nl.matmul`` -> ``nc_matmul`` into a new fp32 PSUM tile (with an ``nc_transpose`` first when
``transpose_x=False``); ``nl.transpose`` -> TensorE ``nc_transpose`` into PSUM.

Binary ops broadcast only size-1 free dims (stride-0 views; the API examples combine a [P, F]
tile with a [P, 1] tile), never the partition dim; a Python number operand becomes a
``tensor_scalar`` operand. ``cos/tan/ceil/floor/trunc/fmod/mod`` (no documented ISA lowering)
run as one VectorE pseudo-instruction "nl.<name>"; ``rand``/``dropout`` use NumPy's PRNG. Result dtype: ``dtype=`` if given, else the promotion of the input dtypes (the NKI
promotion table: equal -> same; float beats int; fp16+bf16 -> fp32; fp8 e4m3+e5m2 -> bf16; the
wider float otherwise; int8+uint8 -> int16; int32+uint32 -> fp32; otherwise the wider int).
Limits: softmax reduces over all free dims; rms_norm needs ``w`` with the shape of ``x``;
``broadcast_to`` along the partition dim uses the TensorE ones-matmul trick (fp32 PSUM, then cast).
"""

from __future__ import annotations

import builtins

import numpy as np

from . import dtypes as _dt
from . import isa as _isa
from . import ops as _ops
from . import runtime as _runtime
from .errors import KernelError, ShapeError
from .tensor import PSUM, SBUF, SHARED_HBM, NkiTensor

__all__ = ["load", "store", "matmul", "transpose", "sum", "max", "min", "prod", "mean", "var", "all", "softmax",
           "rms_norm", "where", "broadcast_to", "expand_dims", "shared_identity_matrix", "shared_constant",
           "load_transpose2d", "negative", "logical_not", "divide", "cos", "tan", "ceil", "floor", "trunc", "fmod",
           "mod", "rand", "random_seed", "dropout", "gather_flattened"]

from .language_reductions import all, max, mean, min, prod, rms_norm, softmax, sum, var  # noqa: E402,A004

_ONES_MATMUL_FMAX = 512


def _new(shape, dtype, buffer=SBUF, name=""):
    from .language import ndarray
    return ndarray(tuple(shape), dtype, buffer=buffer, name=name)


def _promote(a, b):
    a, b = _dt.normalize(a), _dt.normalize(b)
    if a == b:
        return a
    fa, fb = _dt.is_float(a), _dt.is_float(b)
    if fa != fb:
        return a if fa else b
    if fa:
        pair = {_dt.name(a), _dt.name(b)}
        if pair == {"float16", "bfloat16"}:
            return _dt.float32
        if builtins.all(n.startswith("float8") for n in pair):
            return _dt.bfloat16
        return a if a.itemsize >= b.itemsize else b
    if {a.itemsize, b.itemsize} == {1} or (a.itemsize == b.itemsize and a.itemsize < 4):
        return _dt.normalize(f"int{8 * a.itemsize * 2}")
    if a.itemsize == b.itemsize == 4:
        return _dt.float32
    return a if a.itemsize > b.itemsize else b


# ---- data movement ------------------------------------------------------------------------------

def load(src, dtype=None, name=""):
    """HBM -> new SBUF tile (``dma_copy``, casting through fp32 when ``dtype`` differs)."""
    shape = src.shape if len(src.shape) >= 2 else (1,) + tuple(src.shape)
    out = _new(shape, dtype or src.dtype, name=name)
    _isa.dma_copy(dst=out, src=src)
    return out


def store(dst, value):
    """SBUF -> HBM (``dma_copy``); PSUM values must be copied to SBUF first (DMA cannot read PSUM)."""
    _isa.dma_copy(dst=dst, src=value)


def load_transpose2d(src, dtype=None):
    """HBM ``[A, B]`` -> SBUF ``[B, A]``: one DMA reading the HBM tensor through a permuted view."""
    if len(src.shape) != 2:
        raise ShapeError(f"nl.load_transpose2d: src must be 2-D, got shape {src.shape}")
    out = _new((src.shape[1], src.shape[0]), dtype or src.dtype)
    _isa.dma_copy(dst=out, src=src.permute((1, 0)))
    return out


# ---- TensorE -------------------------------------------------------------------------------------

def transpose(x, dtype=None):
    """TensorE transpose of a 2-D tile into a new PSUM tile (``x`` is copied to SBUF first if needed)."""
    if x.buffer != SBUF:
        staged = _new(x.shape, x.dtype)
        _isa.tensor_copy(dst=staged, src=x)
        x = staged
    out = _new((x.free_size, x.shape[0]), x.dtype, buffer=PSUM)
    _isa.nc_transpose(dst=out, data=x, engine=_isa.engine.tensor)
    if dtype is not None and _dt.normalize(dtype) != x.dtype:
        cast = _new(out.shape, dtype)
        _isa.tensor_copy(dst=cast, src=out)
        return cast
    return out


def matmul(x, y, transpose_x=False):
    """``x @ y`` (``x.T @ y`` with ``transpose_x=True``) into a new fp32 PSUM tile."""
    if not transpose_x:
        xt_psum = transpose(x)
        x = _new(xt_psum.shape, x.dtype)
        _isa.tensor_copy(dst=x, src=xt_psum)
    out = _new((x.free_size, y.free_size), _dt.float32, buffer=PSUM)
    _isa.nc_matmul(dst=out, stationary=x, moving=y)
    return out


# ---- elementwise ---------------------------------------------------------------------------------------

def apply_op(op, x, y=None, dtype=None):
    """``nl.<op>(x[, y], dtype=None)``: activation functions -> ``activation``; ALU ops ->
    ``tensor_tensor`` or ``tensor_scalar`` (a number operand, either side)."""
    unary = op.binary is None
    if unary and y is not None and dtype is None:
        y, dtype = None, y          # nl.exp(x, nl.float32): the second positional is dtype
    if not isinstance(x, NkiTensor) and not isinstance(y, NkiTensor):
        raise KernelError(f"nl.{op.name}: at least one argument must be a tensor, got {type(x).__name__}")
    if unary:
        out = _new(x.shape, dtype or x.dtype)
        if op is _ops.copy:         # nl.copy (0.6.0): VectorE tensor_copy, bit-exact when dtypes match
            _isa.tensor_copy(dst=out, src=x)
        elif op is _ops.rsqrt:      # nl.rsqrt (0.5.0): GpSimd for precision, so no PSUM input
            _isa.tensor_scalar(dst=out, data=x, op0=op, operand0=0, engine=_isa.engine.gpsimd)
        elif op.activation:
            _isa.activation(dst=out, op=op, data=x)
        else:
            _isa.tensor_scalar(dst=out, data=x, op0=op, operand0=0)
        return out
    if y is None:
        raise KernelError(f"nl.{op.name} needs two operands")
    if isinstance(x, NkiTensor) and isinstance(y, NkiTensor):
        if x.shape != y.shape:
            x, y = _broadcast_free(op, x, y)
        out = _new(x.shape, dtype or _promote(x.dtype, y.dtype))
        _isa.tensor_tensor(dst=out, data1=x, data2=y, op=op)
    elif isinstance(x, NkiTensor):
        out = _new(x.shape, dtype or x.dtype)
        _isa.tensor_scalar(dst=out, data=x, op0=op, operand0=float(y))
    else:
        out = _new(y.shape, dtype or y.dtype)
        _isa.tensor_scalar(dst=out, data=y, op0=op, operand0=float(x), reverse0=True)
    return out


def _broadcast_free(op, x, y):
    """Size-1 free dims broadcast (stride-0 views), as the API examples do with a [P, 1] operand;
    partition counts and ranks must match (no cross-partition broadcast)."""
    if x.ndim != y.ndim or x.shape[0] != y.shape[0] or any(
            a != b and 1 not in (a, b) for a, b in zip(x.shape[1:], y.shape[1:])):
        raise ShapeError(f"nl.{op.name}: shapes {x.shape} and {y.shape} do not broadcast; only size-1 free dims "
                         f"broadcast (same rank and partition count; use nl.broadcast_to for the partition dim)")
    for dim in range(1, x.ndim):
        if x.shape[dim] == 1 and y.shape[dim] != 1:
            x = x.broadcast(dim, y.shape[dim])
        elif y.shape[dim] == 1 and x.shape[dim] != 1:
            y = y.broadcast(dim, x.shape[dim])
    return x, y


def negative(x, dtype=None):
    out = _new(x.shape, dtype or x.dtype)
    _isa.tensor_scalar(dst=out, data=x, op0=_ops.multiply, operand0=-1.0)
    return out


def logical_not(x, dtype=None):
    out = _new(x.shape, dtype or x.dtype)
    _isa.tensor_scalar(dst=out, data=x, op0=_ops.equal, operand0=0.0)
    return out


def divide(x, y, dtype=None):
    """``x / y`` as ``x * reciprocal(y)`` (VectorE reciprocal), or ``x * (1/y)`` for a number ``y``."""
    if not isinstance(y, NkiTensor):
        return apply_op(_ops.multiply, x, 1.0 / float(y), dtype)
    inv = _new(y.shape, _dt.float32)
    _isa.reciprocal(dst=inv, data=y)
    if not isinstance(x, NkiTensor):
        return apply_op(_ops.multiply, inv, float(x), dtype or y.dtype)
    return apply_op(_ops.multiply, x, inv, dtype or _promote(x.dtype, y.dtype))


# nl functions with no single documented ISA lowering: evaluated in fp32 as one VectorE
# pseudo-instruction named "nl.<function>" in the trace (fmod/mod are simulator-only in NKI).


def _simulated(fn_name, fn, x, y=None, dtype=None):
    from . import runtime as rt
    from .isa import _checks as chk
    ref = x if isinstance(x, NkiTensor) else y
    run = rt.begin(f"nl.{fn_name}")
    out = _new(ref.shape, dtype or ref.dtype)
    reads = []
    operands = []
    for v in (x, y):
        if isinstance(v, NkiTensor):
            chk.on_chip_operands(f"nl.{fn_name}", [("x", v)])
            operands.append(chk.values_2d(v).reshape(ref.shape))
            reads.append(("x" if v is x else "y", v))
        elif v is not None:
            operands.append(np.float32(v))
    with np.errstate(all="ignore"):
        out.write(np.asarray(fn(*[np.asarray(o, np.float64) for o in operands]), np.float32))
    run.emit(f"nl.{fn_name}", "vector", reads=reads, writes=[("dst", out)])
    return out


def cos(x, dtype=None):
    return _simulated("cos", np.cos, x, dtype=dtype)


def tan(x, dtype=None):
    return _simulated("tan", np.tan, x, dtype=dtype)


def ceil(x, dtype=None):
    return _simulated("ceil", np.ceil, x, dtype=dtype)


def floor(x, dtype=None):
    return _simulated("floor", np.floor, x, dtype=dtype)


def trunc(x, dtype=None):
    return _simulated("trunc", np.trunc, x, dtype=dtype)


def fmod(x, y, dtype=None):
    return _simulated("fmod", np.fmod, x, y, dtype)


def mod(x, y, dtype=None):
    return _simulated("mod", np.mod, x, y, dtype)


def gather_flattened(data, indices, axis=0, dtype=None):
    """``out[p, j] = data[p, indices[p, j]]`` over each partition's flattened free dim (one GpSimd
    pseudo-instruction "nl.gather_flattened"); out-of-range indices are an error."""
    from . import runtime as rt
    from .isa import _checks as chk
    instr = "nl.gather_flattened"
    run = rt.begin(instr)
    chk.on_chip_operands(instr, [("data", data), ("indices", indices)])
    chk.same_partitions(instr, [("data", data), ("indices", indices)])
    if not _dt.is_int(indices.dtype):
        raise ShapeError(f"{instr}: indices dtype {_dt.name(indices.dtype)} must be an integer type")
    p = data.shape[0]
    idx = np.asarray(indices.numpy()).reshape(p, -1).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= data.free_size):
        raise ShapeError(f"{instr}: indices range [{idx.min()}, {idx.max()}] outside the {data.free_size} elements "
                         f"per partition of data")
    out = _new(indices.shape, dtype or data.dtype)
    gathered = np.take_along_axis(np.asarray(data.numpy()).reshape(p, -1), idx, axis=1)
    if out.dtype == data.dtype:
        out.assign(gathered.reshape(out.shape))
    else:
        out.write(_dt.to_fp32(gathered, data.dtype).reshape(out.shape))
    run.emit(instr, "gpsimd", reads=[("data", data), ("indices", indices)], writes=[("dst", out)])
    return out


def random_seed(seed):
    """Seed ``nl.rand``/``nl.dropout`` from a [1, 1] 32-bit tensor (``nisa.set_rng_seed``)."""
    _isa.set_rng_seed(seed)


def rand(shape, dtype, buffer=SBUF, name=""):
    """Uniform [0, 1) values (``nisa.rand2``); NumPy's PRNG, not the hardware's."""
    out = _new(shape, dtype, buffer=buffer, name=name)
    _isa.rand2(dst=out, min=0.0, max=1.0)
    return out


def dropout(x, rate, dtype=None):
    """Zero elements with probability ``rate`` (``nisa.dropout``; kept values are not rescaled)."""
    out = _new(x.shape, x.dtype)
    _isa.dropout(dst=out, data=x, prob=rate)
    if dtype is not None and _dt.normalize(dtype) != x.dtype:
        cast = _new(x.shape, dtype)
        _isa.tensor_copy(dst=cast, src=out)
        return cast
    return out


def where(condition, x, y, dtype=None):
    """``x`` where ``condition != 0`` else ``y`` (tensors or numbers): a uint8 predicate from
    ``tensor_scalar(not_equal 0)``, ``y`` copied (or memset) into the result, then
    ``tensor_copy_predicated`` of ``x``."""
    ref = next(t for t in (x, y, condition) if isinstance(t, NkiTensor))
    out_dtype = dtype or (x.dtype if isinstance(x, NkiTensor) else y.dtype if isinstance(y, NkiTensor)
                          else condition.dtype)
    pred = _new(condition.shape, _dt.uint8)
    _isa.tensor_scalar(dst=pred, data=condition, op0=_ops.not_equal, operand0=0.0)
    out = _new(ref.shape, out_dtype)
    if isinstance(y, NkiTensor):
        _isa.tensor_copy(dst=out, src=y)
    else:
        _isa.memset(dst=out, value=y)
    src = x
    if isinstance(x, NkiTensor) and _dt.normalize(x.dtype) != out.dtype:
        src = _new(x.shape, out.dtype)
        _isa.tensor_copy(dst=src, src=x)
    _isa.tensor_copy_predicated(dst=out, src=src, predicate=pred)
    return out


def expand_dims(x, axis):
    return x.expand_dim(axis)


def broadcast_to(x, shape, dtype=None):
    """Broadcast size-1 dims of an on-chip tile. Free dims: ``tensor_copy`` from a stride-0 view.
    The partition dim (1 -> P): ``nc_matmul`` of a ones ``[1, P]`` stationary with ``x`` as moving,
    in chunks of 512 fp32 columns, evicted to SBUF."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != x.ndim:
        raise ShapeError(f"nl.broadcast_to: target shape {shape} must have the rank of {x.shape}")
    for have, want in zip(x.shape, shape):
        if have != want and have != 1:
            raise ShapeError(f"nl.broadcast_to: cannot broadcast {x.shape} to {shape}")
    out_dtype = dtype or x.dtype
    if tuple(x.shape) == shape and _dt.normalize(out_dtype) == x.dtype:
        return x
    view = x
    for dim in range(1, x.ndim):
        if x.shape[dim] != shape[dim]:
            view = view.broadcast(dim, shape[dim])
    if shape[0] == x.shape[0]:
        out = _new(shape, out_dtype)
        _isa.tensor_copy(dst=out, src=view)
        return out
    # Partition broadcast: stage the (free-broadcast) row contiguously in SBUF, then ones.T @ row.
    row = _new((1,) + shape[1:], x.dtype if x.dtype in _dt.MATMUL_TYPES else _dt.float32)
    _isa.tensor_copy(dst=row, src=view)
    wide = row.dtype in (_dt.float32, _dt.tfloat32)
    ones = _new((1, shape[0]), _dt.float32 if wide else _dt.bfloat16)
    _isa.memset(dst=ones, value=1.0)
    out = _new(shape, out_dtype)
    flat_row, flat_out = row.reshape((1, row.free_size)), out.reshape((shape[0], row.free_size))
    for start in range(0, row.free_size, _ONES_MATMUL_FMAX):
        width = builtins.min(_ONES_MATMUL_FMAX, row.free_size - start)
        acc = _new((shape[0], width), _dt.float32, buffer=PSUM)
        _isa.nc_matmul(dst=acc, stationary=ones, moving=flat_row[:, start:start + width])
        _isa.tensor_copy(dst=flat_out[:, start:start + width], src=acc)
    return out


# ---- constants ---------------------------------------------------------------------------------------------

def shared_identity_matrix(n, dtype=_dt.uint8, dst=None):
    """An ``[n, n]`` identity in SBUF: memset 1, then ``affine_select`` keeping ``p - j == 0``."""
    out = dst if dst is not None else _new((n, n), dtype)
    ones = _new((n, n), out.dtype)
    _isa.memset(dst=ones, value=1)
    _isa.affine_select(dst=out, pattern=[[-1, n]], channel_multiplier=1, on_true_tile=ones, on_false_value=0.0,
                       cmp_op=_ops.equal)
    return out


def shared_constant(constant):
    """A ``shared_hbm`` tensor holding ``constant`` (an array or a ``.npy`` path)."""
    run = _runtime.begin("shared_constant")
    array = np.load(constant) if isinstance(constant, str) else np.asarray(constant)
    dtype = _dt.normalize(array.dtype)
    t = run.allocate(array.shape if array.ndim else (1,), dtype, SHARED_HBM, "constant")
    t.numpy()[...] = array.reshape(t.shape)
    return t
