"""`make upload`: the plan, the dry run, and the huggingface_hub calls, against a recording stand-in for HfApi
(no Hub is reachable from the test machines)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils import filter_repo_objects

from hubtools import upload
from hubtools.upload import UploadError, execute, make_plan

REPO = "org/neuron-vit-attn"


def write_build(build_dir: Path, repo_id: str = REPO, version: int = 1) -> Path:
    """A build/ folder as `make build` leaves it (contents trimmed), plus bytecode from an import."""
    for variant, backend in (("torch-neuron", "neuron"), ("torch-cpu", "cpu")):
        folder = build_dir / variant
        (folder / "_nki").mkdir(parents=True)
        (folder / "__pycache__").mkdir()
        for name in ("__init__.py", "_ops.py", "layers.py", "_nki/__init__.py", "_nki/attention.py"):
            (folder / name).write_text(f"# {variant} {name}\n")
        (folder / "__pycache__" / "_ops.cpython-311.pyc").write_bytes(b"\0")
        (folder / "metadata.json").write_text(json.dumps({
            "name": "neuron-vit-attn", "id": f"_neuron_vit_attn_{backend}_abc1234", "version": version,
            "license": "Apache-2.0", "python-depends": ["nki"] if backend == "neuron" else [],
            "backend": {"type": backend}}))
    (build_dir / "CARD.md").write_text(f'---\nlibrary_name: kernels\n---\nget_kernel("{repo_id}", version={version})\n')
    return build_dir


def write_benchmarks(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "benchmark.py").write_text("# kernels benchmark workloads\n")
    (folder / "helpers.py").write_text("# not a benchmark*.py file: stays local\n")
    return folder


class RecordingHfApi:
    """Records the calls the upload makes; ``refuse_create`` makes create_repo fail like the Hub does."""

    def __init__(self, token=None, refuse_create: int | None = None):
        self.token, self.refuse_create, self.calls = token, refuse_create, []

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))
        if self.refuse_create:
            request = httpx2.Request("POST", "https://huggingface.co/api/repos/create")
            raise HfHubHTTPError(f"{self.refuse_create} Client Error",
                                 response=httpx2.Response(self.refuse_create, request=request),
                                 server_message="Kernel repository creation is restricted")

    def create_branch(self, repo_id, **kwargs):
        self.calls.append(("create_branch", repo_id, kwargs))

    def upload_folder(self, **kwargs):
        # What huggingface_hub would send: the folder's files filtered by the patterns, as upload_folder does.
        folder = Path(kwargs["folder_path"])
        local = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        sent = list(filter_repo_objects(local, allow_patterns=kwargs.get("allow_patterns"),
                                        ignore_patterns=kwargs.get("ignore_patterns")))
        self.calls.append(("upload_folder", kwargs["repo_id"], {**kwargs, "sent": sent}))

    def upload_file(self, **kwargs):
        self.calls.append(("upload_file", kwargs["repo_id"], kwargs))


def test_plan_lists_branch_and_every_variant_file(tmp_path):
    plan = make_plan(write_build(tmp_path / "build"), REPO)
    assert plan.branch == "v1" and plan.variants == ("torch-cpu", "torch-neuron")
    assert "torch-neuron/_nki/attention.py" in plan.files and "torch-cpu/metadata.json" in plan.files
    assert not [f for f in plan.files if "__pycache__" in f or f == "CARD.md"]
    text = upload.describe(plan)
    assert f"repo:   {REPO} (repo_type=kernel" in text and "branch: v1" in text
    for path in plan.files:
        assert f"  build/{path}\n" in text
    assert "README.md <- build/CARD.md" in text


def test_execute_makes_the_kernel_repo_branch_and_uploads(tmp_path):
    build_dir = write_build(tmp_path / "build")
    plan = make_plan(build_dir, REPO, benchmarks_dir=write_benchmarks(tmp_path / "benchmarks"))
    api = RecordingHfApi()
    execute(plan, api, log=lambda *_: None)
    assert [name for name, _, _ in api.calls] == ["create_repo", "create_branch", "upload_folder", "upload_folder",
                                                  "upload_file"]
    (_, repo, create), (_, _, branch), (_, _, folder), (_, _, benchmarks), (_, _, card) = api.calls
    assert repo == REPO and create == {"repo_type": "kernel", "exist_ok": True}
    assert branch == {"branch": "v1", "repo_type": "kernel", "exist_ok": True}
    assert folder["repo_type"] == "kernel" and folder["revision"] == "v1" and folder["path_in_repo"] == "build"
    assert folder["folder_path"] == str(build_dir)
    assert folder["sent"] == list(plan.files)          # exactly the planned files: no card, no bytecode
    assert folder["delete_patterns"] == ["torch-cpu/**", "torch-neuron/**"]
    assert benchmarks["sent"] == ["benchmark.py"] and benchmarks["path_in_repo"] == "benchmarks"
    assert benchmarks["revision"] == "v1" and benchmarks["delete_patterns"] == ["benchmark*.py"]
    assert card["path_in_repo"] == "README.md" and card["revision"] == "main" and card["repo_type"] == "kernel"
    assert card["path_or_fileobj"] == str(build_dir / "CARD.md")


def test_forbidden_repo_creation_explains_kernel_publishing_rights(tmp_path):
    plan = make_plan(write_build(tmp_path / "build"), REPO)
    api = RecordingHfApi(refuse_create=403)
    with pytest.raises(UploadError) as failure:
        execute(plan, api, log=lambda *_: None)
    message = str(failure.value)
    assert "Kernel repository creation is restricted" in message
    assert "'org' must be granted kernel publishing rights" in message
    assert [name for name, _, _ in api.calls] == ["create_repo"], "nothing may be uploaded after the refusal"


def test_other_http_errors_propagate(tmp_path):
    plan = make_plan(write_build(tmp_path / "build"), REPO)
    with pytest.raises(HfHubHTTPError):
        execute(plan, RecordingHfApi(refuse_create=500), log=lambda *_: None)


def test_dry_run_prints_the_plan_and_touches_nothing(tmp_path, monkeypatch, capsys):
    build_dir = write_build(tmp_path / "build")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("DRY_RUN", "1")

    def no_api(**_):
        raise AssertionError("a dry run must not create an HfApi")

    benchmarks = write_benchmarks(tmp_path / "benchmarks")
    assert upload.main(["--repo-id", REPO, "--build-dir", str(build_dir), "--benchmarks-dir", str(benchmarks)],
                       api_factory=no_api) == 0
    out = capsys.readouterr().out
    assert "branch: v1" in out and "  build/torch-neuron/_nki/attention.py" in out
    assert "  benchmarks/benchmark.py" in out and "helpers.py" not in out
    assert "dry run: nothing was created or uploaded" in out


def test_main_uploads_with_the_token(tmp_path, monkeypatch):
    build_dir = write_build(tmp_path / "build")
    monkeypatch.delenv("DRY_RUN", raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    apis = []

    def factory(token):
        apis.append(RecordingHfApi(token=token))
        return apis[-1]

    assert upload.main(["--repo-id", REPO, "--version", "1", "--build-dir", str(build_dir),
                        "--benchmarks-dir", str(tmp_path / "no-benchmarks")], api_factory=factory) == 0
    assert apis[0].token == "hf_test" and len(apis[0].calls) == 4


def test_no_token_refuses_after_the_plan(tmp_path, monkeypatch, capsys):
    build_dir = write_build(tmp_path / "build")
    monkeypatch.delenv("DRY_RUN", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(upload, "_token", lambda: None)
    assert upload.main(["--repo-id", REPO, "--build-dir", str(build_dir)], api_factory=RecordingHfApi) == 1
    captured = capsys.readouterr()
    assert "branch: v1" in captured.out and "no Hugging Face token" in captured.err


@pytest.mark.parametrize("repo_id, version, card_repo, message", [
    ("org/neuron-vit-attn", 2, REPO, "VERSION=2 but the build is version 1"),
    ("other/neuron-vit-attn", None, REPO, "make build REPO_ID=other/neuron-vit-attn"),
    ("org/flash-vit", None, "org/flash-vit", "containing 'flash'"),
    ("flashorg/vit-attn", None, "flashorg/vit-attn", "containing 'flash'"),
    ("not a repo", None, REPO, "is not a Hub repo id"),
])
def test_plan_rejects_mismatches(tmp_path, repo_id, version, card_repo, message):
    build_dir = write_build(tmp_path / "build", repo_id=card_repo)
    with pytest.raises(UploadError, match=message):
        make_plan(build_dir, repo_id, version)


def test_plan_needs_a_build(tmp_path):
    with pytest.raises(UploadError, match="run `make build` first"):
        make_plan(tmp_path / "build", REPO)
