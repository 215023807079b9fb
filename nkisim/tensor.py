"""NkiTensor: a strided view of one allocation (nki-reference.md section 1.4).

Every tensor is ``(storage, shape, strides, offset, dtype)``: element ``i`` lives at
``offset + sum(strides[k] * i[k])`` of the storage's flat array. On-chip storages (SBUF, PSUM)
are ``partitions x free`` row-major, so dim 0 of an on-chip view is the partition dim and its
stride is the storage's free size: partitions can be sliced but never strided or permuted.
Views never copy; ``numpy()`` returns a NumPy view onto the same storage (``as_strided``), so
instructions read and write storage in place.

Indexing rules for on-chip tensors (the guide's examples hold: for ``t`` of shape (64, 64, 64),
``t[0, 0, 10].shape == (1, 1)``, ``t[:, 0].shape == (64, 64)``, ``t[:, 0, 10].shape == (64, 1)``):
an integer on dim 0 keeps a size-1 partition dim; an integer on a free dim drops it unless the
tensor would fall below rank 2, in which case the last indexed free dim stays with size 1.
HBM tensors drop integer-indexed dims as NumPy does (staying at least 1-D). Out-of-bounds slices
are errors, not clipped. Dynamic offsets (``.ap(scalar_offset=)``, ``select(dim, tensor)``) are
read eagerly when the view is made; vector offsets (``.ap(vector_offset=)``, ``vector_select``)
make an *indirect* HBM view that only ``dma_copy`` can read (gather) or write (scatter).
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np

from . import dtypes as dt
from .errors import AccessPatternError, DataDependentWarning
from .tensor_views import ViewMethods, _alias, _contiguous_strides, _is_contiguous, ds, runtime_int  # noqa: F401

class BufferKind(str):
    """A memory buffer constant (``nl.sbuf`` ...). It compares equal to its name, but a plain string
    is not one: NKI 0.3.0 refuses string buffer names in ``nl.ndarray(buffer=...)``."""

    def __repr__(self):
        return f"nl.{str(self)}"


SBUF, PSUM, HBM, SHARED_HBM, PRIVATE_HBM = (BufferKind(b) for b in ("sbuf", "psum", "hbm", "shared_hbm", "private_hbm"))
ON_CHIP = (SBUF, PSUM)
HBM_BUFFERS = (HBM, SHARED_HBM, PRIVATE_HBM)

_storage_ids = itertools.count()


class Storage:
    """One allocation. ``data`` is flat; on-chip it is ``partitions * free`` elements."""

    def __init__(self, buffer: str, shape: tuple, dtype, name: str = "", data: np.ndarray | None = None):
        self.id = next(_storage_ids)
        self.buffer = buffer
        self.dtype = dt.normalize(dtype)
        self.shape = tuple(int(s) for s in shape)
        self.name = name or f"t{self.id}"
        size = math.prod(self.shape)
        if data is None:
            data = np.full(size, dt.fill_value(self.dtype), dtype=dt.storage(self.dtype))
        self.data = data.reshape(-1)
        self.partitions = self.shape[0] if buffer in ON_CHIP else 1
        self.free = size // self.partitions if buffer in ON_CHIP else size
        self.bytes_per_partition = self.free * dt.itemsize(self.dtype)
        # The allocation this storage belongs to: itself, or the original for a dtype-reinterpreting
        # alias made by NkiTensor.view(); liveness is tracked on the base.
        self.base = self
        # Liveness, in instruction indices of the kernel run (for SBUF/PSUM capacity).
        self.first_use = None       # None until an instruction touches it
        self.last_use = 0
        self.address = None         # free byte offset when pinned with nl.ndarray(address=...)
        # PSUM accumulation state per element (see isa/tensor_engine.py).
        if buffer == PSUM:
            self.mm_written = np.zeros(size, dtype=bool)
            self.group_open = np.zeros(size, dtype=bool)
            self.initialized = np.zeros(size, dtype=bool)

    @property
    def on_chip(self) -> bool:
        return self.buffer in ON_CHIP


class NkiTensor(ViewMethods):
    """A view of a :class:`Storage`; see the module docstring for the indexing rules."""

    __slots__ = ("storage", "shape", "strides", "offset", "dtype", "gather")

    def __init__(self, storage: Storage, shape=None, strides=None, offset: int = 0, dtype=None, gather=None):
        self.storage = storage
        self.shape = tuple(int(s) for s in (storage.shape if shape is None else shape))
        self.strides = tuple(int(s) for s in (_contiguous_strides(self.shape) if strides is None else strides))
        self.offset = int(offset)
        self.dtype = storage.dtype if dtype is None else dt.normalize(dtype)
        # Vector-offset (gather/scatter) view: (index tensor [P, 1], row stride). Dim 0 element p
        # starts at offset + index[p] * row_stride; resolved when a DMA reads or writes the view.
        self.gather = gather
        if gather is None:
            self._check_bounds()

    # ---- attributes ------------------------------------------------------------------
    @property
    def buffer(self) -> str:
        return self.storage.buffer

    @property
    def name(self) -> str:
        return self.storage.name

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return dt.itemsize(self.dtype)

    @property
    def on_chip(self) -> bool:
        return self.storage.on_chip

    @property
    def partitions(self) -> int:
        """Partition count (dim 0) of an on-chip tensor; 1 for HBM."""
        return self.shape[0] if self.on_chip else 1

    @property
    def start_partition(self) -> int:
        return self.offset // self.storage.free if self.on_chip else 0

    @property
    def free_size(self) -> int:
        """Elements per partition (on-chip) or all elements (HBM)."""
        return self.size // self.partitions if self.shape and self.partitions else self.size

    def __repr__(self):
        return (f"NkiTensor(name={self.name!r}, shape={self.shape}, dtype={dt.name(self.dtype)}, "
                f"buffer={self.buffer})")

    def __bool__(self):
        """All elements nonzero. On hardware a tensor has no truth value at compile time; the NKI API
        docs' own examples nevertheless write ``assert nl.equal(a, b)``, which the CPU simulator
        evaluates on the data, so nkisim does too, with a ``DataDependentWarning`` (the project's
        own kernel tests turn it into an error: kernels must not branch on data)."""
        warnings.warn(DataDependentWarning(
            f"truth value of tensor {self.name} taken inside a kernel: data-dependent Python does not "
            f"compile for Trainium"), stacklevel=2)
        values = np.asarray(self.numpy())
        return bool(np.all(values != 0))

    def __len__(self):
        return self.shape[0]

    # ---- storage access ------------------------------------------------------------------
    def _check_bounds(self):
        if any(s < 0 for s in self.shape):
            raise AccessPatternError(f"tensor {self.name}: negative size in shape {self.shape}")
        if self.size == 0:
            return
        lo = self.offset + sum(st * (n - 1) for st, n in zip(self.strides, self.shape) if st < 0)
        hi = self.offset + sum(st * (n - 1) for st, n in zip(self.strides, self.shape) if st > 0)
        if lo < 0 or hi >= self.storage.data.size:
            raise AccessPatternError(
                f"tensor {self.name}: view shape={self.shape} strides={self.strides} offset={self.offset} "
                f"reaches elements [{lo}, {hi}] outside the allocation of {self.storage.data.size} elements")

    def flat_indices(self, rows: np.ndarray | None = None) -> np.ndarray:
        """Storage element index of every element of an indirect view (``rows`` = index per dim-0 entry)."""
        index, row_stride = self.gather
        if rows is None:
            rows = self.indirect_rows()
        idx = self.offset + rows.reshape((-1,) + (1,) * (self.ndim - 1)) * row_stride
        for dim in range(1, self.ndim):
            shape = [1] * self.ndim
            shape[dim] = self.shape[dim]
            idx = idx + (np.arange(self.shape[dim], dtype=np.int64) * self.strides[dim]).reshape(shape)
        return np.broadcast_to(idx, self.shape)

    def indirect_rows(self) -> np.ndarray:
        """Row index per dim-0 entry: the index tensor read column-major (``indices.T.flatten()``,
        as the dma_transpose docs state for [128, N] indices; the same as row order for [P, 1])."""
        index, _ = self.gather
        values = np.asarray(index.numpy()).reshape(index.shape[0], -1)
        return values.T.reshape(-1)[:self.shape[0]].astype(np.int64)

    def numpy(self) -> np.ndarray:
        """A writable NumPy view onto the storage (storage dtype; bf16/fp8 via ml_dtypes). For an
        indirect (gather) view: a copy of the gathered elements."""
        flat = self.storage.data
        if self.gather is not None:
            return flat[self.flat_indices()]
        if self.size == 0:
            return np.empty(self.shape, dtype=flat.dtype)
        item = flat.itemsize
        return np.lib.stride_tricks.as_strided(
            flat[self.offset:], shape=self.shape, strides=[s * item for s in self.strides])

    def state_view(self, array: np.ndarray) -> np.ndarray:
        """The same view onto a per-element side array of the storage (PSUM accumulate state)."""
        item = array.itemsize
        return np.lib.stride_tricks.as_strided(
            array[self.offset:], shape=self.shape, strides=[s * item for s in self.strides])

    def read_fp32(self) -> np.ndarray:
        """Values as the engines read them: upcast to fp32."""
        return dt.to_fp32(self.numpy(), self.dtype)

    def write(self, values) -> None:
        """Store values (any numeric array broadcastable to the shape), rounding to this dtype."""
        if self.dtype is not self.storage.dtype:
            raise AccessPatternError(f"tensor {self.name}: cannot write through a dtype-reinterpreting view")
        self.assign(dt.cast(np.broadcast_to(values, self.shape), self.dtype))

    def assign(self, raw: np.ndarray, row_mask: np.ndarray | None = None) -> None:
        """Store values already in the storage dtype (bit-exact); scatters through an indirect view,
        skipping dim-0 rows where ``row_mask`` is False."""
        if self.gather is None:
            if row_mask is None:
                self.numpy()[...] = raw
            else:
                self.numpy()[row_mask] = np.broadcast_to(raw, self.shape)[row_mask]
            return
        idx = self.flat_indices()
        raw = np.broadcast_to(raw, self.shape)
        if row_mask is not None:
            idx, raw = idx[row_mask], raw[row_mask]
        self.storage.data[idx] = raw

    def region(self) -> tuple:
        """(storage id, first partition, last partition + 1, lowest free byte, highest free byte + 1)."""
        if self.size == 0:
            return (self.storage.id, 0, 0, 0, 0)
        if self.gather is not None:        # any row may be touched
            return (self.storage.id, 0, 1, 0, self.storage.data.size * dt.itemsize(self.storage.dtype))
        lo = self.offset + sum(st * (n - 1) for st, n in zip(self.strides, self.shape) if st < 0)
        hi = self.offset + sum(st * (n - 1) for st, n in zip(self.strides, self.shape) if st > 0)
        item = dt.itemsize(self.storage.dtype)
        if self.on_chip:
            free = self.storage.free
            p0 = self.start_partition
            p1 = p0 + self.shape[0]
            rest = list(zip(self.strides[1:], self.shape[1:]))
            base = self.offset % free
            f_lo = base + sum(st * (n - 1) for st, n in rest if st < 0)
            f_hi = base + sum(st * (n - 1) for st, n in rest if st > 0)
            return (self.storage.id, p0, p1, f_lo * item, (f_hi + 1) * item)
        return (self.storage.id, 0, 1, lo * item, (hi + 1) * item)

    def free_pattern(self) -> list:
        """The free-dim access pattern as ``[[stride, num], ...]`` with mergeable dims merged."""
        dims = [(st, n) for st, n in zip(self.strides[1:] if self.on_chip else self.strides,
                                         self.shape[1:] if self.on_chip else self.shape) if n != 1]
        merged: list = []
        for st, n in dims:
            if merged and merged[-1][0] == st * n:
                merged[-1] = [st, merged[-1][1] * n]
            else:
                merged.append([st, n])
        return merged or [[1, 1]]

    def is_contiguous(self) -> bool:
        """Row-major contiguity; on chip only the free dims count (partitions are separate memories)."""
        if self.on_chip:
            return _is_contiguous(self.shape[1:], self.strides[1:])
        return _is_contiguous(self.shape, self.strides)

    # ---- views ------------------------------------------------------------------------
    def _view(self, shape, strides, offset, dtype=None) -> "NkiTensor":
        if self.gather is not None:
            raise AccessPatternError(f"tensor {self.name}: views of an indirect (vector_offset) view are not allowed")
        return NkiTensor(self.storage, shape, strides, offset, self.dtype if dtype is None else dtype)
