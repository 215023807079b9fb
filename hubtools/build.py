"""``make build``: write the Hub artifact from ``torch_ext/<module>/`` + ``kernels/`` + ``build.toml``.

Output (what kernel-builder's noarch build writes, see shared/hub-and-transformers.md section 2)::

    build/torch-neuron/   the package, flat: __init__.py, layers.py, ..., _nki/ (the NKI sources, a real folder),
                          _ops.py (unique op namespace), metadata.json (backend neuron, python-depends ["nki"])
    build/torch-cpu/      the same files for CPU hosts (eager reference; the nkisim path with
                          NEURON_VIT_ATTN_BACKEND=sim), metadata.json with backend cpu and no python-depends
    build/CARD.md         the Hub card (README.md of the Hub repo)

Algorithm: list the inputs the way git would commit them (:mod:`hubtools.source_id`), derive the build id
``_<module>_<backend>_<7-hex tree hash>[_dirty]``, stage each variant in ``build/.staging/`` (copy the package
except its ``_nki`` link and ``_ops.py``; copy ``kernels/*.py`` into ``_nki/`` with an ``__init__.py``; write
``_ops.py`` and ``metadata.json``), check it (:mod:`hubtools.checks`), then swap it into place; a failed check
leaves the previous build untouched and no staging behind.
Deterministic: same sources -> byte-identical output (sorted JSON, no timestamps, fixed file modes).
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import card, checks
from .config import KernelConfig, load_config
from .source_id import SourceId, list_inputs, source_id

REPO_ROOT = Path(__file__).resolve().parent.parent
TORCH_EXT = "torch_ext"
NKI_SOURCES = "kernels"          # the NKI kernels folder in the repo
NKI_PACKAGE = "_nki"             # its name inside the built package
OPS_FILE = "_ops.py"
METADATA_FILE = "metadata.json"
CARD_FILE = "CARD.md"
STAGING = ".staging"
BENCH_REPORT = Path("bench") / "out" / "report.md"
BENCHMARKS_DIR = "benchmarks"        # scripts for `kernels benchmark`; the upload puts them beside build/
BENCHMARK_PATTERN = "benchmark*.py"
FILE_MODE = 0o644

_NKI_INIT = '''"""The NKI kernels of this package (copied from the source repository's kernels/ by the build).

Modules here import ``nki`` (the real NKI on a Trainium host, or nkisim standing in for it on CPU), so the
package imports them only when a kernel is about to run.
"""
'''

_OPS_TEMPLATE = '''"""Op namespace of this build (written by the build, kernel-builder's noarch ``_ops.py`` convention).

Every op the package registers is named ``{ops_name}::<op>``, unique to this build's sources and backend, so two
loaded builds never register the same op. The rest of the package gets the namespace only from here.
"""

import torch

_OPS_NAME = "{ops_name}"

ops = getattr(torch.ops, _OPS_NAME)


def add_op_namespace_prefix(op_name: str) -> str:
    """Qualified op name, e.g. ``{ops_name}::attention_fwd``."""
    return f"{{_OPS_NAME}}::{{op_name}}"
'''
_OPS_NAMES = {"_OPS_NAME", "ops", "add_op_namespace_prefix"}


class BuildError(ValueError):
    """The sources cannot be turned into a valid Hub build."""


@dataclass(frozen=True)
class Variant:
    dir_name: str          # build/<dir_name>
    backend: str           # metadata backend type


VARIANTS = (Variant("torch-neuron", "neuron"), Variant("torch-cpu", "cpu"))


@dataclass(frozen=True)
class BuildResult:
    out_dir: Path
    source: SourceId
    variant_ids: dict      # dir_name -> metadata id
    api: dict              # the public API report of the neuron variant (hubtools.checks.check_import)


def ops_name(module_name: str, backend: str, source: SourceId) -> str:
    """``_<module>_<backend>_<7-hex>[_dirty]``: the metadata id, the import name and the op namespace."""
    return f"_{module_name}_{backend}_{source.short}"


def metadata(config: KernelConfig, variant: Variant, build_id: str) -> dict:
    """metadata.json of a variant (keys as kernels 0.17.2 parses them)."""
    return {
        "name": config.name,
        "id": build_id,
        "version": config.version,
        "license": config.license,
        "python-depends": list(config.neuron_python_depends) if variant.backend == "neuron" else [],
        "backend": {"type": variant.backend},
    }


def _top_level_names(source: str) -> set[str]:
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _check_source_ops(package_dir: Path) -> None:
    """The build rewrites _ops.py; the source's one must not define names the rewrite would drop."""
    path = package_dir / OPS_FILE
    if not path.is_file():
        raise BuildError(f"{TORCH_EXT}/{package_dir.name}/{OPS_FILE} is missing: the package takes its op "
                         f"namespace from it")
    extra = _top_level_names(path.read_text(encoding="utf-8")) - _OPS_NAMES
    if extra:
        raise BuildError(f"{package_dir.name}/{OPS_FILE} defines {sorted(extra)}, which the build's _ops.py "
                         f"(only {sorted(_OPS_NAMES)}) would drop; move them to another module")


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(FILE_MODE)


def _stage_variant(repo_root: Path, files: list[str], config: KernelConfig, variant: Variant, build_id: str,
                   stage_dir: Path) -> None:
    package_prefix = f"{TORCH_EXT}/{config.module_name}/"
    nki_prefix = f"{NKI_SOURCES}/"
    for rel in files:
        src = repo_root / rel
        if rel.startswith(package_prefix):
            inner = rel[len(package_prefix):]
            if inner == OPS_FILE or inner == NKI_PACKAGE or inner.startswith(f"{NKI_PACKAGE}/"):
                continue            # rewritten below / replaced by a real copy of kernels/
            if src.is_symlink():
                raise BuildError(f"{rel} is a symlink; the Hub package must contain real files")
            _write(stage_dir / inner, src.read_bytes())
        elif rel.startswith(nki_prefix) and rel.endswith(".py"):
            if src.is_symlink():
                raise BuildError(f"{rel} is a symlink; the Hub package must contain real files")
            _write(stage_dir / NKI_PACKAGE / rel[len(nki_prefix):], src.read_bytes())
    nki_dir = stage_dir / NKI_PACKAGE
    nki_dir.mkdir(exist_ok=True)
    for folder in [nki_dir, *sorted(p for p in nki_dir.rglob("*") if p.is_dir() and p.name != "__pycache__")]:
        if not (folder / "__init__.py").exists():
            _write(folder / "__init__.py", _NKI_INIT.encode())
    _write(stage_dir / OPS_FILE, _OPS_TEMPLATE.format(ops_name=build_id).encode())
    _write(stage_dir / METADATA_FILE,
           (json.dumps(metadata(config, variant, build_id), indent=2, sort_keys=True) + "\n").encode())


def _nki_docstrings(repo_root: Path, files: list[str]) -> dict:
    """Module docstrings of the NKI kernel entry modules (those defining an ``@nki.jit`` kernel), by module
    name: they state shapes, dtypes and limits; helper modules' docstrings describe internals."""
    docs = {}
    for rel in files:
        if rel.startswith(f"{NKI_SOURCES}/") and rel.endswith(".py") and not rel.endswith("__init__.py"):
            source = (repo_root / rel).read_text(encoding="utf-8")
            if "@nki.jit" not in source:
                continue
            doc = ast.get_docstring(ast.parse(source))
            if doc:
                docs[rel[len(NKI_SOURCES) + 1:-3].replace("/", ".")] = doc
    return docs


def _stage_and_check(repo_root: Path, files: list[str], config: KernelConfig, source: SourceId,
                     nki_modules: set[str], staging: Path, log) -> tuple[dict, dict]:
    """Stage every variant under ``staging`` and check it; returns (variant -> build id, the public API)."""
    ids = {}
    for variant in VARIANTS:
        build_id = ops_name(config.module_name, variant.backend, source)
        _stage_variant(repo_root, files, config, variant, build_id, staging / variant.dir_name)
        checks.check_sources(staging / variant.dir_name, config.module_name, nki_modules)
        ids[variant.dir_name] = build_id
    log("[build] checking that " + " and ".join(f"{v.dir_name} ({ids[v.dir_name]})" for v in VARIANTS)
        + " import through kernels ...")
    # One subprocess per variant, run side by side: each spends its time importing torch.
    with ThreadPoolExecutor(max_workers=len(VARIANTS)) as pool:
        futures = {v.dir_name: pool.submit(checks.check_import, staging / v.dir_name, config.module_name, v.backend)
                   for v in VARIANTS}
        reports = {name: future.result() for name, future in futures.items()}
    api = reports[VARIANTS[0].dir_name]
    for variant in VARIANTS[1:]:
        if reports[variant.dir_name]["all"] != api["all"]:
            raise BuildError(f"{variant.dir_name} exports {reports[variant.dir_name]['all']}, "
                             f"{VARIANTS[0].dir_name} exports {api['all']}: the variants must share one API")
    return ids, api


def build(repo_root: Path = REPO_ROOT, out_dir: Path | None = None, repo_id: str | None = None,
          log=print) -> BuildResult:
    """Write build/torch-neuron, build/torch-cpu and build/CARD.md; returns what was built."""
    config = load_config(repo_root)
    out_dir = out_dir or repo_root / "build"
    package_dir = repo_root / TORCH_EXT / config.module_name
    if not (package_dir / "__init__.py").is_file():
        raise BuildError(f"{TORCH_EXT}/{config.module_name}/__init__.py not found: nothing to build")
    _check_source_ops(package_dir)
    inputs = [f"{TORCH_EXT}/{config.module_name}", NKI_SOURCES, "build.toml"]
    listed = list_inputs(repo_root, inputs)
    files, source = listed[0], source_id(repo_root, inputs, listed)
    nki_modules = {Path(f).stem for f in files if f.startswith(f"{NKI_SOURCES}/") and f.endswith(".py")}
    if "attention" not in nki_modules:
        raise BuildError(f"{NKI_SOURCES}/attention.py not found: the package needs its NKI attention kernel")

    staging = out_dir / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    try:
        ids, api = _stage_and_check(repo_root, files, config, source, nki_modules, staging, log)
        for variant in VARIANTS:
            final = out_dir / variant.dir_name
            shutil.rmtree(final, ignore_errors=True)
            (staging / variant.dir_name).rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    bench_report = repo_root / BENCH_REPORT
    benchmark_scripts = sorted(p.name for p in (repo_root / BENCHMARKS_DIR).glob(BENCHMARK_PATTERN))
    card_text = card.render(config=config, repo_id=repo_id or config.repo_id, source=source, api=api,
                            variant_ids=ids, kernel_docs=_nki_docstrings(repo_root, files),
                            bench_report=bench_report.read_text(encoding="utf-8") if bench_report.is_file() else None,
                            benchmark_scripts=benchmark_scripts)
    _write(out_dir / CARD_FILE, card_text.encode())
    return BuildResult(out_dir=out_dir, source=source, variant_ids=ids, api=api)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hubtools.build", description=__doc__.splitlines()[0])
    parser.add_argument("--repo-id", default=None,
                        help="Hub repo the card points to (default: [general.hub] repo-id in build.toml)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: build/ in the repo root)")
    parser.add_argument("--repo-root", type=Path, default=REPO_ROOT, help="source repository (default: this one)")
    args = parser.parse_args(argv)
    try:
        result = build(repo_root=args.repo_root, out_dir=args.out, repo_id=args.repo_id)
    except (ValueError, OSError) as exc:
        print(f"build failed: {exc}", file=sys.stderr)
        return 1
    for variant, build_id in result.variant_ids.items():
        files = sorted(p.relative_to(result.out_dir).as_posix() for p in (result.out_dir / variant).rglob("*")
                       if p.is_file())
        print(f"[build] {variant}: {build_id} ({len(files)} files)")
    print(f"[build] {CARD_FILE}: {result.out_dir.name}/{CARD_FILE}; sources {result.source.tree_hash}"
          f"{' (dirty: uncommitted changes)' if result.source.dirty else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
