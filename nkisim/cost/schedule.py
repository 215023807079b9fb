"""List scheduling of a trace: each engine in program order, dependencies through memory.

Algorithm (one pass over the trace, per logical-core program, since LNC programs run on
different physical cores):

1. Dependencies. For every operand the scheduler looks up earlier accesses of the same storage
   whose footprints overlap (``regions.overlap``): read-after-write, write-after-read and
   write-after-write, on SBUF, PSUM and HBM alike. An instruction may start when all of them have
   finished. A write that covers an earlier access's box retires that access from the lookup
   lists (anything later that depends on it also depends on the covering write).
2. Engines. VectorE, ScalarE and GpSimdE run their instructions one at a time in program order;
   on trn1 VectorE and GpSimdE also take turns on SBUF, VectorE and ScalarE on PSUM.
   TensorE issues in program order; with PE tiling (``tile_position``/``tile_size``) matmuls on
   disjoint 32x32 blocks of the array run concurrently (nki-reference.md 2.1), otherwise a matmul
   holds the whole array. DMA transfers go to one of three in-order issue queues (loads
   HBM->SBUF, stores SBUF->HBM, other copies; MODEL: the issue order of a queue is program order,
   transfers in flight overlap) and share the 16 DMA engines (``dma.EnginePool``); a ``dge_mode=hwdge``
   transfer also waits for one of the two hardware DGE blocks (trn2+).
3. Capacity: an SBUF/PSUM allocation needs room before its first use (``memory``), so engines
   cannot run further ahead than the usable SBUF and PSUM allow.
4. Overheads (nki-reference.md 4.3b): a compute instruction that had to wait for a dependency
   (its engine was idle) or that reads what the previous instruction on its engine just wrote
   pays the ~100-cycle static overhead once; TensorE pays it only when it stalled.

The estimate is the makespan. The critical path is recovered by walking back from the last
instruction to finish through whatever bound each start: a dependency, the engine's previous
instruction, or (DMA) the queue and the engine pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import constants as C
from . import dma as dma_mod
from . import engines as eng
from .memory import OnChipMemory
from .regions import covers, overlap

COMPUTE_ENGINES = ("tensor", "vector", "scalar", "gpsimd")
EPS = 1e-9


@dataclass
class Slot:
    """Where one instruction landed in the schedule (times in ns from kernel start)."""

    instr: object
    start: float
    end: float
    pred: int | None          # index in the schedule of what bound the start (None: kernel start)
    waited_on: str            # "dependency", "memory", "engine", "queue", "dge", "dma engines", "start"


@dataclass
class ProgramSchedule:
    slots: list = field(default_factory=list)
    busy: dict = field(default_factory=dict)        # engine -> busy ns
    unknown: dict = field(default_factory=dict)     # instruction name -> count priced by the default

    @property
    def makespan(self) -> float:
        return max((s.end for s in self.slots), default=0.0)


class _Accesses:
    """Earlier reads and writes per storage, for dependency lookups."""

    def __init__(self):
        self.reads: dict = {}
        self.writes: dict = {}

    def ready(self, operand, end_of) -> tuple[float, int | None]:
        sid = operand.region[0]
        lists = [self.writes.get(sid, ())]
        if operand.write:
            lists.append(self.reads.get(sid, ()))
        best, who = 0.0, None
        for entries in lists:
            for other, slot in entries:
                t = end_of[slot]
                if t > best and overlap(operand, other):
                    best, who = t, slot
        return best, who

    def add(self, operand, slot: int) -> None:
        sid = operand.region[0]
        if operand.write:
            for table in (self.reads, self.writes):
                entries = table.get(sid)
                if entries:
                    table[sid] = [(o, s) for o, s in entries if not covers(operand, o)]
            self.writes.setdefault(sid, []).append((operand, slot))
        else:
            self.reads.setdefault(sid, []).append((operand, slot))


def schedule_program(instructions, target) -> ProgramSchedule:
    """Schedule one program's instructions (trace order) on ``target`` (a ``constants.TargetCost``)."""
    return _Scheduler(instructions, target).run()


