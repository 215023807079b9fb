"""SBUF/PSUM capacity with liveness (stricter than the official simulator, nki-reference.md 4.1, 6.6).

An on-chip allocation is live from the first instruction that touches it to the last one
(allocations made up front and used later do not count before their first use; never-used
allocations never count). At every point of the kernel the bytes per partition in use are

    sum(bytes of live allocations placed by the compiler)
    + size of the union of the address ranges of live allocations pinned with ``address=``

(pinned allocations at the same address share their bytes, as NKI's modular/multi-buffer
allocators rely on). The peak must stay within the target's usable SBUF per partition (trn2:
212984 B) and PSUM (8 banks x 2 KiB = 16 KiB); a pinned range must also lie inside that space.
Bytes are exact, not rounded to banks; partition offsets of pinned allocations are ignored (all
ranges are treated as spanning the same partitions, which can only overestimate).
"""

from __future__ import annotations

import numpy as np

from .errors import CapacityError
from .tensor import PSUM, SBUF

MAX_NAMES = 6


def check(storages, target, kernel_name: str) -> None:
    for buffer, limit, what in ((SBUF, target.sbuf_bytes_per_partition, "usable SBUF"),
                                (PSUM, target.psum_bytes_per_partition, "PSUM (8 banks x 2 KiB)")):
        used = [s for s in storages if s.buffer == buffer and s.first_use is not None]
        for s in used:
            if s.address is not None and s.address + s.bytes_per_partition > limit:
                raise CapacityError(
                    f"{kernel_name}: {s.name}{list(s.shape)} pinned at address {s.address} needs bytes "
                    f"[{s.address}, {s.address + s.bytes_per_partition}) per partition, limit {limit} "
                    f"({what} on {target.name})")
        _sweep(used, limit, f"{what} on {target.name}", buffer, kernel_name)


def _sweep(used, limit, what, buffer, kernel_name) -> None:
    # Events at instruction indices; at equal indices allocations start before others end, since
    # that instruction uses both.
    events = sorted([(s.first_use, 0, i) for i, s in enumerate(used)] +
                    [(max(s.first_use, s.last_use), 1, i) for i, s in enumerate(used)])
    pinned = np.zeros(limit, dtype=np.int32)        # reference count per byte address
    unpinned, peak, peak_set, live = 0, 0, [], set()
    for _, kind, i in events:
        s = used[i]
        delta = 1 if kind == 0 else -1
        if s.address is None:
            unpinned += delta * s.bytes_per_partition
        else:
            pinned[s.address:s.address + s.bytes_per_partition] += delta
        if kind == 0:
            live.add(i)
            total = unpinned + int(np.count_nonzero(pinned))
            if total > peak:
                peak, peak_set = total, list(live)
        else:
            live.discard(i)
    if peak > limit:
        top = sorted((used[i] for i in peak_set), key=lambda s: -s.bytes_per_partition)[:MAX_NAMES]
        names = ", ".join(f"{s.name}{list(s.shape)}={s.bytes_per_partition} B" for s in top)
        raise CapacityError(
            f"{kernel_name}: peak live {buffer.upper()} is {peak} bytes per partition, limit {limit} "
            f"({what}); largest live allocations: {names}")
