"""Constants and helpers shared by the Hub tests and their conftest."""

import types
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
REPO_ID = "org/neuron-vit-attn"      # build.toml's default repo id, mapped to the session build by LOCAL_KERNELS


def fake_torch_neuron(monkeypatch) -> None:
    """Make kernels detect a Neuron host for this test: a ``torch.neuron`` module whose ``is_available()`` is
    False (True would route every CPU torch.compile to a Neuron backend that is not there)."""
    fake = types.ModuleType("neuron")
    fake.is_available = lambda: False
    monkeypatch.setattr(torch, "neuron", fake, raising=False)
