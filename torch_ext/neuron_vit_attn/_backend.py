"""Which implementation computes attention, and how tensors reach the NKI kernel.

``NEURON_VIT_ATTN_BACKEND`` (read at every call):

=============  =================================================================================
``auto``       default. ``neuron`` tensors: the NKI kernel through ``nki.jit``. CPU tensors: the
               eager reference (``reference.py``).
``sim``        CPU tensors: the same NKI kernel run by the NKI simulator (``nkisim`` from the
               neuron-vit-attn source repository, which stands in for ``nki``). ``neuron`` tensors:
               as ``auto``.
``reference``  the eager reference on every device (debugging, bisecting numerical issues).
=============  =================================================================================

Launch degree: the kernel must be launched with the Neuron runtime's logical-NeuronCore degree
(``NEURON_LOGICAL_NC_CONFIG``; a mismatch fails at run time). ``2`` launches ``attention_fwd[2]``,
which splits the (batch, head group) work between the two physical cores of a logical core; ``1``
one core. Unset, ``neuron`` tensors use the runtime's default for the host's architecture (2 on
Trainium2, read from the Neuron driver's sysfs; 1 with a one-time warning when it cannot be read),
and the ``sim`` backend uses 1 (set the variable to 2 to simulate both programs as two threads).

Inputs the kernel does not cover (``_validation.kernel_unsupported_reason``, and key sequences
beyond the kernel's SBUF budget, ``kv_budget_reason``) run the reference on any backend, with a
one-time warning per distinct reason.

Layout without copies: Transformers hands q/k/v as (B, H, S, D) views of a contiguous (B, S, H, D)
projection. When ``q.transpose(1, 2)`` is contiguous the kernel reads that buffer directly with
``layout="bshd"``; otherwise it gets contiguous (B, H, S, D) (``layout="bhsd"``, a copy only if q
is not already contiguous). k and v follow q's layout (copied into it only when they differ).
The kernel writes ``out`` in q's layout; :func:`output_layout` is the single rule that the op's
real and fake implementations share, so their strides agree.
"""

from __future__ import annotations

import functools
import os

import torch

from ._validation import warn_once

BACKEND_ENV = "NEURON_VIT_ATTN_BACKEND"
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
LNC_DEGREES = (1, 2)
ARCH_TYPE_SYSFS = "/sys/devices/virtual/neuron_device/neuron0/neuron_core0/info/architecture/arch_type"
BACKENDS = ("auto", "sim", "reference")
LAYOUT_BHSD = "bhsd"
LAYOUT_BSHD = "bshd"

_NKISIM_HELP = ("NEURON_VIT_ATTN_BACKEND=sim runs the NKI kernel in nkisim, the CPU interpreter of NKI that "
                "ships with the neuron-vit-attn source repository (not with the Hub build): clone the "
                "repository and `pip install -e .` in it, or unset NEURON_VIT_ATTN_BACKEND to use the "
                "eager reference on CPU")
_NKI_HELP = ("the neuron device path calls the NKI kernel through nki.jit and needs the NKI package from "
             "the AWS Neuron pip index (pip install nki --extra-index-url "
             "https://pip.repos.neuron.amazonaws.com); PyPI's `nki` is a placeholder that does not work")


def selected_backend() -> str:
    """The value of NEURON_VIT_ATTN_BACKEND (default ``auto``), validated."""
    value = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if value not in BACKENDS:
        raise ValueError(f"{BACKEND_ENV}={os.environ.get(BACKEND_ENV)!r} is not valid; use one of "
                         f"{', '.join(BACKENDS)} (auto: NKI kernel on neuron, reference on CPU; "
                         f"sim: the NKI kernel in nkisim on CPU; reference: eager everywhere)")
    return value


def logical_core_degree(on_device: bool = False) -> int:
    """The kernel's launch degree: NEURON_LOGICAL_NC_CONFIG when set (validated); unset, on a Neuron
    device the Neuron runtime's own default for the architecture (``runtime_default_degree``), on CPU 1."""
    raw = os.environ.get(LNC_ENV, "").strip()
    if not raw:
        return runtime_default_degree() if on_device else 1
    if raw not in {str(d) for d in LNC_DEGREES}:
        raise ValueError(f"{LNC_ENV}={os.environ.get(LNC_ENV)!r} is not valid; use 1 or 2 (physical NeuronCores "
                         f"per logical core; 2 lets the attention kernel split its work across both)")
    return int(raw)


