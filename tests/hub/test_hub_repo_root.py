"""The repo's NKI source folder ``kernels/`` must never shadow Hugging Face's ``kernels`` library
(ARCHITECTURE.md pitfalls): Python started from the repo root has the root first on sys.path."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_import_kernels_from_repo_root_is_the_hub_library():
    code = "import kernels; print(kernels.get_kernel.__module__)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("kernels."), result.stdout
    assert not (REPO / "kernels" / "__init__.py").exists(), "kernels/__init__.py would shadow the kernels library"
