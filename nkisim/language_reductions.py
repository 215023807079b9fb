"""The reductions and normalisations of the ``nki.language`` layer (nki-reference.md section 2.8).

``sum/max/min/prod/all(x, axis, dtype=None, keepdims=False)`` lower to one ``tensor_reduce`` over
trailing free axes; ``mean`` and ``var`` (population variance, as NumPy's default) reduce in fp32;
``softmax`` (over all free dims) is max -> exp with fused row sum -> reciprocal -> scale;
``rms_norm(x, w, axis, n, epsilon)`` is square-and-sum on ScalarE, then rsqrt and two scalings.
"""

from __future__ import annotations

import math

from . import dtypes as _dt
from . import isa as _isa
from . import ops as _ops
from .errors import KernelError, ShapeError
from .tensor import SBUF


def _new(shape, dtype, buffer=SBUF, name=""):
    from .language import ndarray
    return ndarray(tuple(shape), dtype, buffer=buffer, name=name)


# ---- reductions ------------------------------------------------------------------------------------------

def _axes(x, axis):
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(sorted(a % x.ndim for a in axes))


def _reduce(op_name, x, axis, dtype=None, keepdims=False):
    axes = _axes(x, axis)
    shape = [1 if i in axes else n for i, n in enumerate(x.shape)] if keepdims else \
        [n for i, n in enumerate(x.shape) if i not in axes]
    if len(shape) < 2:
        shape = shape + [1] * (2 - len(shape))
    out = _new(shape, dtype or x.dtype)
    _isa.tensor_reduce(dst=out, op=_ops.ALL[op_name], data=x, axis=axes, keepdims=keepdims)
    return out


def sum(x, axis, dtype=None, keepdims=False):  # noqa: A001 - NKI's name
    return _reduce("add", x, axis, dtype, keepdims)


def max(x, axis, dtype=None, keepdims=False):  # noqa: A001
    return _reduce("maximum", x, axis, dtype, keepdims)


def min(x, axis, dtype=None, keepdims=False):  # noqa: A001
    return _reduce("minimum", x, axis, dtype, keepdims)


def prod(x, axis, dtype=None, keepdims=False):
    return _reduce("multiply", x, axis, dtype, keepdims)


def all(x, axis, dtype=None):  # noqa: A001
    return _reduce("logical_and", x, axis, dtype, False)


def mean(x, axis, dtype=None, keepdims=False):
    """Sum in fp32, then ``tensor_scalar`` multiply by 1/count."""
    total = sum(x, axis, _dt.float32, keepdims)
    count = math.prod(x.shape[a] for a in _axes(x, axis))
    out = _new(total.shape, dtype or x.dtype)
    _isa.tensor_scalar(dst=out, data=total, op0=_ops.multiply, operand0=1.0 / count)
    return out


def var(x, axis, dtype=None, keepdims=False):
    """Population variance (NumPy's default ddof=0); the result keeps the reduced dims (as documented)."""
    axes = _axes(x, axis)
    if len(axes) != x.ndim - 1:
        raise ShapeError("nl.var: nkisim reduces over all free dims of the tile")
    mu = mean(x, axes, _dt.float32, keepdims=True)
    centered = _new(x.shape, _dt.float32)
    _isa.tensor_scalar(dst=centered, data=x, op0=_ops.subtract, operand0=mu.reshape((x.shape[0], 1)))
    squares = _new(x.shape, _dt.float32)
    _isa.tensor_tensor(dst=squares, data1=centered, data2=centered, op=_ops.multiply)
    return mean(squares, axes, dtype or x.dtype, keepdims=True)


def softmax(x, axis=-1, dtype=None):
    """Softmax over all free dims: max (negated), exp with fused bias and row sum, reciprocal, scale."""
    axes = _axes(x, axis)
    if axes != tuple(range(1, x.ndim)):
        raise KernelError(f"nl.softmax: nkisim reduces over all free dims (axis {tuple(range(1, x.ndim))}), got {axes}")
    p = x.shape[0]
    neg_max = _new((p, 1), _dt.float32)
    _isa.tensor_reduce(dst=neg_max, op=_ops.maximum, data=x, axis=axes, negate=True)
    e = _new(x.shape, _dt.float32)
    s = _new((p, 1), _dt.float32)
    _isa.activation(dst=e, op=_ops.exp, data=x, bias=neg_max, reduce_op=_ops.add, reduce_res=s,
                    reduce_cmd=_isa.reduce_cmd.reset_reduce)
    inv = _new((p, 1), _dt.float32)
    _isa.reciprocal(dst=inv, data=s)
    out = _new(x.shape, dtype or x.dtype)
    _isa.tensor_scalar(dst=out, data=e, op0=_ops.multiply, operand0=inv)
    return out


def rms_norm(x, w, axis, n, epsilon=1e-6, dtype=None, compute_dtype=None):
    """``x / sqrt(sum(x^2)/n + epsilon) * w`` per partition row; ``w`` has the shape of ``x``."""
    if w.shape != x.shape:
        raise ShapeError(f"nl.rms_norm: w shape {w.shape} must equal x shape {x.shape} (replicate w across "
                         f"partitions, e.g. with nl.broadcast_to)")
    p = x.shape[0]
    squares = _new(x.shape, _dt.float32)
    ssum = _new((p, 1), _dt.float32)
    _isa.activation(dst=squares, op=_ops.square, data=x, reduce_op=_ops.add, reduce_res=ssum,
                    reduce_cmd=_isa.reduce_cmd.reset_reduce)
    ms = _new((p, 1), _dt.float32)
    _isa.tensor_scalar(dst=ms, data=ssum, op0=_ops.multiply, operand0=1.0 / n, op1=_ops.add, operand1=float(epsilon))
    inv = _new((p, 1), _dt.float32)
    _isa.activation(dst=inv, op=_ops.rsqrt, data=ms)
    normed = _new(x.shape, compute_dtype or _dt.float32)
    _isa.tensor_scalar(dst=normed, data=x, op0=_ops.multiply, operand0=inv)
    out = _new(x.shape, dtype or x.dtype)
    _isa.tensor_tensor(dst=out, data1=normed, data2=w, op=_ops.multiply)
    return out