def runtime_default_degree() -> int:
    """The Neuron runtime groups two physical NeuronCores per logical core by default on Trainium2
    (NeuronCore-v3) and one on NeuronCore-v2 hosts; a kernel launched with another degree fails at
    run time. The architecture is read from the Neuron driver's sysfs (``arch_type``, e.g. "NCv2");
    when it cannot be read or is another one, the launch uses one core and says once how to set the degree."""
    arch = _architecture(ARCH_TYPE_SYSFS)
    if arch.endswith("v3"):
        return 2
    if arch.endswith(("v1", "v2")):
        return 1
    warn_once(f"lnc-default:{arch}",
              f"neuron_vit_attn: {LNC_ENV} is not set and the runtime's default degree for this NeuronCore "
              f"architecture is not known ({ARCH_TYPE_SYSFS}: {arch or 'unavailable'!r}); launching the "
              f"attention kernel on one physical core. Set {LNC_ENV} to the Neuron runtime's logical-core "
              f"degree (2 is trn2's default): the launch degree must match it. This warning is shown once.")
    return 1


@functools.lru_cache(maxsize=None)
def _architecture(path: str) -> str:
    """The Neuron driver's arch_type (e.g. "ncv2"), read once per process; "" when unreadable."""
    try:
        with open(path) as f:
            return f.read().strip().lower()
    except OSError:
        return ""


def output_layout(query: torch.Tensor) -> str:
    """``bshd`` when q is a (B, H, S, D) view of a contiguous (B, S, H, D) buffer, else ``bhsd``.

    A q that is contiguous both ways (H == 1 or S == 1) counts as ``bhsd``.
    """
    if not query.is_contiguous() and query.transpose(1, 2).is_contiguous():
        return LAYOUT_BSHD
    return LAYOUT_BHSD


def empty_output(query: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """An uninitialised (B, Hq, Sq, Dv) output with the strides of q's layout."""
    batch, heads, q_len, _ = query.shape
    v_dim = value.shape[-1]
    if output_layout(query) == LAYOUT_BSHD:
        return query.new_empty((batch, q_len, heads, v_dim)).transpose(1, 2)
    return query.new_empty((batch, heads, q_len, v_dim))


def to_kernel_layout(query, key, value):
    """(q, k, v, layout) as the kernel takes them; see the module docstring."""
    layout = output_layout(query)
    if layout == LAYOUT_BSHD:
        return (query.transpose(1, 2), key.transpose(1, 2).contiguous(), value.transpose(1, 2).contiguous(),
                layout)
    return query.contiguous(), key.contiguous(), value.contiguous(), layout


def from_kernel_layout(out: torch.Tensor, layout: str) -> torch.Tensor:
    """The kernel's output as a (B, H, S, D) tensor (a transpose view for ``bshd``)."""
    return out.transpose(1, 2) if layout == LAYOUT_BSHD else out


def device_kernel_module():
    """kernels/attention.py for ``neuron`` tensors, imported with the real NKI (Trainium host)."""
    try:
        from ._nki import attention
    except ImportError as err:
        raise RuntimeError(f"neuron_vit_attn: cannot import the NKI kernel ({err}); {_NKI_HELP}") from err
    return attention


def sim_kernel_module():
    """kernels/attention.py with nkisim standing in for ``nki`` (unless the real NKI is installed)."""
    try:
        import nkisim
    except ImportError as err:
        raise RuntimeError(_NKISIM_HELP) from err
    nkisim.install()
    from ._nki import attention
    return attention


def device_kernel():
    """The ``@nki.jit`` attention kernel, called directly with ``neuron`` tensors, launched on as many
    physical cores as the runtime's logical core has (``logical_core_degree(on_device=True)``)."""
    return device_kernel_module().attention_fwd[logical_core_degree(on_device=True)]


def simulated_kernel():
    """The same kernel wrapped by ``nki.simulate`` (torch CPU tensors in and out)."""
    module = sim_kernel_module()
    import nki
    return nki.simulate(module.attention_fwd[logical_core_degree()])


def kv_budget_reason(kernel_module, query, key) -> str | None:
    """The kernel keeps one kv head's K^T and V resident in SBUF: too many keys for that budget is
    a case for the reference. The kernel module's public ``kv_fits`` decides (the same check as its
    trace-time assert)."""
    head_dim, kv_len = query.shape[-1], key.shape[2]
    if not kernel_module.kv_fits(kv_len, head_dim, query.element_size()):
        return (f"{kv_len} keys of head_dim {head_dim} (resident K/V exceed the kernel's SBUF budget of "
                f"{kernel_module.KV_RESIDENT_BYTES} B per partition)")
    return None


def run_kernel(kernel, query, key, value, mask, scale: float, is_causal: bool, return_lse: bool):
    """Call the NKI kernel with q/k/v in q's layout; returns (out (B, Hq, Sq, D) in q's layout, lse or
    None when not requested)."""
    q, k, v, layout = to_kernel_layout(query, key, value)
    result = kernel(q, k, v, mask, scale=scale, is_causal=is_causal, layout=layout, return_lse=return_lse)
    out, lse = result if return_lse else (result, None)
    return from_kernel_layout(out, layout), lse
