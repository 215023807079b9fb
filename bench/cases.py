"""What the benchmarks run: the real model attention shapes and the kernels to time.

Kernels are discovered, not imported at module level: ``kernels/attention.py`` (``attention_fwd``)
is imported after ``nkisim.install()`` as the op layer imports it, ``neuron_vit_attn._nki.attention``
(``torch_ext/neuron_vit_attn/_nki`` links to ``kernels/``, whose modules import each other relatively;
``kernels/`` itself is NKI source, not a package), and the benchmark falls back to the nkisim matmul
example while it does not exist.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import nkisim

ROOT = Path(__file__).resolve().parent.parent
ATTENTION_SOURCE = ROOT / "kernels" / "attention.py"
TORCH_EXT = ROOT / "torch_ext"             # holds the neuron_vit_attn package
TARGETS = ("trn1", "trn2", "trn3")
PRIMARY_TARGET = "trn2"
BATCHES = (1, 8)


@dataclass(frozen=True)
class AttentionShape:
    model: str
    seq: int        # tokens (queries = keys: vision encoders attend bidirectionally)
    heads: int
    head_dim: int

    def label(self, batch: int) -> str:
        return f"{self.model} B={batch}"


# (tokens incl. CLS, heads, head dim) of the vision towers the project targets.
MODELS = (
    AttentionShape("ViT-B/16", 197, 12, 64),          # 224 / 16 = 14 -> 196 patches + CLS
    AttentionShape("ViT-L/14@336", 577, 16, 64),      # 336 / 14 = 24 -> 576 + CLS
    AttentionShape("SigLIP-so400m", 729, 16, 72),     # 384 / 14 = 27 -> 729, no CLS
    AttentionShape("DINOv2-B/14", 257, 12, 64),       # 224 / 14 = 16 -> 256 + CLS
    AttentionShape("CLIP-B/32", 50, 12, 64),          # 224 / 32 = 7 -> 49 + CLS
)


def attention_flops(batch: int, shape: AttentionShape) -> int:
    """QK^T and PV: 2 matmuls of 2 * S * S * D FLOPs per batch and head."""
    return 4 * batch * shape.heads * shape.seq * shape.seq * shape.head_dim


def attention_bytes(batch: int, shape: AttentionShape, itemsize: int = 2) -> int:
    """The issue's memory bound: q, k, v read once and o written once."""
    return 4 * batch * shape.seq * shape.heads * shape.head_dim * itemsize


def load_attention_kernel():
    """``attention_fwd`` from kernels/attention.py, or None while that file does not exist."""
    if not ATTENTION_SOURCE.exists():
        return None
    nkisim.install()
    if str(TORCH_EXT) not in sys.path:
        sys.path.insert(0, str(TORCH_EXT))
    from neuron_vit_attn._nki import attention
    return attention.attention_fwd


def neuron_device_available() -> bool:
    """True on a host whose torch has a usable Neuron device (torch-neuronx / TorchNeuron)."""
    import torch
    neuron = getattr(torch, "neuron", None)
    try:
        return bool(neuron is not None and neuron.is_available())
    except Exception:       # a half-installed backend counts as absent
        return False
