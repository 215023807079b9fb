"""``nki.collectives`` in nkisim: importable, not simulated.

Multi-device collectives (``all_reduce``, ``all_gather``, ``collective_permute``...) need more than
one NeuronCore device; nkisim simulates one launch on one (logical) core, so every collective
raises :class:`nkisim.errors.NotSimulatedError` when called.
"""

from __future__ import annotations

from .errors import NotSimulatedError


def __getattr__(name):  # PEP 562
    if name.startswith("__"):
        raise AttributeError(name)

    def collective(*args, **kwargs):
        raise NotSimulatedError(f"nki.collectives.{name} is not simulated by nkisim (single-device interpreter)")
    collective.__name__ = name
    return collective
