"""The state of one simulated kernel launch: target, program id, allocations, liveness.

Instructions call :func:`begin` to get the running :class:`KernelRun` and :meth:`KernelRun.emit`
after they executed, which numbers the instruction, updates the liveness of every storage it
touched, keeps the PSUM accumulation state and appends it to the active traces.

Capacity (stricter than the official simulator, nki-reference.md section 4.1): after the kernel
returns, :meth:`KernelRun.check_capacity` sweeps the allocations: an SBUF or PSUM allocation is
live from the instruction that allocated it to the last instruction that touched it; the peak of
live bytes per partition must stay within the target's usable SBUF (trn2: 212984 B) and PSUM
(16 KiB = 8 banks x 2 KiB). Bytes are exact, not rounded to banks.
"""

from __future__ import annotations

import threading

from . import trace as trace_mod
from .errors import CapacityError, KernelError
from .target import Target
from .tensor import ON_CHIP, PSUM, SBUF, SHARED_HBM, NkiTensor, Storage


POLL_SECONDS = 0.02


class LncGroup:
    """What the programs of one launch share: shared_hbm allocations (the n-th allocation of every
    program is the same storage), the core barrier and the sendrecv mailboxes. Programs of an LNC=2
    launch run in two threads, like the official simulator; a program blocked on its partner fails
    as soon as the partner has finished or failed instead of hanging."""

    def __init__(self, num_programs: int):
        self.num_programs = num_programs
        self.shared_outputs: list[Storage] = []
        self.cond = threading.Condition()
        self.arrived = 0
        self.generation = 0
        self.mail: dict = {}
        self.done: set = set()

    def finish(self, program_id: int) -> None:
        with self.cond:
            self.done.add(program_id)
            self.cond.notify_all()

    def _wait(self, program_id: int, ready, what: str) -> None:
        while not ready():
            gone = self.done - {program_id}
            if gone:
                raise KernelError(f"{what}: program {program_id} waits for program {min(gone)}, which already "
                                  f"finished or failed; LNC programs need matching {what} calls")
            self.cond.wait(POLL_SECONDS)

    def barrier(self, program_id: int) -> None:
        with self.cond:
            generation = self.generation
            self.arrived += 1
            if self.arrived == self.num_programs:
                self.arrived, self.generation = 0, self.generation + 1
                self.cond.notify_all()
                return
            self._wait(program_id, lambda: self.generation != generation, "core_barrier")

    def exchange(self, program_id: int, pipe_id, send_to: int, recv_from: int, payload):
        """Post ``payload`` for ``send_to`` and return what ``recv_from`` posted for this program."""
        with self.cond:
            self.mail.setdefault((pipe_id, send_to, program_id), []).append(payload)
            self.cond.notify_all()
            key = (pipe_id, program_id, recv_from)
            self._wait(program_id, lambda: bool(self.mail.get(key)), "sendrecv")
            return self.mail[key].pop(0)


