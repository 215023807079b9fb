"""Accumulator registers (ScalarE activation, VectorE reduce family), bn_stats/bn_aggr, max8,
activation functions and scale/bias rules, dma_copy and dma_transpose."""

import numpy as np
import pytest

from nkisim.errors import ShapeError, TargetError

from nkisim_helpers import BF16, nisa, nki, nl, run_tile

RNG = np.random.default_rng(2)
RC = nisa.reduce_cmd


def _x(shape=(128, 64), scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def test_activation_scale_bias_and_fused_row_sum():
    a, scale, bias = _x(), _x((128, 1)), _x((128, 1))

    def body(t, s, b):
        o = nl.ndarray(t.shape, nl.float32)
        r = nl.ndarray((128, 1), nl.float32)
        nisa.activation(dst=o, op=nl.exp, data=t, bias=b, scale=s, reduce_op=nl.add, reduce_res=r,
                        reduce_cmd=RC.reset_reduce)
        o2 = nl.ndarray(t.shape, nl.bfloat16)
        nisa.activation(dst=o2, op=nl.gelu_apprx_tanh, data=t, bias=0.5, scale=2.0)
        return o, r, o2

    o, r, o2 = run_tile(body, a, scale, bias, out_shapes=[a.shape, (128, 1), a.shape],
                        out_dtypes=[np.float32, np.float32, BF16])
    ref = np.exp(a * scale + bias)
    np.testing.assert_allclose(o, ref, rtol=1e-6)
    np.testing.assert_allclose(r[:, 0], ref.sum(axis=1), rtol=1e-5)
    x = (a * 2 + 0.5).astype(np.float64)
    gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    # bf16 output: one rounding, relative error <= 2^-8
    np.testing.assert_allclose(o2.astype(np.float32), gelu, rtol=2 ** -8, atol=1e-6)


def test_activation_accumulates_across_instructions():
    a, b = _x(), _x()

    def body(ta, tb):
        o = nl.ndarray(ta.shape, nl.float32)
        nisa.activation(dst=o, op=nl.square, data=ta, reduce_op=nl.add, reduce_cmd=RC.reset_reduce)
        r = nl.ndarray((128, 1), nl.float32)
        nisa.activation(dst=o, op=nl.square, data=tb, reduce_op=nl.add, reduce_res=r, reduce_cmd=RC.reduce)
        r2 = nl.ndarray((128, 1), nl.float32)
        nisa.activation(dst=o, op=nl.copy, data=tb, reduce_cmd=RC.reset, reduce_res=r2)
        return r, r2

    r, r2 = run_tile(body, a, b, out_shapes=[(128, 1)] * 2)
    np.testing.assert_allclose(r[:, 0], (a ** 2).sum(1) + (b ** 2).sum(1), rtol=1e-5)
    assert (r2 == 0).all()


def test_activation_bias_rules_per_target(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    with pytest.raises(TargetError, match="scalar bias needs trn2 or newer"):
        run_tile(lambda t: nisa.activation(dst=t, op=nl.exp, data=t, bias=1.0), _x(), out_shapes=[])
    with pytest.raises(Exception, match="operand 'scale' is bfloat16; scalar/vector operands must be float32"):
        run_tile(lambda t, s: nisa.activation(dst=t, op=nl.exp, data=t, scale=s), _x(), _x((128, 1)).astype(BF16),
                 out_shapes=[])


def test_tensor_scalar_reduce_with_load_reduce_and_negate():
    a, init = _x(), _x((128, 1))

    def body(t, i):
        o = nl.ndarray(t.shape, nl.float32)
        r = nl.ndarray((128, 1), nl.float32)
        nisa.tensor_scalar_reduce(dst=o, data=t, op0=nl.multiply, operand0=2.0, reduce_op=nl.maximum, reduce_res=r)
        r2 = nl.ndarray((128, 1), nl.float32)
        nisa.tensor_scalar_reduce(dst=o, data=t, op0=nl.add, operand0=1.0, reduce_op=nl.add, reduce_res=r2,
                                  reduce_cmd=RC.load_reduce, reduce_init=i, reduce_res_negate=True)
        return o, r, r2

    o, r, r2 = run_tile(body, a, init, out_shapes=[a.shape, (128, 1), (128, 1)])
    np.testing.assert_allclose(o, a + 1, rtol=1e-6)
    np.testing.assert_allclose(r[:, 0], (2 * a).max(1), rtol=1e-6)
    np.testing.assert_allclose(r2[:, 0], -(init[:, 0] + (a + 1).sum(1)), rtol=1e-5)


def test_vector_registers_are_shared_and_undefined_after_idle():
    a = _x()

    def body(t):
        o = nl.ndarray(t.shape, nl.float32)
        r = nl.ndarray((128, 1), nl.float32)
        nisa.tensor_scalar_reduce(dst=o, data=t, op0=nl.multiply, operand0=1.0, reduce_op=nl.maximum)
        nisa.select_reduce(dst=o, predicate=nl.zeros(t.shape, nl.uint8), on_true=t, on_false=100.0,
                           reduce_res=r, reduce_cmd=RC.reduce)          # max(previous max, 100)
        r2 = nl.ndarray((128, 1), nl.float32)
        nisa.select_reduce(dst=o, predicate=nl.ones(t.shape, nl.uint8), on_true=t, on_false=0.0)   # idle
        nisa.tensor_scalar_reduce(dst=o, data=t, op0=nl.add, operand0=0.0, reduce_op=nl.maximum, reduce_res=r2,
                                  reduce_cmd=RC.reduce)
        return r, r2

    r, r2 = run_tile(body, a, out_shapes=[(128, 1)] * 2)
    assert (r == 100.0).all()
    assert np.isnan(r2).all()       # reduce on top of registers left undefined by an idle instruction


def test_vector_idle_with_reduce_res_is_rejected():
    with pytest.raises(ShapeError, match="reduce_res with reduce_cmd=idle"):
        run_tile(lambda t: nisa.select_reduce(dst=t, predicate=nl.ones(t.shape, nl.uint8), on_true=t, on_false=0.0,
                                              reduce_res=nl.ndarray((128, 1), nl.float32)), _x(), out_shapes=[])


def test_range_select_keeps_window_and_row_max():
    a = _x((128, 256))
    lo = np.full((128, 1), 10, np.float32)
    hi = (np.arange(128, dtype=np.float32)[:, None] + 64)

    def body(t, b0, b1):
        o = nl.ndarray(t.shape, nl.float32)
        r = nl.ndarray((128, 1), nl.float32)
        nisa.range_select(dst=o, on_true_tile=t, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=b0, bound1=b1,
                          reduce_res=r, range_start=16)
        return o, r

    o, r = run_tile(body, a, lo, hi, out_shapes=[a.shape, (128, 1)])
    j = 16 + np.arange(256)[None, :]
    ref = np.where((j >= lo) & (j < hi), a, np.finfo(np.float32).min)
    np.testing.assert_array_equal(o, ref)
    np.testing.assert_array_equal(r[:, 0], ref.max(1))


def test_range_select_needs_trn2_and_fp32_min(monkeypatch):
    args = dict(comp_op0=nl.greater_equal, comp_op1=nl.less)
    with pytest.raises(ShapeError, match="operand 'on_false_value' value is 0.0, limit exactly FP32_MIN"):
        run_tile(lambda t, b: nisa.range_select(dst=t, on_true_tile=t, bound0=b, bound1=b, on_false_value=0.0, **args),
                 _x(), _x((128, 1)), out_shapes=[])
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    with pytest.raises(TargetError, match="range_select needs NeuronCore-v3"):
        run_tile(lambda t, b: nisa.range_select(dst=t, on_true_tile=t, bound0=b, bound1=b, **args),
                 _x(), _x((128, 1)), out_shapes=[])


def test_exponential_is_trn3_only_and_sums(monkeypatch):
    a, mx = _x(), _x((128, 1))

    def body(t, m):
        o = nl.ndarray(t.shape, nl.float32)
        r = nl.ndarray((128, 1), nl.float32)
        nisa.exponential(dst=o, src=t, max_value=m, reduce_res=r, reduce_cmd=RC.reset_reduce)
        return o, r

    with pytest.raises(TargetError, match="exponential needs NeuronCore-v4 \\(trn3\\)"):
        run_tile(body, a, mx, out_shapes=[a.shape, (128, 1)])
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    o, r = run_tile(body, a, mx, out_shapes=[a.shape, (128, 1)])
    np.testing.assert_allclose(o, np.exp(a - mx), rtol=1e-6)
    np.testing.assert_allclose(r[:, 0], np.exp(a - mx).sum(1), rtol=1e-5)


def test_bn_stats_bn_aggr_mean_and_population_variance():
    a = _x((128, 1024), scale=3.0) + 1.5

    def body(t):
        stats = nl.ndarray((128, 12), nl.float32)
        for c in range(2):
            nisa.bn_stats(dst=stats[:, 6 * c:6 * (c + 1)], data=t[:, 512 * c:512 * (c + 1)])
        mv = nl.ndarray((128, 2), nl.float32)
        nisa.bn_aggr(dst=mv, data=stats)
        return stats, mv

    stats, mv = run_tile(body, a, out_shapes=[(128, 12), (128, 2)])
    first = a[:, :512]
    np.testing.assert_allclose(stats[:, :3], np.stack([np.full(128, 256.0), first[:, 0::2].mean(1),
                                                       first[:, 0::2].var(1) * 256], 1), rtol=1e-5)
    np.testing.assert_allclose(mv[:, 0], a.mean(1), rtol=1e-5)
    np.testing.assert_allclose(mv[:, 1], a.var(1), rtol=1e-4)


def test_bn_stats_limit_512():
    with pytest.raises(ShapeError, match="bn_stats: operand 'data' free size is 513, limit 512"):
        run_tile(lambda t: nisa.bn_stats(dst=nl.ndarray((128, 6), nl.float32), data=t), _x((128, 513)), out_shapes=[])


def test_max8():
    a = _x((16, 100))

    def body(t):
        o = nl.ndarray((16, 8), nl.float32)
        nisa.max8(dst=o, src=t)
        return o

    np.testing.assert_array_equal(run_tile(body, a, out_shapes=[(16, 8)]), -np.sort(-a, 1)[:, :8])


def test_dma_copy_casts_and_dma_transpose(monkeypatch):
    a = _x((32, 48))

    def kernel(x):
        t = nl.ndarray((32, 48), nl.bfloat16)
        nisa.dma_copy(dst=t, src=x)                       # fp32 -> bf16 through fp32 (RNE)
        tt = nl.ndarray((48, 32), nl.bfloat16)
        nisa.dma_transpose(dst=tt, src=t)
        out = nl.ndarray((48, 32), nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=tt)
        return out

    out = nki.simulate(kernel)(a)
    np.testing.assert_array_equal(out.view(np.uint16), a.astype(BF16).T.view(np.uint16))
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    with pytest.raises(TargetError, match="dma_transpose needs NeuronCore-v3"):
        nki.simulate(kernel)(a)


def test_find_index8_and_match_replace8_docstring_example():
    """nc_match_replace8 docstring: data [1,2,3,4,8,8,8,8,8,8,8], vals [3,8,8,8,8,8,8,8] -> dst_idx
    [2,10,9,8,7,6,5,4]; nc_find_index8 pairs duplicates ascending instead."""
    data = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8]], np.float32)
    vals = np.array([[3, 8, 8, 8, 8, 8, 8, 8]], np.float32)

    def body(d, v):
        idx = nl.ndarray((1, 8), nl.uint32)
        nisa.nc_find_index8(dst=idx, data=d, vals=v)
        rep = nl.ndarray((1, 11), nl.float32)
        ridx = nl.ndarray((1, 8), nl.uint32)
        nisa.nc_match_replace8(dst=rep, data=d, vals=v, imm=-1.0, dst_idx=ridx)
        return idx, rep, ridx

    idx, rep, ridx = run_tile(body, data, vals, out_shapes=[(1, 8), (1, 11), (1, 8)],
                              out_dtypes=[np.uint32, np.float32, np.uint32])
    np.testing.assert_array_equal(idx[0], [2, 4, 5, 6, 7, 8, 9, 10])
    np.testing.assert_array_equal(ridx[0], [2, 10, 9, 8, 7, 6, 5, 4])
    np.testing.assert_array_equal(rep[0], [1, 2, -1, 4, -1, -1, -1, -1, -1, -1, -1])


