"""Enums of ``nki.isa`` with the values of NKI 0.6 (nki-reference.md section 2)."""

from enum import IntEnum


class engine(IntEnum):  # noqa: N801 - NKI's names
    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


class reduce_cmd(IntEnum):  # noqa: N801
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(IntEnum):  # noqa: N801
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(IntEnum):  # noqa: N801
    error = 0
    skip = 1


class matmul_perf_mode(IntEnum):  # noqa: N801
    none = 0
    double_row = 1


class nc_version(IntEnum):  # noqa: N801
    gen2 = 2
    gen3 = 3
    gen4 = 4


class dma_engine(IntEnum):  # noqa: N801
    dma = 0
    gpsimd_dma = 1
