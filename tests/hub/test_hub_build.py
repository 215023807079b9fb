"""`make build` on a toy source repository: layout, metadata, build id, determinism, and the checks that reject
a package kernels would load wrongly. (The real package's build is exercised by test_hub_loading.py.)"""

from __future__ import annotations

import json
import subprocess

import pytest
from hub_minirepo import git, make_minirepo
from kernels._rust import Metadata

from hubtools import build as hub_build
from hubtools.build import BuildError, build
from hubtools.checks import BuildCheckError


def _quiet(*_args):
    pass


def _snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The toy repo, built once for the read-only tests of this module."""
    repo = make_minirepo(tmp_path_factory.mktemp("toy"))
    return repo, build(repo, log=_quiet)


def test_writes_both_variants_with_valid_metadata(built):
    repo, result = built
    for variant, backend, depends in (("torch-neuron", "neuron", ["nki"]), ("torch-cpu", "cpu", [])):
        folder = repo / "build" / variant
        meta = json.loads((folder / "metadata.json").read_text())
        assert set(meta) == {"name", "id", "version", "license", "python-depends", "backend"}
        parsed = Metadata.read_from_file(folder / "metadata.json")     # kernels' own parser accepts it
        assert parsed.name.python_name == "neuron_vit_attn" and parsed.version == 1
        assert parsed.python_depends == depends and meta["backend"] == {"type": backend}
        assert meta["id"] == result.variant_ids[variant] == f"_neuron_vit_attn_{backend}_{result.source.short}"
        ops = (folder / "_ops.py").read_text()
        assert f'_OPS_NAME = "{meta["id"]}"' in ops and "_neuron_vit_attn_dev" not in ops
        nki = folder / "_nki"
        assert nki.is_dir() and not nki.is_symlink()
        assert (nki / "attention.py").read_text() == (repo / "kernels" / "attention.py").read_text()
        assert (nki / "__init__.py").is_file()
        assert not list(folder.rglob("__pycache__")), "the import check must not leave bytecode in the build"
        assert {p.name for p in folder.iterdir()} == {"__init__.py", "_attention.py", "_ops.py", "layers.py",
                                                      "_nki", "metadata.json"}
    assert not (repo / "build" / ".staging").exists()


def test_clean_build_id_is_the_git_tree_of_the_inputs(built):
    repo, result = built
    assert not result.source.dirty
    entries = git(repo, "ls-tree", "HEAD", "build.toml", "kernels", "torch_ext")
    inputs_tree = subprocess.run(["git", "mktree"], cwd=repo, input=entries, capture_output=True, text=True,
                                 check=True).stdout.strip()
    assert result.source.tree_hash == inputs_tree
    assert result.variant_ids["torch-cpu"].endswith("_" + inputs_tree[:7])


def test_card_lists_the_api_and_the_kernel_limits(built):
    repo, result = built
    card = (repo / "build" / "CARD.md").read_text()
    assert card.startswith("---\nlibrary_name: kernels\nlicense: apache-2.0\n")
    assert 'get_kernel("org/neuron-vit-attn", version=1, trust_remote_code=True)' in card
    assert 'attn_implementation="org/neuron-vit-attn"' in card and 'device_map="neuron"' in card
    for function in ("attention", "flash_attn_forward"):
        assert f"### `{function}(" in card
    assert "`supports_flash_attn = True`" in card
    assert "- `layers.ToyAttention`: Toy stateless layer." in card
    assert "Supports float32 and bfloat16, head_dim <= 128." in card     # from the kernel's docstring
    assert "not shown on the card" not in card                          # helper modules stay off the card
    assert "No benchmark report in this build" in card
    assert result.source.tree_hash in card


def test_rebuild_is_byte_identical_and_repo_id_and_bench_reach_the_card(built, tmp_path):
    first_repo, _ = built
    repo = make_minirepo(tmp_path / "repo")      # same sources as the fixture's repo, built elsewhere
    (repo / "build" / "torch-cpu").mkdir(parents=True)
    (repo / "build" / "torch-cpu" / "stale.py").write_text("left over from an older build")
    (repo / "bench" / "out").mkdir(parents=True)
    (repo / "bench" / "out" / "report.md").write_text(
        "# Attention benchmarks\n\n![plot](plot.png)\n\n| shape | est. us (trn2) |\n|---|---|\n| 197 | 12.5 |\n")
    build(repo, repo_id="someone/vit-attn", log=_quiet)
    for variant in ("torch-neuron", "torch-cpu"):
        assert _snapshot(repo / "build" / variant) == _snapshot(first_repo / "build" / variant)
    card = (repo / "build" / "CARD.md").read_text()
    assert 'get_kernel("someone/vit-attn", version=1' in card and "org/neuron-vit-attn" not in card
    assert "### Attention benchmarks" in card and "| 197 | 12.5 |" in card and "plot.png" not in card


def test_uncommitted_sources_give_a_dirty_id(built, tmp_path):
    _, clean = built
    repo = make_minirepo(tmp_path / "repo")
    with open(repo / "kernels" / "attention.py", "a") as f:
        f.write("\n# edited\n")
    dirty = build(repo, log=_quiet)
    assert dirty.source.dirty and dirty.variant_ids["torch-neuron"].endswith("_dirty")
    assert dirty.source.tree_hash != clean.source.tree_hash
    meta = json.loads((repo / "build" / "torch-neuron" / "metadata.json").read_text())
    assert meta["id"] == dirty.variant_ids["torch-neuron"]


@pytest.mark.parametrize("file, text, message", [
    ("_attention.py", "from neuron_vit_attn import layers\n", "absolute import of 'neuron_vit_attn'"),
    ("_attention.py", "from kernels.attention import attention_fwd\n", "absolute import of 'kernels.attention'"),
    ("_attention.py", "import torch\nOPS = torch.ops._neuron_vit_attn_dev\n", "torch.ops._neuron_vit_attn_dev"),
    ("_attention.py", "NAME = '_neuron_vit_attn_dev::attention'\n", "names the op namespace"),
])
def test_static_checks_reject_non_relative_packages(tmp_path, file, text, message):
    repo = make_minirepo(tmp_path / "repo")
    with open(repo / "torch_ext" / "neuron_vit_attn" / file, "a") as f:
        f.write(text)
    with pytest.raises(BuildCheckError, match=message):
        build(repo, log=_quiet)
    assert not (repo / "build").exists() or not list((repo / "build").iterdir()), \
        "a failed check must leave neither a variant nor its staging folder behind"


def test_incomplete_all_is_rejected(tmp_path):
    repo = make_minirepo(tmp_path / "repo")
    init = repo / "torch_ext" / "neuron_vit_attn" / "__init__.py"
    init.write_text(init.read_text().replace('"flash_attn_forward", ', "") + "\n\ndef helper():\n    pass\n")
    with pytest.raises(BuildCheckError) as failure:
        build(repo, log=_quiet)
    assert "'helper' is public and defined in the package but missing from __all__" in str(failure.value)
    assert "required public name 'flash_attn_forward' is not in __all__" in str(failure.value)


def test_ops_file_with_extra_names_is_rejected(tmp_path):
    repo = make_minirepo(tmp_path / "repo")
    with open(repo / "torch_ext" / "neuron_vit_attn" / "_ops.py", "a") as f:
        f.write("\nDEVICE = 'neuron'\n")
    with pytest.raises(BuildError, match=r"defines \['DEVICE'\]"):
        build(repo, log=_quiet)


def test_cli_reports_a_missing_kernel(tmp_path, capsys):
    repo = make_minirepo(tmp_path / "repo")
    (repo / "kernels" / "attention.py").unlink()
    assert hub_build.main(["--repo-root", str(repo)]) == 1
    assert "kernels/attention.py not found" in capsys.readouterr().err
