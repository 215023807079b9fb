"""``make upload``: publish ``build/`` to a kernel-type Hub repository with huggingface_hub.

Plan (printed first, always): create the repo (``repo_type="kernel"``, ``exist_ok``), create branch ``v<version>``
from ``main`` if missing, upload every file of the variants under ``build/`` to that branch in one commit that also
deletes stale files under those variant folders, then ``benchmarks/benchmark*.py`` (for ``kernels benchmark``)
the same way when the repo has them, and upload ``build/CARD.md`` as ``README.md`` on ``main`` (what
``kernel-builder upload`` does). ``get_kernel(repo, version=N)`` then resolves branch ``vN``.

``--dry-run`` (``DRY_RUN=1``) prints the plan and stops: no token needed, no ``HfApi`` created, nothing sent.
Without a token (``HF_TOKEN`` or ``hf auth login``) the plan is printed and the upload refused.
The plan is checked against the build: every variant's ``metadata.json`` carries the version being published, and
the card names the target repo (a card built for another repo id would tell users to load the wrong one).
A 403 on repo creation means the namespace may not create kernel repos; the error says so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .build import BENCHMARK_PATTERN, BENCHMARKS_DIR, CARD_FILE, METADATA_FILE, REPO_ROOT, VARIANTS
from .config import load_config

REPO_TYPE = "kernel"
MAIN_BRANCH = "main"
CARD_PATH_IN_REPO = "README.md"
BUILD_PATH_IN_REPO = "build"
HTTP_FORBIDDEN = 403
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_TRUE = ("1", "true", "yes", "on")


class UploadError(ValueError):
    """The build cannot be published as asked; the message says what to change."""


@dataclass(frozen=True)
class UploadPlan:
    repo_id: str
    version: int
    build_dir: Path
    variants: tuple       # folder names under build/, e.g. ("torch-cpu", "torch-neuron")
    files: tuple          # paths relative to build/, e.g. "torch-neuron/__init__.py"
    benchmarks_dir: Path | None = None    # the repo's benchmarks/ when it holds benchmark*.py
    benchmark_files: tuple = ()           # names in benchmarks_dir, e.g. "benchmark.py"

    @property
    def branch(self) -> str:
        return f"v{self.version}"

    @property
    def card(self) -> Path:
        return self.build_dir / CARD_FILE

    @property
    def variant_patterns(self) -> list:
        return [f"{variant}/**" for variant in self.variants]


def _ignored(path: Path) -> bool:
    """Bytecode that Python writes into build/ when a test or the demo imports a variant."""
    return "__pycache__" in path.parts or path.suffix == ".pyc"


def make_plan(build_dir: Path, repo_id: str, version: int | None = None,
              benchmarks_dir: Path | None = None) -> UploadPlan:
    """Check ``build_dir`` against the target and list what would be uploaded (``benchmarks_dir``: where
    ``benchmark*.py`` for ``kernels benchmark`` live, if anywhere)."""
    if not _REPO_ID.match(repo_id):
        raise UploadError(f"REPO_ID={repo_id!r} is not a Hub repo id; use <org-or-user>/<name>")
    if "flash" in repo_id.lower():
        # Transformers tests `"flash" in attn_implementation` (org included) and then calls flash-style kernels
        raise UploadError(f"REPO_ID={repo_id!r}: a repo id containing 'flash' makes Transformers use flash-style "
                          "attention calls for attn_implementation=<repo>; pick another name")
    variants = tuple(sorted(p.name for p in build_dir.iterdir() if (p / METADATA_FILE).is_file())) \
        if build_dir.is_dir() else ()
    expected = sorted(v.dir_name for v in VARIANTS)
    if list(variants) != expected:
        raise UploadError(f"{build_dir} holds variants {list(variants)}, expected {expected}: run `make build` first")
    versions = {json.loads((build_dir / v / METADATA_FILE).read_text())["version"] for v in variants}
    if len(versions) != 1:
        raise UploadError(f"the variants in {build_dir} disagree on the version ({sorted(versions)}): rebuild")
    built_version = versions.pop()
    if version is not None and version != built_version:
        raise UploadError(f"VERSION={version} but the build is version {built_version}: set version = {version} in "
                          f"build.toml and run `make build`, or upload with VERSION={built_version}")
    card = build_dir / CARD_FILE
    if not card.is_file():
        raise UploadError(f"{card} is missing: run `make build`")
    if f'"{repo_id}"' not in card.read_text(encoding="utf-8"):
        raise UploadError(f"{card} was built for another repo id: run `make build REPO_ID={repo_id}` (or "
                          f"`make upload REPO_ID={repo_id}`, which builds first)")
    files = tuple(sorted(p.relative_to(build_dir).as_posix() for v in variants
                         for p in (build_dir / v).rglob("*") if p.is_file() and not _ignored(p)))
    benchmark_files = tuple(sorted(p.name for p in benchmarks_dir.glob(BENCHMARK_PATTERN))) \
        if benchmarks_dir is not None and benchmarks_dir.is_dir() else ()
    return UploadPlan(repo_id=repo_id, version=built_version, build_dir=build_dir, variants=variants, files=files,
                      benchmarks_dir=benchmarks_dir if benchmark_files else None, benchmark_files=benchmark_files)


def describe(plan: UploadPlan) -> str:
    lines = [f"repo:   {plan.repo_id} (repo_type={REPO_TYPE}; created if missing)",
             f"branch: {plan.branch} (created from {MAIN_BRANCH} if missing); get_kernel(\"{plan.repo_id}\", "
             f"version={plan.version}) loads it",
             f"upload to {plan.branch}, one commit ({len(plan.files)} files; stale files under "
             + ", ".join(f"{BUILD_PATH_IN_REPO}/{v}/" for v in plan.variants) + " are deleted):"]
    lines += [f"  {BUILD_PATH_IN_REPO}/{path}" for path in plan.files]
    if plan.benchmark_files:
        lines.append(f"upload to {plan.branch}, one commit (stale {BENCHMARKS_DIR}/{BENCHMARK_PATTERN} are deleted):")
        lines += [f"  {BENCHMARKS_DIR}/{name}" for name in plan.benchmark_files]
    lines.append(f"upload to {MAIN_BRANCH}: {CARD_PATH_IN_REPO} <- {plan.build_dir.name}/{CARD_FILE}")
    return "\n".join(lines)


def _forbidden_message(repo_id: str, error: Exception) -> str:
    org = repo_id.split("/")[0]
    server = getattr(error, "server_message", None) or str(error)
    return (f"The Hub refused to create the kernel repository {repo_id} (HTTP 403: {server.strip()}).\n"
            f"Creating kernel-type repositories is restricted: the namespace '{org}' must be granted kernel "
            f"publishing rights on the Hub (ask the Hugging Face team), or publish under a namespace that has them "
            f"(make upload REPO_ID=<namespace>/{repo_id.split('/')[1]}). Also check that the token can write to "
            f"'{org}'.")


def execute(plan: UploadPlan, api, log=print) -> None:
    """Run the plan against ``api`` (an ``HfApi``, or a stand-in with the same methods)."""
    from huggingface_hub.errors import HfHubHTTPError

    try:
        api.create_repo(plan.repo_id, repo_type=REPO_TYPE, exist_ok=True)
    except HfHubHTTPError as error:
        if getattr(error.response, "status_code", None) == HTTP_FORBIDDEN:
            raise UploadError(_forbidden_message(plan.repo_id, error)) from error
        raise
    log(f"[upload] repo {plan.repo_id} ready")
    api.create_branch(plan.repo_id, branch=plan.branch, repo_type=REPO_TYPE, exist_ok=True)
    log(f"[upload] branch {plan.branch} ready")
    ids = sorted(json.loads((plan.build_dir / v / METADATA_FILE).read_text())["id"] for v in plan.variants)
    api.upload_folder(repo_id=plan.repo_id, repo_type=REPO_TYPE, revision=plan.branch,
                      folder_path=str(plan.build_dir), path_in_repo=BUILD_PATH_IN_REPO,
                      allow_patterns=plan.variant_patterns, ignore_patterns=["**/__pycache__/**", "*.pyc"],
                      delete_patterns=plan.variant_patterns,
                      commit_message=f"Build version {plan.version}: {', '.join(ids)}")
    log(f"[upload] {len(plan.files)} files uploaded to {plan.branch}")
    if plan.benchmark_files:
        api.upload_folder(repo_id=plan.repo_id, repo_type=REPO_TYPE, revision=plan.branch,
                          folder_path=str(plan.benchmarks_dir), path_in_repo=BENCHMARKS_DIR,
                          allow_patterns=[BENCHMARK_PATTERN], delete_patterns=[BENCHMARK_PATTERN],
                          commit_message=f"Benchmarks for version {plan.version}")
        log(f"[upload] {len(plan.benchmark_files)} benchmark scripts uploaded to {plan.branch}")
    api.upload_file(path_or_fileobj=str(plan.card), path_in_repo=CARD_PATH_IN_REPO, repo_id=plan.repo_id,
                    repo_type=REPO_TYPE, revision=MAIN_BRANCH, commit_message=f"Kernel card for version {plan.version}")
    log(f"[upload] {CARD_PATH_IN_REPO} uploaded to {MAIN_BRANCH}")


def _token() -> str | None:
    from huggingface_hub import get_token

    return os.environ.get("HF_TOKEN") or get_token()


def main(argv: list[str] | None = None, api_factory=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hubtools.upload", description=__doc__.splitlines()[0])
    parser.add_argument("--repo-id", default=None, help="target repo (default: [general.hub] repo-id in build.toml)")
    parser.add_argument("--version", type=int, default=None, help="version to publish (default: the build's)")
    parser.add_argument("--build-dir", type=Path, default=REPO_ROOT / "build")
    parser.add_argument("--benchmarks-dir", type=Path, default=REPO_ROOT / BENCHMARKS_DIR,
                        help="where benchmark*.py for `kernels benchmark` live (uploaded when present)")
    parser.add_argument("--dry-run", action="store_true", default=os.environ.get("DRY_RUN", "").lower() in _TRUE,
                        help="print the plan and stop (also DRY_RUN=1)")
    args = parser.parse_args(argv)
    try:
        repo_id = args.repo_id or load_config(REPO_ROOT).repo_id
        plan = make_plan(args.build_dir, repo_id, args.version, args.benchmarks_dir)
        print(describe(plan))
        if args.dry_run:
            print("dry run: nothing was created or uploaded")
            return 0
        token = _token()
        if not token:
            raise UploadError("no Hugging Face token: set HF_TOKEN to a write token of an account that may publish "
                              f"kernels to '{repo_id.split('/')[0]}' (or run `hf auth login`); DRY_RUN=1 shows the "
                              "plan without one")
        if api_factory is None:
            from huggingface_hub import HfApi as api_factory
        execute(plan, api_factory(token=token))
    except UploadError as exc:
        print(f"upload failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
