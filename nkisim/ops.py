"""The ALU operators and activation functions of NKI (nki-reference.md sections 2.2 and 2.6).

In NKI the same names serve as ``op=`` arguments of ISA instructions (``op=nl.add``,
``op=nl.exp``) and as ``nki.language`` functions (``nl.add(x, y)``). Here each name is one
:class:`Op` object: its fp32 NumPy semantics for the engines, and, when called, the
``nki.language`` convenience function (defined in ``nkisim/language.py``).

Arithmetic ops compute in fp32; comparisons return 1.0/0.0; bitvec ops act on integer bit
patterns. Activation functions are evaluated exactly in fp32 (the hardware uses piecewise
polynomial approximations, so real outputs differ in the last bits); ``sin`` has no range
reduction on hardware and is only valid on [-pi, pi].
"""

from __future__ import annotations

import numpy as np


class Op:
    """An NKI operator. ``binary``: fp32 (a, b) -> fp32; ``unary``: fp32 x -> fp32."""

    def __init__(self, name, binary=None, unary=None, identity=None, bitvec=False, activation=False,
                 alu_unary=False, reduce_fn=None):
        self.name = name
        self.binary = binary
        self.unary = unary
        self.identity = identity          # reduction identity; None = not a legal reduce op
        self.bitvec = bitvec
        self.activation = activation      # usable as activation(op=...) on ScalarE
        self.alu_unary = alu_unary        # usable as a unary tensor_scalar op (operand ignored)
        self.reduce_fn = reduce_fn

    def __repr__(self):
        return f"nl.{self.name}"

    def __call__(self, *args, **kwargs):
        from . import language
        return language.apply_op(self, *args, **kwargs)

    def reduce(self, values: np.ndarray, axis):
        if self.identity is None:
            raise ValueError(f"{self.name} is not a reduction operator")
        return self.reduce_fn(values, axis=axis)


def _f32(fn):
    def wrapped(*xs):
        with np.errstate(all="ignore"):
            return np.asarray(fn(*[np.asarray(x, dtype=np.float32) for x in xs]), dtype=np.float32)
    return wrapped


def _bits(fn):
    def wrapped(a, b=None):
        return fn(a, b)
    return wrapped


def _erf(x):
    # Abramowitz & Stegun 7.1.26 refined in float64: |error| < 1.5e-7, below fp32 resolution near 1.
    x = np.asarray(x, dtype=np.float64)
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * np.exp(-a * a)
    return s * y


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def _gelu(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))


