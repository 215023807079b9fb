"""DMA transfers: how many DMA engines one spans, how long it keeps them busy, and the engine pool.

Model (nki-reference.md 3 and 4.3b; MODEL choices marked):

* A transfer spans ``E = min(16, ceil(partitions / 8))`` DMA engines, the SBUF side's partitions
  ("~8 partitions per engine for a 128-partition tile"). HBM->HBM copies count rows of their
  contiguous chunks instead of partitions.
* Each engine moves its share ``bytes / E`` at ``dma_bytes_per_ns x efficiency(chunk)``, where
  ``chunk`` is the contiguous run of one descriptor element: the smaller innermost contiguous run
  of source and destination (bytes per partition for an unstrided SBUF tile). MODEL efficiency
  curve ``e(b) = [b / (b + 512)] / [4096 / (4096 + 512)]`` capped at 1: 100% from 4 KiB, 90% at
  2 KiB, 56% at 512 B, 38% at 256 B, 12% at 64 B, matching the guide's thresholds.
* A fixed latency per transfer (descriptor setup + trigger + completion semaphore, 1300 ns; 600 ns
  for an explicit ``dge_mode=hwdge`` on trn2/trn3) precedes the data phase. MODEL: it is latency,
  not engine occupancy, so transfers in flight overlap their fixed costs while sharing bandwidth;
  except that an hwdge transfer needs one of the core's two hardware DGE blocks for its 600 ns.
* ``dma_transpose`` runs at <= 90% (HBM source) / <= 50% (SBUF source) of DMA throughput.

The pool keeps busy intervals per engine and places each transfer's per-engine share in the
earliest gap on the engines that free up first (engines round-robin across queues in hardware,
so a transfer that becomes ready late does not block one that is ready early).
"""

from __future__ import annotations

import bisect
import math

from . import constants as C

HBM_BUFFERS = ("hbm", "shared_hbm", "private_hbm")
HWDGE = 2   # nkisim.isa.enums.dge_mode.hwdge
MIN_GAP_NS = 2.0   # idle gaps shorter than this are dropped from the pool (negligible, keeps lookups short)


def efficiency(chunk_bytes: float) -> float:
    """Fraction of an engine's peak bandwidth reached with contiguous chunks of ``chunk_bytes``."""
    if chunk_bytes <= 0:
        return 1.0 / C.DMA_SATURATION_BYTES
    h = C.DMA_HALF_EFFICIENCY_BYTES
    at_saturation = C.DMA_SATURATION_BYTES / (C.DMA_SATURATION_BYTES + h)
    return min(1.0, (chunk_bytes / (chunk_bytes + h)) / at_saturation)


def _src_dst(instr):
    dst = next((o for o in instr.operands if o.write), None)
    src = next((o for o in instr.operands if not o.write), None)
    return src, dst


def transfer_bytes(instr) -> int:
    src, dst = _src_dst(instr)
    return (dst or src).nbytes if (dst or src) else 0


def hbm_bytes(instr) -> int:
    """Bytes the transfer reads from or writes to HBM (an HBM->HBM copy counts both)."""
    return sum(o.nbytes for o in instr.operands if o.buffer in HBM_BUFFERS)


def chunk_bytes(instr) -> int:
    runs = [o.contiguous_bytes or o.nbytes for o in instr.operands]
    for o in instr.operands:               # one descriptor element never spans two partitions
        if o.buffer not in HBM_BUFFERS and o.partitions:
            runs.append(o.nbytes // o.partitions)
    return max(1, min(runs)) if runs else 1


def engines_spanned(instr) -> int:
    on_chip = [o.partitions for o in instr.operands if o.buffer not in HBM_BUFFERS]
    if on_chip:
        rows = max(on_chip)
    else:
        rows = max(1, transfer_bytes(instr) // chunk_bytes(instr))
    return max(1, min(C.DMA_ENGINES, math.ceil(rows / C.DMA_PARTITIONS_PER_ENGINE)))


def uses_hwdge(instr, target) -> bool:
    return instr.attrs.get("dge_mode") == HWDGE and target.nc_version >= 3


def fixed_latency_ns(instr, target) -> float:
    return C.HWDGE_FIXED_NS if uses_hwdge(instr, target) else C.DMA_FIXED_NS


def engine_share_ns(instr, target) -> tuple[int, float]:
    """(engines spanned, busy ns on each of them)."""
    e = engines_spanned(instr)
    rate = target.dma_bytes_per_ns * efficiency(chunk_bytes(instr))
    if instr.name == "dma_transpose":
        src, _ = _src_dst(instr)
        rate *= C.DMA_TRANSPOSE_EFFICIENCY["hbm" if src is not None and src.buffer in HBM_BUFFERS else "sbuf"]
    return e, transfer_bytes(instr) / e / rate


def direction(instr) -> str:
    """The DMA queue a transfer goes to: loads, stores and on-chip/HBM copies are separate
    in-order queues (MODEL, see schedule.py)."""
    src, dst = _src_dst(instr)
    src_hbm = src is not None and src.buffer in HBM_BUFFERS
    dst_hbm = dst is not None and dst.buffer in HBM_BUFFERS
    if src_hbm and not dst_hbm:
        return "load"
    if dst_hbm and not src_hbm:
        return "store"
    return "copy"


class EnginePool:
    """Free gaps of the DMA engines of one NeuronCore (a gap list stays short when transfers are
    packed back to back, which keeps placement fast on long traces)."""

    def __init__(self, count: int = C.DMA_ENGINES):
        self.gap_starts = [[0.0] for _ in range(count)]
        self.gap_ends = [[math.inf] for _ in range(count)]
        self.busy = [0.0] * count

    def _earliest(self, engine: int, t: float, duration: float) -> tuple[float, int]:
        starts, ends = self.gap_starts[engine], self.gap_ends[engine]
        i = bisect.bisect_right(ends, t)          # first gap ending after t
        while True:
            begin = max(t, starts[i])
            if begin + duration <= ends[i]:
                return begin, i
            i += 1

    def place(self, engines: int, t: float, duration: float) -> tuple[float, float]:
        """Reserve ``duration`` on ``engines`` engines from ``t`` on; return (first start, last end)."""
        options = sorted((self._earliest(k, t, duration), k) for k in range(len(self.gap_starts)))[:engines]
        first, last = math.inf, 0.0
        for (begin, i), k in options:
            starts, ends = self.gap_starts[k], self.gap_ends[k]
            gap_start, gap_end = starts[i], ends[i]
            pieces = [(a, b) for a, b in ((gap_start, begin), (begin + duration, gap_end)) if b - a > MIN_GAP_NS]
            starts[i:i + 1] = [a for a, _ in pieces]
            ends[i:i + 1] = [b for _, b in pieces]
            self.busy[k] += duration
            first, last = min(first, begin), max(last, begin + duration)
        return first, last
