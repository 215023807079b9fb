import pytest

from neuron_vit_attn import _validation


@pytest.fixture(autouse=True)
def default_backend(monkeypatch):
    """Every test starts from the default backend and with no one-time warning spent."""
    monkeypatch.delenv("NEURON_VIT_ATTN_BACKEND", raising=False)
    monkeypatch.setattr(_validation, "_warned", set())


@pytest.fixture
def backend(monkeypatch):
    def select(value: str):
        monkeypatch.setenv("NEURON_VIT_ATTN_BACKEND", value)
    return select