@pytest.mark.parametrize("src_shape,ok", [((16, 64), True), ((8, 64), False), ((4, 4, 64), True), ((3, 16, 64), False),
                                          ((2, 4, 64), False), ((16, 1, 64), True)])
def test_dma_transpose_hwdge_limits(src_shape, ok):
    """isa docstring: a hardware-DGE transpose needs 16 rows in 2-D; in 3-D/4-D src.shape[0] in
    {1, 2, 4, 8, 16} with src.shape[0] * src.shape[-2] % 16 == 0."""
    a = np.zeros(src_shape, np.float32).astype(BF16)
    axes = {2: (1, 0), 3: (2, 1, 0)}[len(src_shape)]

    def kernel(x):
        t = nl.ndarray(tuple(src_shape[i] for i in axes), nl.bfloat16)
        nisa.dma_transpose(dst=t, src=x, dge_mode=nisa.dge_mode.hwdge)
        return t

    if ok:
        nki.simulate(_to_hbm(kernel, axes, src_shape))(a)
    else:
        with pytest.raises(ShapeError, match="hwdge"):
            nki.simulate(_to_hbm(kernel, axes, src_shape))(a)


def test_dma_transpose_rejects_software_dge():
    a = np.zeros((16, 64), np.float32).astype(BF16)

    def kernel(x):
        t = nl.ndarray((64, 16), nl.bfloat16)
        nisa.dma_transpose(dst=t, src=x, dge_mode=nisa.dge_mode.swdge)
        return t

    with pytest.raises(ShapeError, match="direct DMA transpose takes dge_mode unknown or hwdge"):
        nki.simulate(_to_hbm(kernel, (1, 0), (16, 64)))(a)


def _to_hbm(kernel, axes, src_shape):
    """Wrap a kernel returning an SBUF tile so that the simulator gets an HBM output."""
    def wrapped(x):
        t = kernel(x)
        out = nl.ndarray(tuple(src_shape[i] for i in axes), nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out
    return wrapped
