"""A throwaway source repository with the layout `make build` expects, for testing the build itself.

A toy package (the real one's required API, trivial bodies) and a toy NKI module, committed with git so that
the build id can be compared with the tree git stores. Tests edit files in it to make the checks fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

PACKAGE_INIT = '''"""Toy package with the public API the build requires."""

from . import layers
from ._attention import attention, flash_attn_forward

supports_flash_attn = True

__all__ = ["attention", "flash_attn_forward", "layers", "supports_flash_attn"]
'''

PACKAGE_ATTENTION = '''"""Toy attention entry points."""

import torch

from ._ops import add_op_namespace_prefix


def attention(query, key, value):
    """Toy attention: returns the query."""
    return query


def flash_attn_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Toy Transformers entry point."""
    return query.transpose(1, 2).contiguous(), None


OP_NAME = add_op_namespace_prefix("toy")
'''

PACKAGE_OPS = '''"""Dev op namespace (the build rewrites this file)."""

import torch

_OPS_NAME = "_neuron_vit_attn_dev"

ops = getattr(torch.ops, _OPS_NAME)


def add_op_namespace_prefix(op_name: str) -> str:
    return f"{_OPS_NAME}::{op_name}"
'''

PACKAGE_LAYERS = '''"""Toy layers."""

import torch.nn as nn

__all__ = ["ToyAttention"]


class ToyAttention(nn.Module):
    """Toy stateless layer."""

    def forward(self, hidden_states):
        return hidden_states
'''

KERNEL = '''"""Toy NKI attention kernel. Supports float32 and bfloat16, head_dim <= 128."""

import nki


@nki.jit
def attention_fwd(q, k, v):
    return q
'''

KERNEL_HELPER = '''"""Toy helper module of the kernel: internals, not shown on the card."""
'''


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True, env=env).stdout


def make_minirepo(root: Path) -> Path:
    """Write and commit the toy repository under ``root``; returns ``root``."""
    package = root / "torch_ext" / "neuron_vit_attn"
    package.mkdir(parents=True)
    (root / "kernels").mkdir()
    shutil.copy(REPO_ROOT / "build.toml", root / "build.toml")
    for name, text in {"__init__.py": PACKAGE_INIT, "_attention.py": PACKAGE_ATTENTION, "_ops.py": PACKAGE_OPS,
                       "layers.py": PACKAGE_LAYERS}.items():
        (package / name).write_text(text)
    (package / "_nki").symlink_to(Path("..") / ".." / "kernels")
    (root / "kernels" / "attention.py").write_text(KERNEL)
    (root / "kernels" / "attention_tiles.py").write_text(KERNEL_HELPER)
    (root / ".gitignore").write_text("build/\n__pycache__/\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "toy")
    return root
