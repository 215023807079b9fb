"""Checks on a staged build variant before it replaces ``build/<variant>/``.

1. Static (AST, every ``.py`` of the variant):
   - the package imports itself only relatively: kernels loads it under its unique id (``_neuron_vit_attn_<...>``),
     so ``import neuron_vit_attn`` or ``from kernels.attention import ...`` (the NKI source folder) would import
     another copy, or nothing, on a user's machine;
   - only ``_ops.py`` names the op namespace: no ``torch.ops.<name>`` attribute and no ``"<ns>::op"`` literal
     elsewhere, so two loaded builds never register ops under the same name.
2. Dynamic (a fresh ``python -I -B`` subprocess: neither the repo root nor ``torch_ext/`` is importable, the source
   package name is blocked in ``sys.modules``, and no ``__pycache__`` lands in the build): load the variant with
   ``kernels.get_local_kernel`` exactly as users do (nkisim stands in for ``nki`` when the real one is absent), then
   check ``__all__``: every entry resolves, every public function or class the package defines at top level is
   listed, the Transformers entry points and ``layers`` are there, and each layer follows the kernelize rules
   (``nn.Module`` subclass, no ``__init__``, a ``forward``). It returns the API description the card is written from.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

# What Transformers (attn_implementation="org/repo") and the README rely on.
REQUIRED_API = ("attention", "flash_attn_forward", "supports_flash_attn", "layers")
_OPS_FILE = "_ops.py"
_NAMESPACE_LITERAL = re.compile(r"\b_?neuron_vit_attn\w*::")
IMPORT_CHECK_TIMEOUT_S = 300


class BuildCheckError(ValueError):
    """A staged variant would not load, or would load wrongly, from the Hub."""


def _docstring_nodes(tree: ast.Module) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def check_sources(variant_dir: Path, module_name: str, nki_modules: set[str]) -> None:
    """Static checks of every ``.py`` under ``variant_dir`` (see module docstring, 1).

    ``nki_modules``: module names of the NKI source files (``attention`` for ``kernels/attention.py``).
    """
    forbidden_roots = {module_name, "torch_ext", "_nki"}
    problems = []
    for path in sorted(variant_dir.rglob("*.py")):
        rel = path.relative_to(variant_dir).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        docstrings = _docstring_nodes(tree)
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] in forbidden_roots or (parts[0] == "kernels" and len(parts) > 1
                                                   and parts[1] in nki_modules):
                    problems.append(f"{rel}:{node.lineno}: absolute import of {name!r}; inside the package use a "
                                    f"relative import (from . import ..., from ._nki import ...)")
            if rel == _OPS_FILE:
                continue
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "ops" and "neuron_vit_attn" in node.attr):
                problems.append(f"{rel}:{node.lineno}: torch.ops.{node.attr} names the op namespace; use "
                                f"`ops` / `add_op_namespace_prefix` from ._ops")
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                    and _NAMESPACE_LITERAL.search(node.value)):
                problems.append(f"{rel}:{node.lineno}: string {node.value!r} names the op namespace; use "
                                f"add_op_namespace_prefix from ._ops")
    if problems:
        raise BuildCheckError(f"{variant_dir.name}: the package must import itself relatively and get its op "
                              "namespace only from ._ops:\n  " + "\n  ".join(problems))


# Runs in the subprocess: argv = [variant_dir, source module name, required names as JSON, backend].
_IMPORT_CHECK_SCRIPT = r'''
import inspect, json, sys, types
from pathlib import Path

variant_dir, source_module, required, backend = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
if backend == "neuron":
    import torch
    if not hasattr(torch, "neuron"):   # a CPU build host: simulate a Neuron host, as kernels detects one
        fake = types.ModuleType("neuron")
        fake.is_available = lambda: False
        torch.neuron = fake
for blocked in (source_module, "torch_ext"):
    sys.modules[blocked] = None        # an absolute self-import fails here as it would on a user's machine
try:
    import nkisim
    nkisim.install()                   # `import nki` -> nkisim unless the real NKI is installed
except ImportError:
    pass
from kernels import get_local_kernel

module = get_local_kernel(variant_dir)
problems = []
exported = getattr(module, "__all__", None)
if not isinstance(exported, (list, tuple)) or not all(isinstance(n, str) for n in exported):
    print(json.dumps({"problems": ["__all__ is missing or is not a list of names"]}))
    sys.exit(0)
if len(set(exported)) != len(exported):
    problems.append(f"__all__ lists a name twice: {sorted(n for n in exported if list(exported).count(n) > 1)}")
problems += [f"__all__ lists {n!r} but the module has no such attribute" for n in exported if not hasattr(module, n)]
problems += [f"required public name {n!r} is not in __all__" for n in required if n not in exported]
for name, value in sorted(vars(module).items()):
    if name.startswith("_") or name in exported or not (inspect.isfunction(value) or inspect.isclass(value)):
        continue
    if getattr(value, "__module__", "").startswith(module.__name__):
        problems.append(f"{name!r} is public and defined in the package but missing from __all__")
if "supports_flash_attn" in exported and getattr(module, "supports_flash_attn", None) is not True:
    problems.append("supports_flash_attn must be True for Transformers to use flash_attn_forward")

def describe(obj):
    try:
        signature = str(inspect.signature(obj))
    except (TypeError, ValueError):
        signature = ""
    return {"signature": signature, "doc": inspect.getdoc(obj) or ""}

functions, constants, layers = {}, {}, {}
for name in exported:
    value = getattr(module, name, None)
    if callable(value) and not inspect.isclass(value):
        functions[name] = describe(value)
    elif not isinstance(value, types.ModuleType) and not inspect.isclass(value):
        constants[name] = repr(value)
layers_module = getattr(module, "layers", None)
if layers_module is not None:
    import torch.nn as nn
    layer_names = getattr(layers_module, "__all__", None)
    if layer_names is None:
        layer_names = [n for n, v in vars(layers_module).items()
                       if inspect.isclass(v) and issubclass(v, nn.Module) and v.__module__ == layers_module.__name__]
    for name in layer_names:
        cls = getattr(layers_module, name, None)
        if not (inspect.isclass(cls) and issubclass(cls, nn.Module)):
            problems.append(f"layers.{name} is not an nn.Module subclass")
            continue
        if "__init__" in vars(cls):
            problems.append(f"layers.{name} defines __init__; kernelize layers may only define forward")
        if "forward" not in vars(cls):
            problems.append(f"layers.{name} has no forward")
        # the class's own docstring: inspect.getdoc would fall back to nn.Module's
        layers[name] = {**describe(cls.forward), "doc": inspect.cleandoc(vars(cls).get("__doc__") or "")}
print(json.dumps({"problems": problems, "module": module.__name__, "all": list(exported),
                  "functions": functions, "constants": constants, "layers": layers}))
'''


def check_import(variant_dir: Path, module_name: str, backend: str, python: str = sys.executable) -> dict:
    """Load the staged variant in a clean subprocess and check its public API (module docstring, 2).

    ``backend``: the variant's backend; for "neuron" on a host without TorchNeuron the subprocess fakes
    ``torch.neuron`` (kernels checks ``python-depends`` against the detected backend).

    Returns ``{"module", "all", "functions", "constants", "layers"}`` for the card."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("LOCAL_KERNELS", None)
    result = subprocess.run([python, "-I", "-B", "-c", _IMPORT_CHECK_SCRIPT, str(variant_dir), module_name,
                             json.dumps(REQUIRED_API), backend], capture_output=True, text=True, env=env,
                            cwd=variant_dir.parent, timeout=IMPORT_CHECK_TIMEOUT_S)
    if result.returncode != 0:
        raise BuildCheckError(f"{variant_dir.name}: the package does not import through kernels.get_local_kernel:\n"
                              f"{result.stderr.strip()[-4000:]}")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    if report["problems"]:
        raise BuildCheckError(f"{variant_dir.name}: public API problems:\n  " + "\n  ".join(report["problems"]))
    return report
