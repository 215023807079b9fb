"""View derivation for NkiTensor: indexing, slice/select/reshape/permute/broadcast..., ``.view(dtype)``,
``.ap()`` and ``rearrange`` (nki-reference.md section 1.4). Mixed into :class:`nkisim.tensor.NkiTensor`.

Every method returns a new view of the same storage (no copy): only shape, strides, offset and
(for ``view``/``ap(dtype=)``) a reinterpreting storage alias change. The indexing rules for on-chip
tensors are described in ``nkisim/tensor.py``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from . import dtypes as dt
from .errors import AccessPatternError, ShapeError

if TYPE_CHECKING:
    from .tensor import NkiTensor

PSUM = "psum"


def _contiguous_strides(shape) -> tuple:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


def _is_tensor(value) -> bool:
    return hasattr(value, "storage") and hasattr(value, "strides")


class ViewMethods:
    """The NkiTensor view API; needs ``storage, shape, strides, offset, dtype, on_chip, _view``."""

    __slots__ = ()

    def __getitem__(self, key) -> "NkiTensor":
        if self.gather is not None:
            raise AccessPatternError(f"tensor {self.name}: an indirect (vector_offset) view cannot be indexed further")
        if not isinstance(key, tuple):
            key = (key,)
        if any(k is Ellipsis for k in key):
            i = next(i for i, k in enumerate(key) if k is Ellipsis)
            fill = self.ndim - (len(key) - 1)
            key = key[:i] + (slice(None),) * fill + key[i + 1:]
        if len(key) > self.ndim:
            raise AccessPatternError(f"tensor {self.name}: {len(key)} indices for a rank-{self.ndim} tensor")
        key = key + (slice(None),) * (self.ndim - len(key))
        shape, strides, kept_int = [], [], []
        offset = self.offset
        for dim, (k, n, st) in enumerate(zip(key, self.shape, self.strides)):
            if _is_tensor(k):
                raise AccessPatternError(
                    f"tensor {self.name}: indexing with a tensor is dynamic addressing; use .ap(scalar_offset=...)")
            if isinstance(k, slice):
                start, stop, step = _resolve_slice(k, n, self.name, dim)
                count = max(0, -(-(stop - start) // step)) if step > 0 else max(0, -(-(start - stop) // -step))
                if self.on_chip and dim == 0 and step != 1:
                    raise AccessPatternError(
                        f"tensor {self.name}: partition dim sliced with step {step}; partitions must be contiguous (step 1)")
                offset += start * st
                shape.append(count)
                strides.append(st * step)
                kept_int.append(False)
            else:
                i = int(k)
                if i < -n or i >= n:
                    raise AccessPatternError(f"tensor {self.name}: index {i} out of bounds for dim {dim} of size {n}")
                i %= n
                offset += i * st
                if self.on_chip:
                    shape.append(1)
                    strides.append(st)
                    kept_int.append(dim != 0)
        if self.on_chip:
            # Drop integer-indexed free dims while rank stays >= 2; keep the last one otherwise.
            drop = [i for i, flag in enumerate(kept_int) if flag]
            if len(shape) - len(drop) < 2 and drop:
                drop = drop[:-1]
            shape = [s for i, s in enumerate(shape) if i not in drop]
            strides = [s for i, s in enumerate(strides) if i not in drop]
        elif not shape:
            shape, strides = [1], [1]       # HBM views stay at least 1-D
        return self._view(shape, strides, offset)

    def slice(self, dim: int, start: int, end: int, step: int = 1) -> "NkiTensor":
        key = [slice(None)] * self.ndim
        key[dim] = slice(start, end, step)
        return self[tuple(key)]

    def select(self, dim: int, index) -> "NkiTensor":
        """Select one index of ``dim`` and drop the dim (on chip, dim 0 keeps size 1). A tensor or
        register index is a dynamic select: nkisim reads its runtime value (one per view; not dim 0 on chip)."""
        dim = dim % self.ndim
        if not isinstance(index, (int, np.integer)):
            if self.on_chip and dim == 0:
                raise AccessPatternError(f"tensor {self.name}: dynamic select on the partition dim (dim 0) of an "
                                         f"on-chip tensor; select a free dim")
            index = runtime_int(index, f"tensor {self.name}: select index")
        key = [slice(None)] * self.ndim
        key[dim] = int(index)
        return self[tuple(key)]      # same rank rules as integer indexing

    def reshape(self, shape) -> "NkiTensor":
        shape = [int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,))]
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = self.size // known if known else 0
        if math.prod(shape) != self.size:
            raise ShapeError(f"tensor {self.name}: reshape {self.shape} -> {tuple(shape)} changes the element count "
                             f"({self.size} -> {math.prod(shape)})")
        if self.on_chip:
            if shape[0] != self.shape[0]:
                raise AccessPatternError(f"tensor {self.name}: reshape {self.shape} -> {tuple(shape)} changes the "
                                         f"partition dim; only free dims can be reshaped on chip")
            if not _is_contiguous(self.shape[1:], self.strides[1:]):
                raise AccessPatternError(f"tensor {self.name}: reshape needs contiguous free dims, strides are {self.strides}")
            strides = (self.strides[0],) + _contiguous_strides(shape[1:])
            return self._view(shape, strides, self.offset)
        if not self.is_contiguous():
            raise AccessPatternError(f"tensor {self.name}: reshape needs a contiguous view, strides are {self.strides}")
        return self._view(shape, _contiguous_strides(shape), self.offset)

    def reshape_dim(self, dim: int, shape) -> "NkiTensor":
        dim = dim % self.ndim
        n, st = self.shape[dim], self.strides[dim]
        shape = [int(s) for s in shape]
        if shape.count(-1) == 1:
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = n // known if known and n % known == 0 else -1
        if math.prod(shape) != n:
            raise ShapeError(f"tensor {self.name}: reshape_dim({dim}, {shape}) does not preserve size {n}")
        if self.on_chip and dim == 0 and len(shape) > 1:
            raise AccessPatternError(f"tensor {self.name}: the partition dim cannot be split")
        sub = [st * s for s in _contiguous_strides(shape)]
        return self._view(self.shape[:dim] + tuple(shape) + self.shape[dim + 1:],
                          self.strides[:dim] + tuple(sub) + self.strides[dim + 1:], self.offset)

    def flatten_dims(self, start: int, end: int) -> "NkiTensor":
        start, end = start % self.ndim, end % self.ndim
        dims_shape, dims_strides = self.shape[start:end + 1], self.strides[start:end + 1]
        if not _is_contiguous(dims_shape, dims_strides, base=dims_strides[-1]):
            raise AccessPatternError(f"tensor {self.name}: dims {start}..{end} are not mergeable (strides {self.strides})")
        if self.on_chip and start == 0 and end > 0:
            raise AccessPatternError(f"tensor {self.name}: the partition dim cannot be merged with free dims")
        return self._view(self.shape[:start] + (math.prod(dims_shape),) + self.shape[end + 1:],
                          self.strides[:start] + (dims_strides[-1],) + self.strides[end + 1:], self.offset)

    def permute(self, dims) -> "NkiTensor":
        dims = [int(d) % self.ndim for d in dims]
        if sorted(dims) != list(range(self.ndim)):
            raise ShapeError(f"tensor {self.name}: permute({dims}) is not a permutation of {self.ndim} dims")
        if self.on_chip and dims[0] != 0:
            raise AccessPatternError(f"tensor {self.name}: permute({dims}) moves the partition dim; dims[0] must stay 0 on chip")
        return self._view([self.shape[d] for d in dims], [self.strides[d] for d in dims], self.offset)

    def broadcast(self, dim: int, size: int) -> "NkiTensor":
        dim = dim % self.ndim
        if self.shape[dim] != 1:
            raise ShapeError(f"tensor {self.name}: broadcast dim {dim} has size {self.shape[dim]}, must be 1")
        if self.on_chip and dim == 0:
            raise AccessPatternError(f"tensor {self.name}: the partition dim of an on-chip tensor cannot be broadcast "
                                     f"(DMA from an HBM view broadcast along dim 0 instead)")
        shape, strides = list(self.shape), list(self.strides)
        shape[dim], strides[dim] = int(size), 0
        return self._view(shape, strides, self.offset)

    def expand_dim(self, dim: int) -> "NkiTensor":
        dim = dim % (self.ndim + 1)
        if self.on_chip and dim == 0:
            raise AccessPatternError(f"tensor {self.name}: expand_dim(0) would move the partition dim of an on-chip tensor")
        return self._view(self.shape[:dim] + (1,) + self.shape[dim:], self.strides[:dim] + (0,) + self.strides[dim:],
                          self.offset)

    def squeeze_dim(self, dim: int) -> "NkiTensor":
        dim = dim % self.ndim
        if self.on_chip and dim == 0:
            raise AccessPatternError(f"tensor {self.name}: squeeze_dim(0) would remove the partition dim of an on-chip tensor")
        if self.shape[dim] != 1:
            raise ShapeError(f"tensor {self.name}: squeeze_dim({dim}) on a dim of size {self.shape[dim]}")
        return self._view(self.shape[:dim] + self.shape[dim + 1:], self.strides[:dim] + self.strides[dim + 1:], self.offset)

    def view(self, dtype) -> "NkiTensor":
        """Reinterpret the bits as ``dtype``; the last dim is scaled by the itemsize ratio and must be
        contiguous (unit stride). Works on an alias of the storage that shares its bytes and liveness."""
        dtype = dt.normalize(dtype)
        old, new = self.itemsize, dt.itemsize(dtype)
        if old == new:
            return type(self)(_alias(self.storage, dtype), self.shape, self.strides, self.offset)
        if self.shape[-1] != 1 and self.strides[-1] != 1:
            raise AccessPatternError(f"tensor {self.name}: view({dt.name(dtype)}) needs a unit-stride last dim, "
                                     f"strides are {self.strides}")
        if self.buffer == PSUM:
            raise AccessPatternError(f"tensor {self.name}: nkisim does not reinterpret PSUM tensors with a different "
                                     f"element size ({old} -> {new} bytes)")
        if old > new:
            r = old // new
            shape = self.shape[:-1] + (self.shape[-1] * r,)
            strides = tuple(st * r for st in self.strides[:-1]) + (1,)
            offset = self.offset * r
        else:
            r = new // old
            if self.shape[-1] % r or self.offset % r or any(st % r for st in self.strides[:-1]):
                raise AccessPatternError(f"tensor {self.name}: view({dt.name(dtype)}) needs the last dim ({self.shape[-1]}) "
                                         f"and the offset/strides to be multiples of {r}")
            shape = self.shape[:-1] + (self.shape[-1] // r,)
            strides = tuple(st // r for st in self.strides[:-1]) + (1,)
            offset = self.offset // r
        return type(self)(_alias(self.storage, dtype), shape, strides, offset)

    reinterpret_cast = view

    def ap(self, pattern, offset=None, scalar_offset=None, vector_offset=None, indirect_dim=0, dtype=None) -> "NkiTensor":
        """Access pattern over the flattened storage: ``[[step, num], ...]`` loop nest from ``offset``.

        ``offset=None`` keeps this view's offset; an integer is taken from the start of the storage,
        as the NKI access-pattern deep dive states (".ap addresses the tensor's underlying storage
        directly ... ignoring any shape, strides, or offset carried by the view"). The API stub's
        docstring instead says an explicit offset composes with the view's offset; the two agree for
        allocations and kernel arguments (offset 0), where .ap is normally used. ``scalar_offset``
        (a VirtualRegister or a one-element tensor) is read at run time and scaled by
        ``prod(storage.shape[indirect_dim + 1:])``; ``vector_offset`` (gather/scatter) is not simulated."""
        if vector_offset is not None and scalar_offset is not None:
            raise AccessPatternError(f"tensor {self.name}: .ap() takes scalar_offset or vector_offset, not both")
        storage = self.storage if dtype is None else _alias(self.storage, dt.normalize(dtype))
        pattern = [[int(s), int(n)] for s, n in pattern]
        start = self.offset if offset is None else int(offset)
        if scalar_offset is not None:
            value = runtime_int(scalar_offset, f"tensor {self.name}: .ap(scalar_offset=...)")
            start += value * math.prod(storage.shape[indirect_dim + 1:])
        if self.on_chip and (not pattern or pattern[0][0] != storage.free):
            raise AccessPatternError(
                f"tensor {self.name}: on-chip .ap() must start with [free_size_of_storage={storage.free}, "
                f"n_partitions], got {pattern[:1]}")
        if vector_offset is not None:
            return self._indirect_view(storage, pattern, start, vector_offset, indirect_dim)
        return type(self)(storage, [n for _, n in pattern], [s for s, _ in pattern], start)

    def _indirect_view(self, storage, pattern, start, vector_offset, indirect_dim):
        """Gather/scatter view: dim-0 entry p starts at row ``vector_offset[p]`` of ``indirect_dim``."""
        if self.on_chip or indirect_dim != 0:
            raise AccessPatternError(f"tensor {self.name}: vector_offset indexes dim 0 of an HBM tensor (the "
                                     f"indexed tensor must be in HBM, indirect_dim=0); got {self.buffer}, "
                                     f"indirect_dim={indirect_dim}")
        if not _is_tensor(vector_offset) or not dt.is_int(vector_offset.dtype):
            raise AccessPatternError(f"tensor {self.name}: vector_offset must be an SBUF integer tensor [P, 1] "
                                     f"(or [128, N] for dma_transpose gathers)")
        if vector_offset.size < pattern[0][1]:
            raise AccessPatternError(f"tensor {self.name}: vector_offset has {vector_offset.size} indices, the "
                                     f"pattern's first dim needs {pattern[0][1]}")
        row_stride = math.prod(storage.shape[1:])
        return type(self)(storage, [n for _, n in pattern], [row_stride] + [s for s, _ in pattern[1:]], start,
                          gather=(vector_offset, row_stride))

    def indirect(self, index, num_elem=None) -> "NkiTensor":
        """Tensor indirection on compute engines (trn3): not simulated by nkisim."""
        from .errors import NotSimulatedError
        raise NotSimulatedError(f"tensor {self.name}: .indirect() (trn3 tensor indirection on compute engines) is "
                                f"not simulated by nkisim; DMA gathers with .ap(vector_offset=...) are")

    def vector_select(self, dim: int, vector_offset) -> "NkiTensor":
        """Per-partition gather view of an HBM tensor: row ``vector_offset[p]`` of dim 0 for entry p."""
        if dim != 0:
            raise AccessPatternError(f"tensor {self.name}: vector_select needs dim=0, got {dim}")
        pattern = [[self.strides[0], vector_offset.shape[0]]] + [[st, n] for st, n in zip(self.strides[1:],
                                                                                           self.shape[1:])]
        return self._indirect_view(self.storage, pattern, self.offset, vector_offset, 0)

    def get_pattern(self) -> list:
        return [[st, n] for st, n in zip(self.strides, self.shape)]

    def is_indirect(self) -> bool:
        """True for vector-offset (gather/scatter) views; scalar dynamic offsets are resolved eagerly
        by nkisim, so those views are plain strided views here."""
        return self.gather is not None

    def rearrange(self, src_pattern, dst_pattern, fixed_sizes=None) -> "NkiTensor":
        """einops-style view: split grouped source dims, permute, merge grouped destination dims."""
        fixed = dict(fixed_sizes or {})
        if len(src_pattern) != self.ndim:
            raise ShapeError(f"tensor {self.name}: rearrange source pattern {src_pattern} has {len(src_pattern)} "
                             f"entries for a rank-{self.ndim} tensor")
        view, names = self, []
        dim = 0
        for entry, n in zip(src_pattern, self.shape):
            group = (entry,) if isinstance(entry, str) else tuple(entry)
            sizes = [fixed.get(g, -1) for g in group]
            if len(group) > 1:
                view = view.reshape_dim(dim, sizes)
                for g, size in zip(group, view.shape[dim:dim + len(group)]):
                    fixed[g] = size
            else:
                fixed[group[0]] = n
            names.extend(group)
            dim += len(group)
        flat_dst = [g for entry in dst_pattern for g in ((entry,) if isinstance(entry, str) else entry)]
        if sorted(flat_dst) != sorted(names):
            raise ShapeError(f"tensor {self.name}: rearrange patterns {src_pattern} -> {dst_pattern} name different dims")
        view = view.permute([names.index(g) for g in flat_dst])
        dim = 0
        for entry in dst_pattern:
            if isinstance(entry, str):
                dim += 1
                continue
            if len(entry) > 1:
                view = view.flatten_dims(dim, dim + len(entry) - 1)
            elif len(entry) == 0:
                view = view.expand_dim(dim)
            dim += 1
        return view


def _alias(storage, dtype):
    """The storage's bytes seen as ``dtype`` (a reinterpreting alias sharing data and liveness)."""
    base = storage.base
    if dtype == base.dtype:
        return base
    if base.data.dtype != dt.logical(base.dtype) or dt.storage(dtype) != dt.logical(dtype):
        raise AccessPatternError(f"tensor {base.name}: reinterpreting bits as {dt.name(dtype)} needs the precise "
                                 f"storage (NKI_PRECISE_FP=1); {dt.name(base.dtype)} is stored widened to fp32")
    alias = type(base).__new__(type(base))
    alias.__dict__.update(base.__dict__)
    alias.dtype = dtype
    alias.data = base.data.view(dt.storage(dtype))
    ratio_num, ratio_den = dt.itemsize(base.dtype), dt.itemsize(dtype)
    alias.free = base.free * ratio_num // ratio_den
    alias.shape = base.shape[:-1] + (base.shape[-1] * ratio_num // ratio_den,)
    alias.base = base
    return alias


def runtime_int(value, what: str) -> int:
    """The runtime value of a dynamic index: an int, a ``VirtualRegister`` or a 1-element tensor."""
    if isinstance(value, (int, np.integer)):
        return int(value)
    if _is_tensor(value):
        if value.size != 1:
            raise AccessPatternError(f"{what}: index tensor {value.name} has shape {value.shape}; it must hold one value")
        return int(np.asarray(value.numpy()).reshape(-1)[0])
    if hasattr(value, "value"):
        return int(value.value)
    raise AccessPatternError(f"{what}: expected an int, a VirtualRegister or a [1, 1] tensor, got {type(value).__name__}")


def _is_contiguous(shape, strides, base: int = 1) -> bool:
    expected = base
    for st, n in reversed(list(zip(strides, shape))):
        if n != 1 and st != expected:
            return False
        expected *= n
    return True


def _resolve_slice(k: slice, n: int, name: str, dim: int):
    step = 1 if k.step is None else int(k.step)
    if step == 0:
        raise AccessPatternError(f"tensor {name}: slice step 0 on dim {dim}")
    if step > 0:
        start = 0 if k.start is None else int(k.start)
        stop = n if k.stop is None else int(k.stop)
        start += n if start < 0 else 0
        stop += n if stop < 0 else 0
        if not (0 <= start <= n) or not (0 <= stop <= n):
            raise AccessPatternError(
                f"tensor {name}: slice {start}:{stop} out of bounds for dim {dim} of size {n} "
                f"(NKI does not clip; clip ragged tiles with min())")
        return start, max(start, stop), step
    start = n - 1 if k.start is None else int(k.start)
    stop = -1 if k.stop is None else int(k.stop)
    start += n if start < 0 else 0
    if k.stop is not None and stop < 0:
        stop += n
    if not (0 <= start < n or n == 0) or stop < -1:
        raise AccessPatternError(f"tensor {name}: slice out of bounds for dim {dim} of size {n}")
    return start, min(start, stop), step


class ds:
    """``nl.ds(start, size)``: the slice ``start:start+size``."""

    def __new__(cls, start, size):
        return slice(int(start), int(start) + int(size), 1)