class KernelRun:
    def __init__(self, target: Target, program_id: int = 0, num_programs: int = 1, group: LncGroup | None = None):
        self.target = target
        self.program_id = program_id
        self.num_programs = num_programs
        self.storages: list[Storage] = []
        self.counter = 0
        self.group = group if group is not None else LncGroup(num_programs)
        self._shared_index = 0

    def allocate(self, shape, dtype, buffer: str, name: str = "") -> NkiTensor:
        if buffer == SHARED_HBM:
            n = self._shared_index
            self._shared_index += 1
            with self.group.cond:
                shared = self.group.shared_outputs
                if n < len(shared):
                    storage = shared[n]
                    if storage.shape != tuple(shape) or storage.dtype != dtype:
                        raise KernelError(f"shared_hbm allocation #{n} differs between programs: {storage.shape} "
                                          f"{storage.dtype} vs {tuple(shape)} {dtype}; LNC programs need identical "
                                          f"control flow")
                    return NkiTensor(storage)
                storage = Storage(buffer, shape, dtype, name)
                shared.append(storage)
        else:
            storage = Storage(buffer, shape, dtype, name)
        storage.alloc_index = storage.last_use = self.counter
        self.storages.append(storage)
        return NkiTensor(storage)

    def emit(self, name: str, engine: str, reads=(), writes=(), label=None, **attrs):
        """Record an executed instruction. ``reads``/``writes`` are ``(role, tensor)`` pairs."""
        self.counter += 1
        # Operand descriptions are only built when a trace is recording (they cost more than the
        # instruction itself for small tiles); the returned handle then has no operands.
        tracing = bool(trace_mod._active)
        operands = []
        for role, t in writes:
            if tracing:
                operands.append(trace_mod.Operand.of(role, t, write=True))
            self._touch(t, write=True, by_tensor_engine=(engine == "tensor"))
        for role, t in reads:
            if tracing:
                operands.append(trace_mod.Operand.of(role, t))
            self._touch(t, write=False, by_tensor_engine=(engine == "tensor"))
        instr = trace_mod.Instruction(self.counter, name, engine, operands, attrs, label, self.program_id)
        trace_mod.record(instr)
        return instr

    def _touch(self, t: NkiTensor, write: bool, by_tensor_engine: bool) -> None:
        t.storage.base.last_use = self.counter
        if t.buffer == PSUM and write:
            t.state_view(t.storage.initialized)[...] = True
        if t.buffer == PSUM and not by_tensor_engine:
            # Another engine touching PSUM closes the matmul accumulation group there; a write
            # also means the values are no longer a matmul result.
            t.state_view(t.storage.group_open)[...] = False
            if write:
                t.state_view(t.storage.mm_written)[...] = False

    def check_capacity(self, kernel_name: str) -> None:
        for buffer, limit, what in ((SBUF, self.target.sbuf_bytes_per_partition, "usable SBUF"),
                                    (PSUM, self.target.psum_bytes_per_partition, "PSUM (8 banks x 2 KiB)")):
            events = []
            for s in self.storages:
                if s.buffer == buffer:
                    # Live from the first instruction after the allocation to its last use (inclusive);
                    # at equal indices allocations sort first, since that instruction uses both.
                    first = s.alloc_index + 1
                    events.append((first, 1, s))
                    events.append((max(first, s.last_use), 2, s))
            events.sort(key=lambda e: (e[0], e[1]))
            live, peak, peak_set, current = 0, 0, [], set()
            for _, kind, s in events:
                if kind == 1:
                    live += s.bytes_per_partition
                    current.add(s)
                    if live > peak:
                        peak, peak_set = live, list(current)
                else:
                    live -= s.bytes_per_partition
                    current.discard(s)
            if peak > limit:
                top = sorted(peak_set, key=lambda s: -s.bytes_per_partition)[:6]
                names = ", ".join(f"{s.name}{list(s.shape)}={s.bytes_per_partition} B" for s in top)
                raise CapacityError(
                    f"{kernel_name}: peak live {buffer.upper()} is {peak} bytes per partition, limit {limit} "
                    f"({what} on {self.target.name}); largest live allocations: {names}")


_local = threading.local()      # each LNC program runs in its own thread


def _stack() -> list:
    if not hasattr(_local, "runs"):
        _local.runs = []
    return _local.runs


def current() -> KernelRun | None:
    stack = _stack()
    return stack[-1] if stack else None


def begin(instr: str) -> KernelRun:
    """The running kernel launch, or an error if an NKI call happens outside a kernel."""
    stack = _stack()
    if not stack:
        raise KernelError(f"{instr}: NKI calls only run inside a kernel launched with nki.simulate(...) or a "
                          f"@nki.jit function call")
    return stack[-1]


def push(run: KernelRun) -> None:
    _stack().append(run)


def pop() -> None:
    _stack().pop()


def is_on_chip(t: NkiTensor) -> bool:
    return t.buffer in ON_CHIP