def _gelu_tanh(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def _gelu_dx(x):
    x = x.astype(np.float64)
    return 0.5 * (1.0 + _erf(x / np.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi)


def _softplus(x):
    return np.logaddexp(0.0, x.astype(np.float64))


# ---- ALU binary operators ---------------------------------------------------------------------
add = Op("add", _f32(np.add), identity=0.0, reduce_fn=np.sum)
def _subtract_fold(values, axis):
    # A subtract reduction folds left: x0 - x1 - ... - xn (the ALU table marks subtract as a legal
    # reduction without saying more; this is nkisim's reading).
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    moved = np.moveaxis(values, axes, range(values.ndim - len(axes), values.ndim))
    flat = moved.reshape(moved.shape[:values.ndim - len(axes)] + (-1,))
    return flat[..., 0] - np.sum(flat[..., 1:], axis=-1)


subtract = Op("subtract", _f32(np.subtract), identity=0.0, reduce_fn=_subtract_fold)
multiply = Op("multiply", _f32(np.multiply), identity=1.0, reduce_fn=np.prod)
maximum = Op("maximum", _f32(np.maximum), identity=-np.inf, reduce_fn=np.max)
minimum = Op("minimum", _f32(np.minimum), identity=np.inf, reduce_fn=np.min)
equal = Op("equal", _f32(lambda a, b: (a == b)))
not_equal = Op("not_equal", _f32(lambda a, b: (a != b)))
greater_equal = Op("greater_equal", _f32(lambda a, b: (a >= b)))
greater = Op("greater", _f32(lambda a, b: (a > b)))
less_equal = Op("less_equal", _f32(lambda a, b: (a <= b)))
less = Op("less", _f32(lambda a, b: (a < b)))
logical_and = Op("logical_and", _f32(lambda a, b: (a != 0) & (b != 0)), identity=1.0,
                 reduce_fn=lambda v, axis: np.all(v != 0, axis=axis))
logical_or = Op("logical_or", _f32(lambda a, b: (a != 0) | (b != 0)), identity=0.0,
                reduce_fn=lambda v, axis: np.any(v != 0, axis=axis))
logical_xor = Op("logical_xor", _f32(lambda a, b: (a != 0) ^ (b != 0)), identity=0.0,
                 reduce_fn=lambda v, axis: np.logical_xor.reduce(v != 0, axis=axis))
power = Op("power", _f32(np.power))
# nl.abs_max docstring: "each element is x if |x| > |y|, else y" (sign kept); abs_min likewise.
def _pick_abs(select):
    def reduce(values, axis):
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        moved = np.moveaxis(values, axes, range(values.ndim - len(axes), values.ndim))
        flat = moved.reshape(moved.shape[:values.ndim - len(axes)] + (-1,))
        idx = select(np.abs(flat), axis=-1)
        return np.take_along_axis(flat, idx[..., None], axis=-1)[..., 0]
    return reduce


abs_max = Op("abs_max", _f32(lambda a, b: np.where(np.abs(a) > np.abs(b), a, b)), identity=0.0,
             reduce_fn=_pick_abs(np.argmax))
abs_min = Op("abs_min", _f32(lambda a, b: np.where(np.abs(a) < np.abs(b), a, b)), identity=np.inf,
             reduce_fn=_pick_abs(np.argmin))
average = Op("average", _f32(lambda a, b: (a + b) / 2), identity=0.0, reduce_fn=np.mean)   # partition reduce only
bypass = Op("bypass", _f32(lambda a, b: a))      # activate2 pass-through stage

# ---- bitvec operators (integer bit patterns) ------------------------------------------------------
bitwise_and = Op("bitwise_and", _bits(lambda a, b: a & b), identity=-1, bitvec=True,
                 reduce_fn=lambda v, axis: np.bitwise_and.reduce(v, axis=axis))
bitwise_or = Op("bitwise_or", _bits(lambda a, b: a | b), identity=0, bitvec=True,
                reduce_fn=lambda v, axis: np.bitwise_or.reduce(v, axis=axis))
bitwise_xor = Op("bitwise_xor", _bits(lambda a, b: a ^ b), identity=0, bitvec=True,
                 reduce_fn=lambda v, axis: np.bitwise_xor.reduce(v, axis=axis))
left_shift = Op("left_shift", _bits(lambda a, b: a << b), bitvec=True)
right_shift = Op("right_shift", _bits(lambda a, b: (a.view(np.dtype(f"u{a.dtype.itemsize}")) >> b).view(a.dtype)),
                 bitvec=True)
invert = Op("invert", _bits(lambda a, b=None: ~a), bitvec=True)

# ---- unary: ALU (tensor_scalar) and activation functions (ScalarE) -----------------------------
abs = Op("abs", unary=_f32(np.abs), activation=True, alu_unary=True)  # noqa: A001 - NKI's name
rsqrt = Op("rsqrt", unary=_f32(lambda x: 1.0 / np.sqrt(x.astype(np.float64))), activation=True, alu_unary=True)
reciprocal = Op("reciprocal", unary=_f32(lambda x: 1.0 / x.astype(np.float64)), activation=True, alu_unary=True)
square = Op("square", unary=_f32(np.square), activation=True, alu_unary=True)
relu = Op("relu", unary=_f32(lambda x: np.maximum(x, 0)), activation=True, alu_unary=True)
copy = Op("copy", unary=_f32(lambda x: x), activation=True)
exp = Op("exp", unary=_f32(lambda x: np.exp(x.astype(np.float64))), activation=True)
log = Op("log", unary=_f32(lambda x: np.log(x.astype(np.float64))), activation=True)
sqrt = Op("sqrt", unary=_f32(lambda x: np.sqrt(x.astype(np.float64))), activation=True)
tanh = Op("tanh", unary=_f32(lambda x: np.tanh(x.astype(np.float64))), activation=True)
sigmoid = Op("sigmoid", unary=_f32(_sigmoid), activation=True)
silu = Op("silu", unary=_f32(lambda x: x * _sigmoid(x)), activation=True)
silu_dx = Op("silu_dx", unary=_f32(lambda x: _sigmoid(x) * (1 + x * (1 - _sigmoid(x)))), activation=True)
gelu = Op("gelu", unary=_f32(_gelu), activation=True)
gelu_dx = Op("gelu_dx", unary=_f32(_gelu_dx), activation=True)
gelu_apprx_tanh = Op("gelu_apprx_tanh", unary=_f32(_gelu_tanh), activation=True)
gelu_apprx_sigmoid = Op("gelu_apprx_sigmoid", unary=_f32(lambda x: x * _sigmoid(1.702 * x)), activation=True)
gelu_apprx_sigmoid_dx = Op("gelu_apprx_sigmoid_dx", unary=_f32(
    lambda x: _sigmoid(1.702 * x) * (1 + 1.702 * x * (1 - _sigmoid(1.702 * x)))), activation=True)
softplus = Op("softplus", unary=_f32(_softplus), activation=True)
mish = Op("mish", unary=_f32(lambda x: x * np.tanh(_softplus(x))), activation=True)
erf = Op("erf", unary=_f32(_erf), activation=True)
erf_dx = Op("erf_dx", unary=_f32(lambda x: 2.0 / np.sqrt(np.pi) * np.exp(-x.astype(np.float64) ** 2)), activation=True)
sin = Op("sin", unary=_f32(lambda x: np.sin(x.astype(np.float64))), activation=True)
arctan = Op("arctan", unary=_f32(lambda x: np.arctan(x.astype(np.float64))), activation=True)
sign = Op("sign", unary=_f32(np.sign), activation=True)
# prelu needs its slope (relu_param): only activate2 (trn3) applies it; as a plain unary it is relu.
prelu = Op("prelu", unary=_f32(lambda x: np.maximum(x, 0)), activation=False)

ALL = {name: obj for name, obj in globals().items() if isinstance(obj, Op)}
