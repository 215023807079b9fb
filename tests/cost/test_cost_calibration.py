"""Calibration against the public measured points (nki-reference.md 4.3b/c); deviations stated.

| point (public measurement) | model estimate | deviation |
|---|---|---|
| hand-tuned 2048^3 bf16 matmul, trn2: 90.9% MFU | ``matmul_streamed`` 89.7% MFU | -1.2 points |
| same, loads hoisted only ("84%" stage of the same report) | ``matmul_staged`` 82.3% | -1.7 points |
| naive tiled matmul (reloads both tiles per matmul; report's first stage 16%) | ``matmul_tiled`` 28.5% | +12.5 points |
| tiny dependent ScalarE instructions, II 189 ns (trn1 clock) | 188.6 ns | -0.2% |

(The 32 KiB DMA point is in test_cost_dma.py.) The kernels are in cost_calibration_kernels.py, written from
the public docs' matmul tutorial idioms; the model constants come from the documents, not from
these kernels. Assertions allow +-5 MFU points for the tuned kernel (the model has no HBM page
or instruction-fetch effects) and require the naive kernel below half the tuned one.
"""

import ml_dtypes
import numpy as np
import pytest

import nkisim
from nkisim.cost import constants as C
from nkisim.cost.schedule import schedule_program

nkisim.install()
import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402
from cost_calibration_kernels import matmul_staged, matmul_streamed  # noqa: E402
from nkisim.examples.matmul import matmul_tiled  # noqa: E402

SIZE = 2048


@pytest.fixture(scope="module")
def operands():
    rng = np.random.default_rng(0)
    lhsT = rng.standard_normal((SIZE, SIZE)).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((SIZE, SIZE)).astype(ml_dtypes.bfloat16)
    return lhsT, rhs


@pytest.fixture(scope="module")
def mfu(operands):
    lhsT, rhs = operands
    ref = lhsT.astype(np.float32).T @ rhs.astype(np.float32)
    result = {}
    for kernel in (matmul_streamed, matmul_staged, matmul_tiled):
        out, profile = nkisim.profile(kernel, target="trn2")(lhsT, rhs)
        # bf16 output of an fp32 accumulation: one rounding, relative error <= 2^-8 of the largest value.
        assert np.abs(out.astype(np.float32) - ref).max() <= 2 ** -8 * np.abs(ref).max()
        assert profile.flops == 2 * SIZE ** 3
        result[kernel.__name__] = profile.mfu
    return result


def test_tuned_matmul_lands_near_the_measured_91_percent(mfu):
    assert mfu["matmul_streamed"] == pytest.approx(C.MEASURED_MATMUL_2048_MFU, abs=0.05)


def test_hoisted_loads_only_is_lower_than_streamed(mfu):
    assert 0.70 < mfu["matmul_staged"] < mfu["matmul_streamed"]


def test_naive_matmul_estimates_far_lower(mfu):
    assert mfu["matmul_tiled"] < 0.5 * mfu["matmul_streamed"]


@nki.jit
def dependent_tiny_chain(x):
    a = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    for _ in range(8):
        b = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=b, op=nl.copy, data=a)   # each reads what the previous one wrote
        a = b
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=a)
    return out


def test_tiny_dependent_scalar_instructions_match_the_perf_guide():
    with nkisim.trace() as t:
        nkisim.simulate(dependent_tiny_chain)(np.zeros((128, 16), np.float32))
    slots = [s for s in schedule_program(t.instructions, C.TARGETS["trn1"]).slots if s.instr.name == "activation"]
    intervals = [b.start - a.start for a, b in zip(slots[1:], slots[2:])]     # steady state
    ii_ns = sum(intervals) / len(intervals)
    assert ii_ns == pytest.approx(C.MEASURED_TINY_DEPENDENT_II_NS, rel=0.02)
