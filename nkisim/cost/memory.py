"""On-chip capacity over time: an SBUF or PSUM allocation needs room before its first use.

nkisim's capacity check (runtime.py) proves that the kernel fits in program order: an allocation
is live from its first to its last use. In the estimated schedule, engines run ahead of program
order (a load into a fresh tile can start long before the compute that frees an older one), so
the model also bounds that: when an instruction touches an allocation for the first time, the
allocation's bytes per partition must fit next to everything allocated before it and not yet
released; releases happen when the last instruction touching an allocation finishes (this is the
compiler reusing the address). If it does not fit, the instruction waits for the earliest
releases that make room. Capacities are the target's usable SBUF and PSUM bytes per partition
(nkisim/target.py, nki-reference.md 2.9).

Limit: an allocation made to wait frees its room in the bookkeeping at that later time for every
instruction scheduled after it, also ones that end up starting earlier on another engine; this
errs on the optimistic side in rare interleavings.
"""

from __future__ import annotations

import heapq

ON_CHIP = ("sbuf", "psum")


class OnChipMemory:
    def __init__(self, instructions, target_name: str):
        from ..target import TARGETS
        limits = TARGETS[target_name]
        self.capacity = {"sbuf": limits.sbuf_bytes_per_partition, "psum": limits.psum_bytes_per_partition}
        spans: dict = {}
        for index, instr in enumerate(instructions):
            for o in instr.operands:
                if o.buffer in ON_CHIP and o.storage_bytes:
                    span = spans.setdefault(o.region[0], [index, index, o.buffer, o.storage_bytes])
                    span[1] = index
        self.first: dict = {}
        self.last: dict = {}
        for first, last, buffer, size in spans.values():
            self.first.setdefault(first, []).append((buffer, size))
            self.last.setdefault(last, []).append((buffer, size))
        self.in_use = {b: 0 for b in ON_CHIP}
        self.releases = {b: [] for b in ON_CHIP}     # heaps of (release time, bytes, slot)

    def allocate(self, index: int) -> tuple[float, int | None]:
        """(earliest time the allocations first used by instruction ``index`` fit, the slot whose
        release made the last room or None)."""
        ready, who = 0.0, None
        for buffer, size in self.first.get(index, ()):
            heap = self.releases[buffer]
            while self.in_use[buffer] + size > self.capacity[buffer] and heap:
                t, freed, slot = heapq.heappop(heap)
                self.in_use[buffer] -= freed
                if t > ready:
                    ready, who = t, slot
            self.in_use[buffer] += size
        return ready, who

    def release(self, index: int, end: float) -> None:
        """Instruction ``index`` finished at ``end``: allocations it used last are free from then."""
        for buffer, size in self.last.get(index, ()):
            heapq.heappush(self.releases[buffer], (end, size, index))
