"""Fixtures for the Hub tests: the real package built once per session, LOCAL_KERNELS pointing at it, and a
simulated Neuron host.

How the Neuron path is exercised without Trainium: kernels picks ``build/torch-neuron`` when ``torch.neuron``
exists, so the fixture sets a fake ``torch.neuron`` module (``is_available()`` False, which keeps torch.compile on
CPU working) for the test only. On that simulated host nkisim stands in for ``nki`` (``nkisim.install()``, which
also satisfies the variant's ``python-depends: ["nki"]``) and ``NEURON_VIT_ATTN_BACKEND=sim`` makes the loaded
torch-neuron package run its NKI kernel through nkisim on the CPU tensors, so every instruction it executes shows in
``nkisim.trace()``. Real ``neuron`` tensors would need TorchNeuron's PrivateUse1 device, which cannot be undone in a
process; the op's device registration is covered by tests/ops.
"""

from __future__ import annotations

import huggingface_hub.constants
import pytest
from hub_env import REPO_ID, REPO_ROOT, fake_torch_neuron

from hubtools.build import build


@pytest.fixture(scope="session")
def hub_build(tmp_path_factory):
    """(folder whose build/ holds the artifact, BuildResult) for this checkout's sources."""
    root = tmp_path_factory.mktemp("hub")
    return root, build(REPO_ROOT, out_dir=root / "build", log=lambda *_: None)


@pytest.fixture
def local_hub(hub_build, monkeypatch):
    """``org/neuron-vit-attn`` resolves to the session build, offline; default backend. Returns the BuildResult."""
    root, result = hub_build
    monkeypatch.setenv("LOCAL_KERNELS", f"{REPO_ID}={root}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.delenv("NEURON_VIT_ATTN_BACKEND", raising=False)
    return result


@pytest.fixture
def neuron_host(monkeypatch):
    """A simulated Neuron host (see the module docstring)."""
    import nkisim

    fake_torch_neuron(monkeypatch)
    nkisim.install()
    monkeypatch.setenv("NEURON_VIT_ATTN_BACKEND", "sim")
