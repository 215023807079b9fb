"""The Profile API: trace.estimate, nkisim.profile, roofline helper, MFU, summary."""

import ml_dtypes
import numpy as np
import pytest

import nkisim
from nkisim.cost import Profile, constants as C, estimate, roofline
from cost_synthetic import elementwise

nkisim.install()
from nkisim.examples.matmul import matmul_tiled  # noqa: E402


@pytest.fixture(scope="module")
def operands():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((256, 256)).astype(ml_dtypes.bfloat16),
            rng.standard_normal((256, 512)).astype(ml_dtypes.bfloat16))


def test_profile_returns_the_kernel_outputs_and_an_estimate(operands):
    out, profile = nkisim.profile(matmul_tiled, target="trn2")(*operands)
    np.testing.assert_array_equal(out, nkisim.simulate(matmul_tiled)(*operands))
    assert isinstance(profile, Profile) and profile.target == "trn2"
    assert profile.flops == 2 * 256 * 256 * 512
    # 2 row blocks x 2 K slices, each reloading a [128, 128] and a [128, 512] bf16 tile, plus the bf16 output.
    assert profile.hbm_bytes == 2 * 2 * (128 * 128 + 128 * 512) * 2 + 256 * 512 * 2
    assert set(profile.engine_busy_us) == {"tensor", "vector", "scalar", "gpsimd", "dma"}
    assert profile.time_us >= max(profile.engine_busy_us.values())
    peak = C.TARGETS["trn2"].peak_flops("bfloat16")
    assert profile.mfu == pytest.approx(profile.flops / (profile.time_us * 1e-6 * peak))
    assert profile.time_us >= profile.roofline_us


def test_trace_estimate_matches_profile(operands):
    with nkisim.trace() as t:
        nkisim.simulate(matmul_tiled)(*operands)
    _, profile = nkisim.profile(matmul_tiled, target="trn3")(*operands)
    assert t.estimate("trn3").time_us == pytest.approx(profile.time_us)


def test_targets_differ_in_the_expected_direction(operands):
    times = {t: nkisim.profile(matmul_tiled, target=t)(*operands)[1].time_us for t in ("trn1", "trn2", "trn3")}
    assert times["trn3"] < times["trn2"]          # same clocks for TensorE, faster DMA and HBM on trn3


def test_summary_names_bounding_engine_and_critical_path(operands):
    _, profile = nkisim.profile(matmul_tiled, target="trn2")(*operands)
    text = profile.summary()
    assert "ESTIMATE on trn2" in text and "bounding engine: DMA" in text and "critical path:" in text
    assert profile.bounding_engine == "dma"


def test_lnc2_programs_run_on_two_cores(operands):
    _, one = nkisim.profile(matmul_tiled, target="trn2")(*operands)
    _, two = nkisim.profile(matmul_tiled[2], target="trn2")(*operands)
    assert two.cores == 2 and two.time_us == pytest.approx(one.time_us)    # same work on each core
    assert two.mfu == pytest.approx(one.mfu)                               # twice the FLOPs, twice the peak


def test_roofline_helper_for_attention_on_trn2():
    b, h, s, d = 8, 12, 197, 64
    flops = 4 * b * h * s * s * d
    qkvo_bytes = 4 * b * s * h * d * 2
    bound = roofline(flops, qkvo_bytes, "trn2", "bfloat16")
    assert bound.compute_us == pytest.approx(flops / 78.6432e12 * 1e6)
    assert bound.memory_us == pytest.approx(qkvo_bytes / 362.5e9 * 1e6)
    # S=197: 12 us of math vs 27 us of q, k, v, o: memory-bound.
    assert bound.time_us == max(bound.compute_us, bound.memory_us) and bound.bound == "memory"


def test_unknown_instructions_are_priced_and_reported():
    profile = estimate([elementwise("future_op", "vector", (128, 256), "float32")], "trn2")
    assert profile.time_us == pytest.approx(256 / 0.96 / 1e3)
    assert profile.unknown_instructions == {"future_op": 1} and "future_op x1" in profile.summary()


def test_unknown_target_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown target"):
        estimate([], "trn9")


def test_an_engine_new_to_the_model_does_not_crash_the_estimate():
    odd = elementwise("barrier_like", "sync", (128, 64), "float32")
    profile = estimate([odd], "trn2")
    assert profile.time_us > 0 and profile.unknown_instructions == {"barrier_like": 1}
    assert "sync" in profile.engine_busy_us
