"""The state of one simulated kernel launch: target, program id, allocations, liveness.

Instructions call :func:`begin` to get the running :class:`KernelRun` and :meth:`KernelRun.emit`
after they executed, which numbers the instruction, updates the liveness of every storage it
touched, keeps the PSUM accumulation state and appends it to the active traces.

Capacity (stricter than the official simulator): after the kernel returns,
:meth:`KernelRun.check_capacity` checks the peak of live SBUF/PSUM bytes per partition from the
first to the last use of each allocation (see ``capacity.py``).
"""

from __future__ import annotations

import threading

from . import trace as trace_mod
from .errors import KernelError
from .target import Target
from .tensor import ON_CHIP, PSUM, SHARED_HBM, NkiTensor, Storage


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

    def allocate(self, shape, dtype, buffer: str, name: str = "", address=None) -> NkiTensor:
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
        storage.last_use = self.counter
        if address is not None and buffer in ON_CHIP:
            storage.address = int(address[1])       # (partition offset, free byte offset)
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

    def touch_untraced(self, t: NkiTensor) -> None:
        """Liveness for an access that is not an engine instruction (register load/store)."""
        base = t.storage.base
        base.last_use = max(base.last_use, self.counter)
        if base.first_use is None:
            base.first_use = max(self.counter, 1)

    def _touch(self, t: NkiTensor, write: bool, by_tensor_engine: bool) -> None:
        base = t.storage.base
        base.last_use = self.counter
        if base.first_use is None:
            base.first_use = self.counter
        if t.buffer == PSUM and write:
            t.state_view(t.storage.initialized)[...] = True
        if t.buffer == PSUM and not by_tensor_engine:
            # Another engine touching PSUM closes the matmul accumulation group there; a write
            # also means the values are no longer a matmul result.
            t.state_view(t.storage.group_open)[...] = False
            if write:
                t.state_view(t.storage.mm_written)[...] = False

    def check_capacity(self, kernel_name: str) -> None:
        """Peak live SBUF/PSUM bytes per partition within the target's capacity (``capacity.py``)."""
        from . import capacity
        capacity.check(self.storages, self.target, kernel_name)


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

