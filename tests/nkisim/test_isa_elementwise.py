"""Semantics of the elementwise instructions against NumPy (fp32 compute, RNE rounding to dst)."""

import ml_dtypes
import numpy as np
import pytest

from nkisim_helpers import BF16, nisa, nl, run_tile

RNG = np.random.default_rng(0)


def _x(shape=(128, 64), dtype=np.float32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def test_tensor_tensor_ops_and_bf16_rne_rounding():
    a, b = _x(), _x()

    def body(ta, tb):
        outs = []
        for op, dtype in ((nl.add, nl.bfloat16), (nl.subtract, nl.float32), (nl.maximum, nl.float32),
                          (nl.greater_equal, nl.float32)):
            o = nl.ndarray(ta.shape, dtype)
            nisa.tensor_tensor(dst=o, data1=ta, data2=tb, op=op)
            outs.append(o)
        return outs

    add, sub, mx, ge = run_tile(body, a, b, out_shapes=[a.shape] * 4, out_dtypes=[BF16, np.float32, np.float32,
                                                                                  np.float32])
    # bf16 dst: the fp32 sum rounded once to nearest even, bit for bit as ml_dtypes does it.
    np.testing.assert_array_equal(add.view(np.uint16), (a + b).astype(BF16).view(np.uint16))
    np.testing.assert_array_equal(sub, a - b)
    np.testing.assert_array_equal(mx, np.maximum(a, b))
    np.testing.assert_array_equal(ge, (a >= b).astype(np.float32))   # comparisons write 1/0


def test_rne_tie_rounds_to_even():
    # 1 + 2^-8 is exactly halfway between bf16 neighbours 1 and 1 + 2^-7: RNE picks 1 (even mantissa).
    tie = np.full((1, 2), 1 + 2 ** -8, np.float32)
    tie[0, 1] = 1 + 3 * 2 ** -8            # halfway between 1+2^-7 and 1+2^-6: rounds up to the even one

    def body(t):
        o = nl.ndarray(t.shape, nl.bfloat16)
        nisa.tensor_copy(dst=o, src=t)
        return o

    out = run_tile(body, tie, out_shapes=[(1, 2)], out_dtypes=[BF16]).astype(np.float32)
    np.testing.assert_array_equal(out, [[1.0, 1 + 2 ** -6]])


def test_tensor_scalar_two_ops_reverse_and_vector_operand():
    a = _x()
    col = _x((128, 1))

    def body(t, c):
        o1 = nl.ndarray(t.shape, nl.float32)
        nisa.tensor_scalar(dst=o1, data=t, op0=nl.subtract, operand0=c, op1=nl.multiply, operand1=3.0)
        o2 = nl.ndarray(t.shape, nl.float32)
        nisa.tensor_scalar(dst=o2, data=t, op0=nl.subtract, operand0=2.0, reverse0=True, op1=nl.subtract,
                           operand1=1.0, reverse1=True)
        o3 = nl.ndarray(t.shape, nl.float32)
        nisa.tensor_scalar(dst=o3, data=t, op0=nl.abs, operand0=None)
        return o1, o2, o3

    o1, o2, o3 = run_tile(body, a, col, out_shapes=[a.shape] * 3)
    np.testing.assert_allclose(o1, (a - col) * np.float32(3.0), rtol=1e-6)
    np.testing.assert_allclose(o2, 1.0 - (2.0 - a), rtol=1e-6)
    np.testing.assert_array_equal(o3, np.abs(a))


def test_tensor_scalar_bitvec_on_integer_bits():
    a = RNG.integers(0, 2 ** 16, (4, 8)).astype(np.int32)

    def body(t):
        o = nl.ndarray(t.shape, nl.int32)
        nisa.tensor_scalar(dst=o, data=t, op0=nl.bitwise_and, operand0=0xFF, op1=nl.left_shift, operand1=2)
        return o

    np.testing.assert_array_equal(run_tile(body, a, out_shapes=[a.shape], out_dtypes=[np.int32]), (a & 0xFF) << 2)


def test_scalar_tensor_tensor():
    a, b, col = _x(), _x(), _x((128, 1))

    def body(ta, tb, c):
        o = nl.ndarray(ta.shape, nl.float32)
        nisa.scalar_tensor_tensor(dst=o, data=ta, op0=nl.multiply, operand0=c, op1=nl.add, operand1=tb)
        o2 = nl.ndarray(ta.shape, nl.float32)
        nisa.scalar_tensor_tensor(dst=o2, data=ta, op0=nl.subtract, operand0=1.0, op1=nl.subtract, operand1=tb,
                                  reverse0=True, reverse1=True)
        return o, o2

    o, o2 = run_tile(body, a, b, col, out_shapes=[a.shape] * 2)
    np.testing.assert_allclose(o, a * col + b, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(o2, b - (1.0 - a), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op, ref", [(nl.add, np.sum), (nl.maximum, np.max), (nl.minimum, np.min)])
def test_tensor_reduce_trailing_axes_negate_keepdims(op, ref):
    a = _x((64, 4, 8))

    def body(t):
        o1 = nl.ndarray((64, 4), nl.float32)
        nisa.tensor_reduce(dst=o1, op=op, data=t, axis=2)
        o2 = nl.ndarray((64, 1), nl.float32)
        nisa.tensor_reduce(dst=o2, op=op, data=t, axis=(1, 2), negate=True, keepdims=True)
        return o1, o2

    o1, o2 = run_tile(body, a, out_shapes=[(64, 4), (64, 1)])
    np.testing.assert_allclose(o1, ref(a, axis=2), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(o2[:, 0], -ref(a, axis=(1, 2)), rtol=1e-5, atol=1e-5)


def test_tensor_reduce_rejects_non_trailing_and_partition_axes():
    from nkisim.errors import ShapeError
    a = _x((8, 4, 4))
    with pytest.raises(ShapeError, match="trailing free axes"):
        run_tile(lambda t: nisa.tensor_reduce(dst=nl.ndarray((8, 4), nl.float32), op=nl.add, data=t, axis=1),
                 a, out_shapes=[])
    with pytest.raises(ShapeError, match="partition dim"):
        run_tile(lambda t: nisa.tensor_reduce(dst=nl.ndarray((1, 16), nl.float32), op=nl.add, data=t, axis=0),
                 a, out_shapes=[])


def test_tensor_copy_casts_and_is_bit_exact_for_equal_dtypes():
    a = _x()
    a[0, 0] = np.nan

    def body(t):
        same = nl.ndarray(t.shape, nl.float32)
        nisa.tensor_copy(dst=same, src=t)
        half = nl.ndarray(t.shape, nl.float16)
        nisa.tensor_copy(dst=half, src=t, engine=nisa.engine.scalar)
        ints = nl.ndarray(t.shape, nl.int8)
        nisa.tensor_copy(dst=ints, src=t)
        return same, half, ints

    same, half, ints = run_tile(body, a * 50, out_shapes=[a.shape] * 3, out_dtypes=[np.float32, np.float16, np.int8])
    np.testing.assert_array_equal(same.view(np.uint32), (a * 50).view(np.uint32))
    np.testing.assert_array_equal(half[1:], (a * 50).astype(np.float16)[1:])
    # fp32 -> int: round to nearest even and saturate; NaN -> 0
    expected = np.clip(np.rint(a * 50), -128, 127)
    expected[0, 0] = 0
    np.testing.assert_array_equal(ints, expected.astype(np.int8))


def test_memset_and_reciprocal_and_iota():
    a = _x() + 3

    def body(t):
        m = nl.ndarray(t.shape, nl.bfloat16)
        nisa.memset(dst=m, value=1.5)
        r = nl.ndarray(t.shape, nl.float32)
        nisa.reciprocal(dst=r, data=t)
        io = nl.ndarray((128, 2, 3), nl.int32)
        nisa.iota(dst=io, pattern=[[10, 2], [1, 3]], offset=7, channel_multiplier=100)
        return m, r, io

    m, r, io = run_tile(body, a, out_shapes=[a.shape, a.shape, (128, 2, 3)], out_dtypes=[BF16, np.float32, np.int32])
    assert (m.astype(np.float32) == 1.5).all()
    np.testing.assert_allclose(r, 1 / a, rtol=1e-6)
    p, w, x = np.meshgrid(np.arange(128), np.arange(2), np.arange(3), indexing="ij")
    np.testing.assert_array_equal(io, 7 + 100 * p + 10 * w + x)


def test_affine_select_causal_mask():
    a = _x((128, 128))

    def body(t):
        o = nl.ndarray(t.shape, nl.float32)
        nisa.affine_select(dst=o, pattern=[[-1, 128]], channel_multiplier=1, on_true_tile=t,
                           on_false_value=-9984.0, cmp_op=nl.greater_equal, offset=0)
        return o

    out = run_tile(body, a, out_shapes=[a.shape])
    keep = np.arange(128)[:, None] - np.arange(128)[None, :] >= 0
    np.testing.assert_array_equal(out, np.where(keep, a, -9984.0))


def test_tensor_copy_predicated():
    a, b = _x((16, 8)), _x((16, 8))
    pred = (RNG.random((16, 8)) > 0.5).astype(np.uint8)

    def body(ta, tb, tp):
        nisa.tensor_copy_predicated(dst=tb, src=ta, predicate=tp)
        o = nl.ndarray(ta.shape, nl.float32)
        nisa.memset(dst=o, value=0.0)
        nisa.tensor_copy_predicated(dst=o, src=7.0, predicate=tp, reverse_pred=True)
        return tb, o

    out, scalar = run_tile(body, a, b, pred, out_shapes=[(16, 8)] * 2)
    np.testing.assert_array_equal(out, np.where(pred != 0, a, b))
    np.testing.assert_array_equal(scalar, np.where(pred == 0, 7.0, 0.0))


def test_integer_tensor_tensor_is_exact_on_gpsimd():
    a = np.array([[2 ** 30 + 1, 7]], dtype=np.int32)
    b = np.array([[1, 2 ** 25 + 3]], dtype=np.int32)

    def body(ta, tb):
        o = nl.ndarray(ta.shape, nl.int32)
        nisa.tensor_tensor(dst=o, data1=ta, data2=tb, op=nl.add)
        return o

    np.testing.assert_array_equal(run_tile(body, a, b, out_shapes=[a.shape], out_dtypes=[np.int32]), a + b)


def test_fp8_storage_roundtrip():
    a = _x((4, 8))

    def body(t):
        o = nl.ndarray(t.shape, nl.float8_e4m3)
        nisa.tensor_copy(dst=o, src=t)
        return o

    out = run_tile(body, a, out_shapes=[a.shape], out_dtypes=[ml_dtypes.float8_e4m3])
    np.testing.assert_array_equal(out.view(np.uint8), a.astype(ml_dtypes.float8_e4m3).view(np.uint8))


def test_precise_fp_off_keeps_fp32_until_the_output(monkeypatch):
    """NKI_PRECISE_FP=0: bf16 tiles hold fp32 values; the output is rounded to bf16 once on return."""
    a = _x((4, 8))
    tiny = np.float32(2 ** -10)       # lost when added to ~1 in bf16, kept in fp32

    def body(t):
        b = nl.ndarray(t.shape, nl.bfloat16)
        nisa.tensor_scalar(dst=b, data=t, op0=nl.add, operand0=1.0)
        c = nl.ndarray(t.shape, nl.bfloat16)
        nisa.tensor_scalar(dst=c, data=b, op0=nl.add, operand0=float(tiny))
        d = nl.ndarray(t.shape, nl.float32)
        nisa.tensor_scalar(dst=d, data=c, op0=nl.subtract, operand0=1.0)
        return d

    precise = run_tile(body, a, out_shapes=[a.shape])
    monkeypatch.setenv("NKI_PRECISE_FP", "0")
    widened = run_tile(body, a, out_shapes=[a.shape])
    np.testing.assert_allclose(widened, (a + 1 + tiny) - 1, rtol=1e-6, atol=1e-6)
    assert not np.allclose(precise, widened, rtol=0, atol=1e-6)


def test_tfloat32_rounds_to_nearest_even():
    x = np.array([[1 + 2 ** -11, 1 + 3 * 2 ** -11, -(1 + 2 ** -11) - 2 ** -20]], np.float32)

    def body(t):
        o = nl.ndarray(t.shape, nl.tfloat32)
        nisa.tensor_copy(dst=o, src=t)
        back = nl.ndarray(t.shape, nl.float32)
        nisa.tensor_copy(dst=back, src=o)
        return back

    out = run_tile(body, x, out_shapes=[x.shape])
    # tf32 keeps 10 mantissa bits: ties go to the even neighbour, anything above a tie rounds away.
    np.testing.assert_array_equal(out[0], [1.0, 1 + 2 ** -9, -(1 + 2 ** -10)])
