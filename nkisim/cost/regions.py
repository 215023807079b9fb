"""Memory footprints of operands, for the scheduler's read/write dependencies.

A trace operand carries ``region = (storage id, p0, p1, byte lo, byte hi)``: a bounding range,
which makes two interleaved views of one tile (``t[:, :, 0]`` and ``t[:, :, 1]``) or two heads of
a ``(B, S, H, D)`` HBM tensor look overlapping. :func:`storage_box` refines it into a box in the
coordinates of the allocation's own shape: each view dimension is mapped onto the one storage
dimension whose stride divides its stride, and the box is exact for views made by slicing and
integer indexing. Views it cannot map (reshapes that merge storage dims, dtype reinterpretation)
get ``None`` and fall back to the byte range. Two accesses overlap when their regions intersect
and, if both have boxes, their boxes intersect in every dimension (both tests are necessary
conditions, so the result stays conservative: it may report a false overlap, never miss one).
"""

from __future__ import annotations

from ..tensor_views import _contiguous_strides


def storage_box(tensor) -> tuple | None:
    """((lo, hi) per storage dim, hi exclusive) covered by ``tensor``, or None if not mappable."""
    storage = tensor.storage
    shape = storage.shape
    if tensor.dtype != storage.dtype or not shape or tensor.size == 0:
        return None
    strides = _contiguous_strides(shape)
    # Base coordinate of the view's first element in storage coordinates.
    rest = tensor.offset
    lo = []
    for st in strides:
        lo.append(rest // st)
        rest %= st
    hi = list(lo)
    for st, n in zip(tensor.strides, tensor.shape):
        if n == 1 or st == 0:
            continue
        for j, sj in enumerate(strides):
            if abs(st) % sj == 0 and abs(st) // sj < shape[j]:
                step = (st // sj) * (n - 1)
                if step > 0:
                    hi[j] += step
                else:
                    lo[j] += step
                break
        else:
            return None
    if any(a < 0 or b >= s for a, b, s in zip(lo, hi, shape)):
        return None      # the view wraps across storage dims (e.g. a merged reshape): not a box
    return tuple((a, b + 1) for a, b in zip(lo, hi))


def ranges_overlap(a: tuple, b: tuple) -> bool:
    """Regions ``(storage, p0, p1, lo, hi)`` intersect (same storage, partitions and bytes)."""
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2] and a[3] < b[4] and b[3] < a[4]


def boxes_overlap(a, b) -> bool:
    if a is None or b is None or len(a) != len(b):
        return True
    return all(x0 < y1 and y0 < x1 for (x0, x1), (y0, y1) in zip(a, b))


def box_contains(outer, inner) -> bool:
    if outer is None or inner is None or len(outer) != len(inner):
        return False
    return all(x0 <= y0 and y1 <= x1 for (x0, x1), (y0, y1) in zip(outer, inner))


def overlap(op_a, op_b) -> bool:
    """Two trace operands touch a common element (conservatively)."""
    return ranges_overlap(op_a.region, op_b.region) and boxes_overlap(getattr(op_a, "box", None),
                                                                       getattr(op_b, "box", None))


def covers(op_a, op_b) -> bool:
    """``op_a`` covers every element of ``op_b`` (exactly known only for boxes; False when unsure)."""
    ra, rb = op_a.region, op_b.region
    if ra[0] != rb[0]:
        return False
    box_a, box_b = getattr(op_a, "box", None), getattr(op_b, "box", None)
    if box_a is not None and box_b is not None:
        return box_contains(box_a, box_b)
    return False