class _Scheduler:
    def __init__(self, instructions, target):
        self.instructions = instructions
        self.target = target
        self.sched = ProgramSchedule()
        self.accesses = _Accesses()
        self.memory = OnChipMemory(instructions, target.name)
        self.ends: list[float] = []
        self.engine_free: dict = {}             # vector/scalar/gpsimd/... -> free time
        self.engine_last: dict = {}             # engine -> slot index of its previous instruction
        grid = 128 // C.PE_BLOCK
        self.pe_free = {(r, c): (0.0, None) for r in range(grid) for c in range(grid)}
        self.pe_last_start = 0.0
        self.tensor_intervals: list = []
        self.pool = dma_mod.EnginePool()
        self.queue_last: dict = {}              # DMA queue -> (issue time, slot)
        self.dge_free = [(0.0, None)] * C.HWDGE_INSTANCES    # hardware DGE blocks -> (free time, slot)
        self.port_free: dict = {}               # trn1 shared SBUF/PSUM ports -> (free time, slot)
        self.busy = {e: 0.0 for e in COMPUTE_ENGINES}

    def run(self) -> ProgramSchedule:
        for instr in self.instructions:
            self._place(instr)
        self.busy["tensor"] = _union_length(self.tensor_intervals)
        self.busy["dma"] = max(self.pool.busy)
        self.sched.busy = self.busy
        return self.sched

    def _place(self, instr) -> None:
        index = len(self.sched.slots)
        ready, ready_slot = self.memory.allocate(index)       # room for allocations first used here
        memory_bound = ready_slot is not None
        raw_on_previous = False     # reads what the previous instruction of its engine wrote
        for operand in instr.operands:
            t, who = self.accesses.ready(operand, self.ends)
            if t > ready:
                ready, ready_slot, memory_bound = t, who, False
            if not operand.write and who is not None and who == self.engine_last.get(instr.engine):
                raw_on_previous = True
        if instr.engine == "dma":
            start, end, pred, waited = self._dma(instr, index, ready, ready_slot)
        elif instr.engine == "tensor":
            start, end, pred, waited = self._tensor(instr, index, ready, ready_slot)
        else:
            start, end, pred, waited = self._lane(instr, index, ready, ready_slot, raw_on_previous)
        if pred is None and start <= EPS and waited != "dma engines":
            waited = "start"
        elif waited == "dependency" and memory_bound:
            waited = "memory"
        self.sched.slots.append(Slot(instr, start, end, pred, waited))
        self.ends.append(end)
        self.engine_last[instr.engine] = index
        for operand in instr.operands:
            self.accesses.add(operand, index)
        self.memory.release(index, end)

    def _dma(self, instr, index, ready, ready_slot):
        """In-order issue on its queue, fixed latency, then its share on the engines it spans."""
        queue = dma_mod.direction(instr)
        q_time, q_slot = self.queue_last.get(queue, (0.0, None))
        issue, pred, waited = ready, ready_slot, "dependency"
        if q_time > issue:
            issue, pred, waited = q_time, q_slot, "queue"
        self.queue_last[queue] = (issue, index)
        if dma_mod.uses_hwdge(instr, self.target):      # descriptors from one of the hardware DGE blocks
            k = min(range(len(self.dge_free)), key=lambda i: self.dge_free[i][0])
            dge_time, dge_slot = self.dge_free[k]
            if dge_time > issue + EPS:
                issue, pred, waited = dge_time, dge_slot, "dge"
            self.dge_free[k] = (issue + C.HWDGE_FIXED_NS, index)
        n_engines, share = dma_mod.engine_share_ns(instr, self.target)
        data_from = issue + dma_mod.fixed_latency_ns(instr, self.target)
        first, end = self.pool.place(n_engines, data_from, share)
        if first > data_from + EPS:
            waited = "dma engines"
        return issue, end, pred, waited

    def _tensor(self, instr, index, ready, ready_slot):
        """In-order issue; runs when its PE blocks (the whole array unless PE-tiled) are free."""
        blocks = eng.pe_blocks(instr)
        block_free, block_slot = max((self.pe_free[b] for b in blocks), key=lambda x: x[0])
        free = max(block_free, self.pe_last_start)
        cycles, known = eng.compute_cycles(instr, self.target)
        if ready > free + EPS:
            start, pred, waited = ready, ready_slot, "dependency"
            cycles += C.STATIC_OVERHEAD_CYCLES
        else:
            pred = block_slot if block_free >= self.pe_last_start else self.engine_last.get("tensor")
            start, waited = free, "engine"
        end = start + cycles / self.target.clock_ghz("tensor")
        for b in blocks:
            self.pe_free[b] = (end, index)
        self.pe_last_start = start
        self.tensor_intervals.append((start, end))
        self._count_unknown(instr, known)
        return start, end, pred, waited

    def _lane(self, instr, index, ready, ready_slot, raw_on_previous):
        """VectorE, ScalarE, GpSimdE (and any engine new to the model): one at a time, in order."""
        engine = instr.engine
        cycles, known = eng.compute_cycles(instr, self.target)
        free, free_slot = self.engine_free.get(engine, 0.0), self.engine_last.get(engine)
        ports = _shared_ports(instr, self.target)
        for port in ports:
            if self.port_free.get(port, (0.0, None))[0] > free:
                free, free_slot = self.port_free[port]
        if ready > free + EPS:
            start, pred, waited = ready, ready_slot, "dependency"
            cycles += C.STATIC_OVERHEAD_CYCLES
        else:
            start, pred, waited = free, free_slot, "engine"
            if raw_on_previous:
                cycles += C.STATIC_OVERHEAD_CYCLES
        end = start + cycles / self.target.clock_ghz(engine)
        self.engine_free[engine] = end
        for port in ports:
            self.port_free[port] = (end, index)
        self.busy[engine] = self.busy.get(engine, 0.0) + end - start
        self._count_unknown(instr, known and engine in COMPUTE_ENGINES)
        return start, end, pred, waited

    def _count_unknown(self, instr, known: bool) -> None:
        if not known:
            self.sched.unknown[instr.name] = self.sched.unknown.get(instr.name, 0) + 1


# NeuronCore-v2 (trn1) only: VectorE and GpSimdE cannot access SBUF at the same time, VectorE and
# ScalarE cannot access PSUM at the same time (nki-reference.md 3; lifted on v3+).
SHARED_PORTS_V2 = {("vector", "sbuf"): "sbuf:vector+gpsimd", ("gpsimd", "sbuf"): "sbuf:vector+gpsimd",
                   ("vector", "psum"): "psum:vector+scalar", ("scalar", "psum"): "psum:vector+scalar"}


def _shared_ports(instr, target) -> set:
    if target.nc_version >= 3:
        return set()
    return {SHARED_PORTS_V2[(instr.engine, o.buffer)] for o in instr.operands
            if (instr.engine, o.buffer) in SHARED_PORTS_V2}


def _union_length(intervals) -> float:
    total, cur_start, cur_end = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_end is None or s > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def critical_path(sched: ProgramSchedule) -> list:
    """Slots on the critical path, first to last."""
    if not sched.slots:
        return []
    i = max(range(len(sched.slots)), key=lambda k: sched.slots[k].end)
    path, seen = [], set()
    while i is not None and i not in seen:
        seen.add(i)
        path.append(sched.slots[i])
        i = sched.slots[i].pred
    return path[::-1]
