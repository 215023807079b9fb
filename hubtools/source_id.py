"""The source identity of a build: a git tree hash over the build inputs, and whether they are dirty.

Algorithm: list the input files (``git ls-files --cached --others --exclude-standard``, so ignored files such
as ``__pycache__`` never count), read them from the working tree, and hash them exactly as git hashes a tree
(blobs ``blob <len>\\0<data>``, trees of ``<mode> <name>\\0<20-byte sha>`` entries in git's order, symlinks as
blobs of their target). For a clean checkout the result equals the tree git stores for those paths, so the id
names committed sources; uncommitted edits give a different hash and the ``dirty`` flag.
Without git (a source tarball) the files are walked directly and the build counts as dirty, since no commit
identifies it. Limits: git's clean/smudge filters (autocrlf, LFS) are not applied.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

SHORT_HASH_LEN = 7
_IGNORED_PARTS = ("__pycache__",)
_IGNORED_SUFFIXES = (".pyc", ".pyo")


@dataclass(frozen=True)
class SourceId:
    tree_hash: str     # 40 hex digits
    dirty: bool

    @property
    def short(self) -> str:
        """The id suffix used in module names: 7 hex digits, plus ``_dirty`` for uncommitted sources."""
        return self.tree_hash[:SHORT_HASH_LEN] + ("_dirty" if self.dirty else "")


def _git(repo_root: Path, *args: str) -> str | None:
    try:
        result = subprocess.run(["git", *args], cwd=repo_root, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return result.stdout


def _walk(repo_root: Path, inputs: list[str]) -> list[str]:
    files = []
    for top in inputs:
        path = repo_root / top
        if path.is_file() or path.is_symlink():
            files.append(top)
            continue
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if d not in _IGNORED_PARTS)
            # git records a symlink to a folder as one entry and does not follow it; so does this walk
            filenames += [d for d in dirnames if (Path(dirpath) / d).is_symlink()]
            for name in filenames:
                if not name.endswith(_IGNORED_SUFFIXES):
                    files.append((Path(dirpath) / name).relative_to(repo_root).as_posix())
    return files


def _blob_entry(path: Path) -> tuple[str, bytes]:
    if path.is_symlink():
        mode, data = "120000", os.readlink(path).encode()
    else:
        mode = "100755" if path.stat().st_mode & stat.S_IXUSR else "100644"
        data = path.read_bytes()
    return mode, hashlib.sha1(b"blob %d\0" % len(data) + data).digest()


def _tree_hash(node: dict) -> bytes:
    """node maps name -> (mode, sha) for blobs or name -> dict for subtrees."""
    entries = []
    for name, child in node.items():
        if isinstance(child, dict):
            entries.append((name + "/", b"40000 " + name.encode() + b"\0" + _tree_hash(child)))
        else:
            mode, sha = child
            entries.append((name, mode.encode() + b" " + name.encode() + b"\0" + sha))
    body = b"".join(entry for _, entry in sorted(entries))   # git orders a directory as if named "name/"
    return hashlib.sha1(b"tree %d\0" % len(body) + body).digest()


def tree_hash(repo_root: Path, files: list[str]) -> str:
    """Git tree hash of ``files`` (repo-relative POSIX paths) as they are in the working tree."""
    root: dict = {}
    for rel in files:
        *dirs, name = rel.split("/")
        node = root
        for d in dirs:
            node = node.setdefault(d, {})
        node[name] = _blob_entry(repo_root / rel)
    return _tree_hash(root).hex()


def list_inputs(repo_root: Path, inputs: list[str]) -> tuple[list[str], bool]:
    """Sorted repo-relative files under ``inputs`` that git would commit (tracked, or untracked and not
    ignored), and whether git answered. Files deleted from the working tree are left out."""
    listed = _git(repo_root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *inputs)
    if listed is None:
        return sorted(_walk(repo_root, inputs)), False
    return sorted(f for f in set(listed.split("\0")) if f and os.path.lexists(repo_root / f)), True


def source_id(repo_root: Path, inputs: list[str], listed: tuple[list[str], bool] | None = None) -> SourceId:
    """Identity of the build inputs (repo-relative files or folders) in ``repo_root``; ``listed`` is
    :func:`list_inputs`' answer when the caller already has it."""
    files, in_git = listed or list_inputs(repo_root, inputs)
    if not in_git:
        return SourceId(tree_hash(repo_root, files), dirty=True)
    status = _git(repo_root, "status", "--porcelain", "--", *inputs)
    return SourceId(tree_hash(repo_root, files), dirty=bool(status and status.strip()))
