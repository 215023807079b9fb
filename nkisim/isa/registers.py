"""Virtual registers and runtime loops (NKI 0.6: ``nisa.register_*``, ``nl.fori_loop``, ``nl.while_loop``).

On hardware a ``VirtualRegister`` holds a 32-bit integer that the sequencers read at run time
(loop bounds, dynamic offsets). nkisim executes eagerly, so a register simply holds a Python int,
and the runtime loops run their body once per iteration. Registers can be used wherever a dynamic
index is accepted (``.ap(scalar_offset=reg)``, ``tensor.select(dim, reg)``). Register operations
run on the sequencers, not on the five engines, so they are not recorded in the trace.
"""

from __future__ import annotations

import numpy as np

from .. import runtime
from ..errors import ShapeError
from ..tensor import NkiTensor

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1


class VirtualRegister:
    """A sequencer register holding one int32."""

    def __init__(self, value: int = 0):
        self.value = int(value)

    def __int__(self):
        return self.value

    def __index__(self):
        return self.value

    def __bool__(self):
        """``while reg:`` is a dynamic while loop on hardware; evaluated eagerly here."""
        return self.value != 0

    def __repr__(self):
        return f"VirtualRegister({self.value})"


def _value(src, what: str) -> int:
    if isinstance(src, VirtualRegister):
        return src.value
    if isinstance(src, NkiTensor):
        if src.size != 1:
            raise ShapeError(f"{what}: tensor {src.name} has shape {src.shape}; a register loads one element")
        return int(np.asarray(src.numpy()).reshape(-1)[0])
    return int(src)


def register_alloc(x=None) -> VirtualRegister:
    runtime.begin("register_alloc")
    return VirtualRegister(0 if x is None else _value(x, "register_alloc"))


def register_move(dst: VirtualRegister, src) -> None:
    runtime.begin("register_move")
    dst.value = _value(src, "register_move")


def register_load(dst: VirtualRegister, src: NkiTensor) -> None:
    run = runtime.begin("register_load")
    dst.value = _value(src, "register_load")
    run.touch_untraced(src)     # sequencer op: not traced, but it keeps src alive


def register_store(dst: NkiTensor, src) -> None:
    run = runtime.begin("register_store")
    if dst.size != 1:
        raise ShapeError(f"register_store: dst {dst.name} has shape {dst.shape}; it must hold one element")
    dst.write(np.array(max(INT32_MIN, min(INT32_MAX, _value(src, "register_store")))))
    run.touch_untraced(dst)


def fori_loop(lower, upper, body_fun, step=1):
    """``for i in range(lower, upper, step): body_fun(i)`` with ``i`` a ``VirtualRegister``."""
    step = int(step)
    if step <= 0:
        raise ShapeError(f"fori_loop: step must be a positive compile-time integer, got {step}")
    for i in range(_value(lower, "fori_loop lower"), _value(upper, "fori_loop upper"), step):
        body_fun(VirtualRegister(i))


def while_loop(init, body_fun):
    """``r = init; while r != 0: r = body_fun(r)``."""
    reg = init if isinstance(init, VirtualRegister) else VirtualRegister(_value(init, "while_loop init"))
    while reg.value != 0:
        reg = body_fun(VirtualRegister(reg.value))
        if not isinstance(reg, VirtualRegister):
            raise ShapeError("while_loop: body_fun must return the next condition VirtualRegister")
