"""``nki.jit``, ``nki.simulate`` and ``kernel[lnc]`` launches (nki-reference.md sections 1.2, 1.3, 4.1).

A launch wraps each array argument as an HBM tensor (``shared_hbm``, as the official simulator
does for LNC launches), runs the kernel function once per logical-core program with
``nl.program_id(0)`` set (LNC=2: two threads, so ``core_barrier``/``sendrecv`` work), checks that every returned tensor lives in ``shared_hbm`` and that live
SBUF/PSUM stayed within capacity, then converts outputs back: NumPy in -> NumPy out, torch CPU
tensors in -> torch tensors out. Inputs the kernel wrote are copied back into the caller's arrays.
Non-array arguments are compile-time constants and pass through unchanged.

Calling an ``@nki.jit`` function directly runs it in nkisim, since no Neuron device exists here
(on a Trainium host the real ``nki`` package is imported instead and nkisim is never installed).
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from . import dtypes as dt
from . import runtime
from . import trace as trace_mod
from . import target as target_mod
from .errors import KernelError
from .tensor import SHARED_HBM, NkiTensor, Storage


class Kernel:
    """An ``@nki.jit`` function. ``kernel(*args)`` simulates; ``kernel[2]`` is an LNC=2 launch."""

    def __init__(self, fn, lnc: int = 1):
        self.fn = fn
        self.lnc = lnc
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid):
        if isinstance(grid, tuple):
            if len(grid) != 1:
                raise KernelError(f"{self.fn.__name__}[{grid}]: NKI 0.6 launches take one LNC degree, "
                                  f"kernel[1] or kernel[2]; multi-dimensional SPMD grids are the old API")
            grid = grid[0]
        if int(grid) not in (1, 2):
            raise KernelError(f"{self.fn.__name__}[{grid}]: the logical-NeuronCore degree must be 1 or 2")
        return Kernel(self.fn, int(grid))

    def with_schedule(self, schedule) -> "Kernel":
        """``kernel.with_schedule([(consumer_name, producer_name), ...])``: scheduling edges between
        named instructions; nkisim runs in program order, so the same kernel is returned."""
        return self

    def __call__(self, *args, **kwargs):
        if runtime.current() is not None:
            return self.fn(*args, **kwargs)      # a kernel calling a kernel: inlined
        return launch(self.fn, self.lnc, args, kwargs)

    def __repr__(self):
        return f"<nki.jit kernel {self.fn.__name__} lnc={self.lnc}>"


def jit(fn=None, **options):
    """``@nki.jit`` / ``@nki.jit(...)``. Options of the real decorator are accepted and ignored."""
    if fn is None:
        return lambda f: Kernel(f)
    return Kernel(fn)


def simulate(kernel):
    """``nki.simulate(kernel)(*args)``: run a kernel (plain function, jit kernel, or ``kernel[2]``)."""
    if isinstance(kernel, Kernel):
        fn, lnc = kernel.fn, kernel.lnc
    elif callable(kernel):
        fn, lnc = kernel, 1
    else:
        raise KernelError(f"nki.simulate expects a kernel function, got {type(kernel).__name__}")

    @functools.wraps(fn)
    def run(*args, **kwargs):
        return launch(fn, lnc, args, kwargs)
    return run


# ---- argument conversion ------------------------------------------------------------------

class _Arg:
    """An array argument: its HBM storage and how to give results back to the caller."""

    def __init__(self, value):
        self.value = value
        self.is_torch = _is_torch(value)
        array = _torch_to_numpy(value) if self.is_torch else np.asarray(value)
        dtype = dt.normalize(array.dtype)       # rejects float64/int64 with a clear message
        self.storage = Storage(SHARED_HBM, array.shape if array.ndim else (1,), dtype, "input",
                               data=np.array(array, dtype=dt.storage(dtype), copy=True).reshape(-1))
        self.original = self.storage.data.copy()

    def write_back(self):
        if np.array_equal(self.storage.data.view(np.uint8), self.original.view(np.uint8)):
            return
        if self.is_torch:
            self.value.copy_(_numpy_to_torch(self.storage.data.reshape(self.value.shape)))
        else:
            self.value[...] = self.storage.data.reshape(self.value.shape)


def _is_torch(value) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _torch_to_numpy(t) -> np.ndarray:
    import torch
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(dt.bfloat16)
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return t.view(torch.uint8).numpy().view(dt.float8_e4m3fn if t.dtype == torch.float8_e4m3fn else dt.float8_e5m2)
    return t.numpy()


def _numpy_to_torch(array: np.ndarray):
    import torch
    array = np.ascontiguousarray(array)
    if array.dtype == dt.bfloat16:
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    if array.dtype == dt.float8_e4m3fn:
        return torch.from_numpy(array.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    if array.dtype == dt.float8_e5m2:
        return torch.from_numpy(array.view(np.uint8).copy()).view(torch.float8_e5m2)
    return torch.from_numpy(array.copy())


def _is_array(value) -> bool:
    return isinstance(value, np.ndarray) or _is_torch(value)


def _wrap(value, args: list):
    if _is_array(value):
        a = _Arg(value)
        args.append(a)
        return NkiTensor(a.storage)
    if isinstance(value, tuple):
        return tuple(_wrap(v, args) for v in value)
    if isinstance(value, list):
        raise KernelError("list kernel arguments are not supported by NKI; pass a tuple")
    return value


def _unwrap(value, kernel_name: str, as_torch: bool, outputs: list):
    if isinstance(value, NkiTensor):
        if value.buffer != SHARED_HBM:
            raise KernelError(f"{kernel_name}: returned tensor {value.name} lives in {value.buffer}; kernel outputs "
                              f"must be allocated with buffer=nl.shared_hbm (NKI 0.3.0+)")
        array = np.asarray(value.numpy()).astype(dt.logical(value.dtype))    # rounds once if NKI_PRECISE_FP=0
        return _numpy_to_torch(array) if as_torch else array
    if isinstance(value, (tuple, list)):
        return type(value)(_unwrap(v, kernel_name, as_torch, outputs) for v in value)
    if value is None:
        return None
    raise KernelError(f"{kernel_name}: kernels return HBM tensors (or tuples of them), got {type(value).__name__}")


def launch(fn, lnc: int, args: tuple, kwargs: dict):
    """Run ``fn`` as an NKI kernel on ``lnc`` logical-core programs; see the module docstring."""
    target = target_mod.get()
    arrays: list[_Arg] = []
    wrapped_args = [_wrap(a, arrays) for a in args]
    wrapped_kwargs = {k: _wrap(v, arrays) for k, v in kwargs.items()}
    group = runtime.LncGroup(lnc)
    results: dict = {}
    errors: dict = {}

    def program(program_id: int) -> None:
        run = runtime.KernelRun(target, program_id, lnc, group=group)
        runtime.push(run)
        try:
            results[program_id] = fn(*wrapped_args, **wrapped_kwargs)
            run.check_capacity(fn.__name__)
        except BaseException as exc:  # re-raised in the launching thread
            errors[program_id] = exc
        finally:
            runtime.pop()
            group.finish(program_id)

    if lnc == 1:
        program(0)
    else:
        marks = [(t, len(t.instructions)) for t in trace_mod._active]
        threads = [threading.Thread(target=program, args=(p,), name=f"nkisim-lnc-{p}") for p in range(lnc)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # The threads interleave their records arbitrarily; keep traces deterministic: program 0's
        # instructions, then program 1's, each in program order.
        for t, start in marks:
            t.instructions[start:] = sorted(t.instructions[start:], key=lambda i: (i.program_id, i.index))
    if errors:
        # A program blocked on a partner that failed reports a follow-up error; show the cause.
        first = min(errors, key=lambda p: (isinstance(errors[p], KernelError) and "waits for program" in str(errors[p]), p))
        raise errors[first]
    result = results[0]
    as_torch = any(a.is_torch for a in arrays)
    out = _unwrap(result, fn.__name__, as_torch, [])
    for a in arrays:
        a.write_back()
    return out
