"""nkisim test configuration: every test starts on trn2 (helpers live in nkisim_helpers.py)."""

import pytest

import nkisim

nkisim.install()


@pytest.fixture(autouse=True)
def default_target(monkeypatch):
    """Every test starts on trn2 in precise-FP mode unless it sets the variables itself."""
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    monkeypatch.delenv("NKI_PRECISE_FP", raising=False)
