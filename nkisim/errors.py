"""Errors nkisim raises where the NKI compiler or the hardware would refuse a kernel.

Every error is a ``ValueError`` subclass and its message names the instruction, the operand,
the offending value and the limit, e.g.::

    nc_matmul: operand 'stationary' free size (M) is 256, limit 128 (tile_size.gemm_stationary_fmax)
"""

from __future__ import annotations


class NkiError(ValueError):
    """Base class: a kernel that real NKI 0.6 would reject."""


class ShapeError(NkiError):
    """Operand shapes or element counts do not fit the instruction."""


class PartitionError(NkiError):
    """Partition count above 128, or a start partition the engines cannot address."""


class MemoryPlacementError(NkiError):
    """An operand lives in a buffer the instruction cannot read or write (e.g. DMA from PSUM)."""


class DtypeError(NkiError):
    """A dtype the instruction does not accept, or an illegal dtype combination."""


class CapacityError(NkiError):
    """Live SBUF or PSUM bytes per partition exceed what the target has."""


class TargetError(NkiError):
    """The instruction or option does not exist on the selected target (trn1/trn2/trn3)."""


class AccessPatternError(NkiError):
    """A view or access pattern the hardware cannot express (out of bounds, partition stride...)."""


class KernelError(NkiError):
    """The kernel as a whole breaks an NKI rule (outputs not in shared_hbm, nki calls outside a kernel...)."""


class NotSimulatedError(NkiError):
    """An NKI 0.6 API that exists on hardware but that nkisim does not simulate."""


def limit_error(cls: type[NkiError], instr: str, operand: str, what: str, value, limit) -> NkiError:
    """Build the standard message: ``<instr>: operand '<operand>' <what> is <value>, limit <limit>``."""
    return cls(f"{instr}: operand '{operand}' {what} is {value}, limit {limit}")


class DataDependentWarning(UserWarning):
    """A kernel took the truth value of a tensor: data-dependent Python that runs in a simulator but
    does not compile for Trainium (the NKI docs' examples still write ``assert nl.equal(a, b)``)."""
