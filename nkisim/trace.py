"""Instruction trace: what a kernel executed, for tests and for the cost model.

``with nkisim.trace() as t:`` records every instruction executed inside the block, including
kernels that a torch op runs through nkisim. Each :class:`Instruction` carries what the cost
model needs: engine, operand shapes/dtypes/buffers/memory regions, elements per partition and
bytes moved. ``t.estimate(target)`` turns the trace into a time estimate (``nkisim.cost``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from . import dtypes as dt
from .cost.regions import storage_box


@dataclass(frozen=True)
class Operand:
    role: str             # "dst", "data", "stationary", "moving", "src", "bias", ...
    shape: tuple
    dtype: str
    buffer: str           # sbuf | psum | hbm | shared_hbm | private_hbm
    partitions: int       # partition count (1 for HBM)
    free_elems: int       # elements per partition (all elements for HBM)
    nbytes: int           # bytes the operand covers
    inner_stride: int     # innermost free-dim stride, in elements (1 = unit stride)
    region: tuple         # (storage id, p0, p1, free byte lo, free byte hi) for dependencies
    write: bool           # True for destinations
    # For the cost model (nkisim.cost): the box in storage coordinates ((lo, hi) per allocation dim,
    # None when the view is not a box), the bytes of the innermost contiguous run (DMA efficiency)
    # and the allocation's bytes per partition (on-chip capacity; 0 for HBM).
    box: tuple | None = None
    contiguous_bytes: int = 0
    storage_bytes: int = 0

    @classmethod
    def of(cls, role: str, tensor, write: bool = False) -> "Operand":
        pattern = tensor.free_pattern()
        return cls(role=role, shape=tensor.shape, dtype=dt.name(tensor.dtype), buffer=tensor.buffer,
                   partitions=tensor.partitions, free_elems=tensor.free_size,
                   nbytes=tensor.size * tensor.itemsize, inner_stride=abs(pattern[-1][0]),
                   region=tensor.region(), write=write, box=storage_box(tensor),
                   contiguous_bytes=(pattern[-1][1] if abs(pattern[-1][0]) == 1 else 1) * tensor.itemsize,
                   storage_bytes=tensor.storage.bytes_per_partition if tensor.on_chip else 0)


@dataclass
class Instruction:
    """One executed NKI instruction (``nki.isa`` call, or one lowered from ``nki.language``)."""

    index: int
    name: str                     # e.g. "nc_matmul"
    engine: str                   # tensor | vector | scalar | gpsimd | dma
    operands: list = field(default_factory=list)
    attrs: dict = field(default_factory=dict)   # op names, accumulate, is_transpose, ...
    label: str | None = None      # the ``name=`` argument of the call
    program_id: int = 0

    @property
    def reads(self) -> list:
        return [o for o in self.operands if not o.write]

    @property
    def writes(self) -> list:
        return [o for o in self.operands if o.write]

    def operand(self, role: str) -> Operand:
        for o in self.operands:
            if o.role == role:
                return o
        raise KeyError(f"{self.name} has no operand {role!r}; it has {[o.role for o in self.operands]}")

    @property
    def elements(self) -> int:
        """Elements per partition processed: the N of the cost formulas (largest input)."""
        ins = self.reads or self.operands
        return max((o.free_elems for o in ins), default=0)

    @property
    def bytes_moved(self) -> int:
        """DMA bytes (destination size); 0 for compute instructions."""
        return self.operand("dst").nbytes if self.engine == "dma" else 0

    def depends_on(self, *others) -> "Instruction":
        """NKI's scheduling hint (``instr.depends_on(other)``); nkisim executes in program order, so
        the edge is recorded in ``attrs['depends_on']`` and otherwise has no effect."""
        self.attrs.setdefault("depends_on", []).extend(getattr(o, "index", None) for o in others)
        return self

    def __repr__(self):
        ops = ", ".join(f"{o.role}={o.buffer}{list(o.shape)}:{o.dtype}" for o in self.operands)
        return f"<{self.index} {self.engine}.{self.name}({ops})>"


class Trace:
    """Instructions recorded while the ``nkisim.trace()`` block ran."""

    def __init__(self):
        self.instructions: list[Instruction] = []

    def __len__(self):
        return len(self.instructions)

    def __iter__(self):
        return iter(self.instructions)

    def names(self) -> list[str]:
        return [i.name for i in self.instructions]

    def count(self, name: str) -> int:
        return sum(1 for i in self.instructions if i.name == name)

    def estimate(self, target: str = "trn2"):
        """Estimated time of the recorded instructions on ``target`` (see ``nkisim.cost``)."""
        from .cost import estimate
        return estimate(self.instructions, target=target)


_active: list[Trace] = []


@contextlib.contextmanager
def trace():
    """Record every instruction executed inside the block."""
    t = Trace()
    _active.append(t)
    try:
        yield t
    finally:
        _active.remove(t)


def record(instruction: Instruction) -> None:
    for t in _active:
        t.instructions.append(instruction)
