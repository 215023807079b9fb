"""nkisim: a strict CPU interpreter of NKI 0.6 (NumPy + ml_dtypes).

Modules mirror the ``nki`` package: ``nkisim.language`` is ``nki.language``, ``nkisim.isa`` is
``nki.isa`` (one module per engine), ``nkisim.jit`` holds ``nki.jit`` / ``nki.simulate``.
``nkisim.install()`` makes ``import nki`` resolve to nkisim where the real package is absent,
so the same kernel source runs on Trainium and here::

    import nkisim; nkisim.install()
    import nki, nki.language as nl, nki.isa as nisa
    out = nki.simulate(my_kernel)(a, b)          # NumPy or torch CPU tensors in and out

    with nkisim.trace() as t:                    # every executed instruction
        my_kernel(a, b)
    print(t.estimate("trn2").summary())          # cost-model estimate

Target: ``NEURON_PLATFORM_TARGET_OVERRIDE`` = trn1 | trn2 | trn3 (default trn2).

Also aliased: ``nki.typing`` (annotations) and ``nki.collectives`` (importable, not simulated).
Layout: ``tensor.py``/``tensor_views.py`` (NkiTensor and its views), ``runtime.py`` (launch state,
liveness, SBUF/PSUM capacity, LNC group), ``jit.py`` (launches; LNC=2 as two threads),
``language*.py`` (nki.language), ``isa/`` (one module per engine), ``trace.py``, ``cost/``.
Not simulated: MX matmul/quantize, topk and gather helpers, PRNG state save/restore, tensor
indirection (``.indirect()``) on compute engines; the APIs exist and raise ``NotSimulatedError``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

from . import errors, isa, language, typing
from numpy import dtype     # ``nki.dtype``: NKI dtypes are NumPy dtypes here (used in annotations)
from .jit import Kernel, jit, simulate
from .trace import Instruction, Trace, trace
from .cost import profile

__all__ = ["install", "installed", "jit", "simulate", "trace", "profile", "Trace", "Instruction", "Kernel", "errors",
           "language", "isa"]

# Real module name -> nkisim module that stands in for it.
_ALIASES = {"nki": "nkisim", "nki.language": "nkisim.language", "nki.isa": "nkisim.isa", "nki.typing": "nkisim.typing",
            "nki.collectives": "nkisim.collectives", "nki.isa.constants": "nkisim.isa.enums"}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, real: str):
        self.real = real

    def create_module(self, spec):
        module = types.ModuleType(spec.name, f"nkisim stand-in for {spec.name}")
        target = importlib.import_module(self.real)

        def __getattr__(name):  # noqa: N807 - PEP 562 module __getattr__
            if spec.name == "nki" and name in ("language", "isa", "typing", "collectives"):
                return importlib.import_module(f"nki.{name}")
            if spec.name == "nki.isa" and name == "constants":
                return importlib.import_module("nki.isa.constants")
            return getattr(target, name)

        module.__getattr__ = __getattr__
        module.__dir__ = lambda: dir(target)
        module.__nkisim__ = True
        return module

    def exec_module(self, module):
        pass


class _NkiFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _ALIASES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(_ALIASES[fullname]), origin="nkisim",
                                              is_package=(fullname in ("nki", "nki.isa")))


def installed() -> bool:
    """True when ``import nki`` resolves to nkisim."""
    return any(isinstance(f, _NkiFinder) for f in sys.meta_path)


def _real_nki_importable() -> bool:
    if installed():
        return False
    try:
        if importlib.util.find_spec("nki") is None:
            return False
        importlib.import_module("nki.language")
        importlib.import_module("nki.isa")
        return True
    except Exception:  # PyPI's placeholder raises "WRONG PACKAGE"; a broken install is as good as none
        for name in [n for n in sys.modules if n == "nki" or n.startswith("nki.")]:
            del sys.modules[name]
        return False


def install() -> bool:
    """Make ``import nki`` (and ``nki.language``, ``nki.isa``) resolve to nkisim unless the real NKI
    package imports. Returns True if nkisim is (now) what ``nki`` means, False if the real one is."""
    if installed():
        return True
    if _real_nki_importable():
        return False
    sys.meta_path.insert(0, _NkiFinder())
    return True
