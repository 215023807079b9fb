"""Per-instruction cycle formulas of nkisim.cost.engines against nki-reference.md 4.3 (exact
integers: the formulas are the spec, so the tests compare cycles, not timings)."""

import pytest

from nkisim.cost import constants as C
from nkisim.cost.engines import compute_cycles
from cost_synthetic import elementwise, instruction, matmul, operand

TRN1, TRN2, TRN3 = (C.TARGETS[t] for t in ("trn1", "trn2", "trn3"))


def cycles(instr, target=TRN2):
    value, known = compute_cycles(instr, target)
    assert known, f"{instr.name} should have a published formula"
    return value


@pytest.mark.parametrize("m, n, expected", [(128, 512, 512), (128, 128, 128), (128, 32, 64), (16, 8, 16), (64, 1, 64)])
def test_matmul_is_max_of_min64_stationary_and_moving(m, n, expected):
    assert cycles(matmul(m=m, n=n)) == expected


def test_matmul_fp32_is_four_times_slower_and_transpose_mode_two():
    assert cycles(matmul(dtype="float32")) == 4 * 512
    t = matmul(m=128, n=128, dtype="float32")
    t.attrs["is_transpose"] = True
    assert cycles(t, TRN2) == 2 * 128          # v3+: transpose mode 2x faster for fp32
    assert cycles(t, TRN1) == 4 * 128


def test_tensor_tensor_variants():
    # fp32 SBUF+SBUF: 2N; one PSUM + one SBUF input: N (4.3a).
    both_sbuf = elementwise("tensor_tensor", "vector", (128, 512), "float32", n_inputs=2, op="maximum")
    assert cycles(both_sbuf, TRN1) == 2 * 512
    mixed = instruction("tensor_tensor", "vector",
                        [operand("data1", (128, 512), "float32", "psum"), operand("data2", (128, 512), "float32")],
                        [operand("dst", (128, 512), "float32", write=True)], op="add")
    assert cycles(mixed, TRN1) == 512
    # all-bf16 SBUF add: N on v2; v3 perf mode halves it (both inputs SBUF, all 16-bit).
    add16 = elementwise("tensor_tensor", "vector", (128, 512), "bfloat16", n_inputs=2, op="add")
    assert cycles(add16, TRN1) == 512
    assert cycles(add16, TRN2) == 256


def test_vector_perf_mode_for_copies_on_trn2_only():
    copy16 = elementwise("tensor_copy", "vector", (128, 1024), "bfloat16")
    assert cycles(copy16, TRN1) == 1024
    assert cycles(copy16, TRN2) == 256            # 4x: SBUF->SBUF, 16-bit, unit stride
    from_psum = elementwise("tensor_copy", "vector", (128, 1024), "bfloat16", src_buffer="psum")
    assert cycles(from_psum, TRN2) == 512          # 2x: one side PSUM
    fp32 = elementwise("tensor_copy", "vector", (128, 1024), "float32")
    assert cycles(fp32, TRN2) == 1024              # no perf mode for fp32


def test_scalar_engine_activation_and_reduce():
    act = elementwise("activation", "scalar", (128, 512), "float32", op="exp")
    assert cycles(act) == 512
    red = elementwise("activation", "scalar", (128, 512), "float32", op="exp", reduce=True, reduce_cmd=3)
    assert cycles(red) == 512 + C.MIN_II          # activation_reduce = max(MIN_II, N) + MIN_II


def test_min_ii_and_tiny_overhead():
    # N = 32: max(MIN_II, 32) = 64, plus the ~100-cycle static overhead of tiny instructions.
    tiny = elementwise("activation", "scalar", (128, 32), "float32", op="exp")
    assert cycles(tiny) == C.MIN_II + C.STATIC_OVERHEAD_CYCLES
    assert cycles(elementwise("activation", "scalar", (128, 128), "float32", op="exp")) == 128


def test_gpsimd_start_cost_and_reciprocal():
    iota = instruction("iota", "gpsimd", writes=[operand("dst", (128, 512), "int32", write=True)])
    assert cycles(iota) == C.GPSIMD_START + 512
    assert cycles(elementwise("reciprocal", "vector", (128, 512), "float32")) == 8 * 512


def test_tensor_reduce_and_memset():
    red = instruction("tensor_reduce", "vector", [operand("data", (128, 512), "bfloat16")],
                      [operand("dst", (128, 1), "bfloat16", write=True)], op="maximum")
    assert cycles(red) == 256                      # bf16 max: N/2
    zero = instruction("memset", "vector", writes=[operand("dst", (128, 512), "bfloat16", write=True)], value=0.0)
    assert cycles(zero) == 256                     # zero into bf16: N/2


def test_strided_access_halves_bandwidth():
    strided = instruction("tensor_copy", "vector", [operand("src", (128, 512), "float32", stride=8)],
                          [operand("dst", (128, 512), "float32", write=True)])
    assert cycles(strided, TRN1) == 2 * 512


def test_unknown_instruction_gets_documented_default():
    odd = elementwise("some_future_instruction", "vector", (128, 300), "float32")
    value, known = compute_cycles(odd, TRN2)
    assert not known and value == 300
