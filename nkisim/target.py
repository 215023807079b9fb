"""The Trainium generation a kernel is simulated for, and its per-target limits.

Selected like the real NKI compiler does, from ``NEURON_PLATFORM_TARGET_OVERRIDE``
(``trn1``/``inf2``/``gen2``, ``trn2``/``gen3``, ``trn3``/``gen4``); nkisim defaults to trn2,
the generation this project tunes for. Numbers: nki-reference.md sections 2.1, 2.9 and 3.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import TargetError

ENV_VAR = "NEURON_PLATFORM_TARGET_OVERRIDE"
DEFAULT = "trn2"


@dataclass(frozen=True)
class Target:
    name: str                 # trn1 | trn2 | trn3
    nc_version: int           # NeuronCore version: 2, 3, 4
    sbuf_bytes_per_partition: int   # usable SBUF per partition (NKIPY HardwareConstants.h)
    psum_bytes_per_partition: int = 16384
    psum_bank_bytes: int = 2048
    psum_banks: int = 8
    pmax: int = 128
    gemm_stationary_fmax: int = 128

    def gemm_moving_fmax(self, dst_itemsize: int = 4) -> int:
        """Largest matmul moving free size: one PSUM bank on v2/v3; all 8 banks on v4."""
        if self.nc_version >= 4:
            return 8192 if dst_itemsize == 2 else 4096
        return 512


TARGETS = {
    "trn1": Target("trn1", 2, 180224),
    "trn2": Target("trn2", 3, 212984),
    "trn3": Target("trn3", 4, 245752),
}
ALIASES = {"trn1": "trn1", "inf2": "trn1", "gen2": "trn1", "trn2": "trn2", "gen3": "trn2",
           "trn3": "trn3", "gen4": "trn3"}


def get(name: str | None = None) -> Target:
    """The target named, or the one the environment selects (default trn2)."""
    raw = name if name is not None else os.environ.get(ENV_VAR, DEFAULT)
    key = ALIASES.get(str(raw).strip().lower())
    if key is None:
        raise TargetError(f"unknown target {raw!r} (from {ENV_VAR} or target=): use one of "
                          f"{', '.join(sorted(ALIASES))}")
    return TARGETS[key]
