"""Constants shared by the Hub tests and their conftest."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
REPO_ID = "org/neuron-vit-attn"      # build.toml's default repo id, mapped to the session build by LOCAL_KERNELS
