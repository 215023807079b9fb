"""Scans, partition reduce, stream shuffle, activate2 (trn3) and the not-simulated APIs."""

import numpy as np
import pytest

from nkisim.errors import NotSimulatedError, TargetError

from nkisim_helpers import nisa, nl, run_tile

RNG = np.random.default_rng(5)


def _x(shape=(32, 16)):
    return RNG.standard_normal(shape).astype(np.float32)


def test_tensor_tensor_scan():
    a, b = _x(), _x()

    def body(t0, t1):
        o = nl.ndarray(t0.shape, nl.float32)
        nisa.tensor_tensor_scan(dst=o, data0=t0, data1=t1, initial=0.5, op0=nl.multiply, op1=nl.add)
        return o

    out = run_tile(body, a, b, out_shapes=[a.shape])
    ref = np.empty_like(a)
    state = np.full(32, 0.5, np.float32)
    for i in range(16):
        state = a[:, i] * state + b[:, i]
        ref[:, i] = state
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_tensor_scalar_cumulative_running_sum_and_register_chaining():
    a = _x()

    def body(t):
        o1 = nl.ndarray(t.shape, nl.float32)
        nisa.tensor_scalar_cumulative(dst=o1, src=t, op0=nl.multiply, op1=nl.add, imm0=2.0)
        o2 = nl.ndarray(t.shape, nl.float32)
        nisa.tensor_scalar_cumulative(dst=o2, src=t, op0=nl.multiply, op1=nl.add, imm0=1.0,
                                      reduce_cmd=nisa.reduce_cmd.reduce)
        return o1, o2

    o1, o2 = run_tile(body, a, out_shapes=[a.shape] * 2)
    np.testing.assert_allclose(o1, np.cumsum(2 * a, axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(o2, o1[:, -1:] + np.cumsum(a, axis=1), rtol=1e-5, atol=1e-5)


def test_tensor_partition_reduce_and_stream_shuffle():
    a = _x((64, 8))
    mask = list(range(31, -1, -1))

    def body(t):
        s = nl.ndarray((1, 8), nl.float32)
        nisa.tensor_partition_reduce(dst=s, op=nl.add, data=t)
        sh = nl.ndarray((64, 8), nl.float32)
        nisa.nc_stream_shuffle(dst=sh, src=t, shuffle_mask=mask)
        return s, sh

    s, sh = run_tile(body, a, out_shapes=[(1, 8), (64, 8)])
    np.testing.assert_allclose(s[0], a.sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(sh, np.concatenate([a[31::-1], a[63:31:-1]]))


def test_activate2_is_trn3_only(monkeypatch):
    a = _x()

    def body(t):
        o = nl.ndarray(t.shape, nl.float32)
        r = nl.ndarray((32, 1), nl.float32)
        nisa.activate2(dst=o, op=nl.prelu, data=t, imm0=2.0, imm1=1.0, op0=nl.multiply, op1=nl.add, relu_param=0.1,
                       reduce_op=nl.maximum, reduce_res=r, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        return o, r

    with pytest.raises(TargetError, match="activate2 needs NeuronCore-v4"):
        run_tile(body, a, out_shapes=[a.shape, (32, 1)])
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    o, r = run_tile(body, a, out_shapes=[a.shape, (32, 1)])
    pre = a * 2 + 1
    ref = np.where(pre > 0, pre, 0.1 * pre)
    np.testing.assert_allclose(o, ref, rtol=1e-6)
    np.testing.assert_allclose(r[:, 0], ref.max(1), rtol=1e-6)


def test_not_simulated_apis_say_so():
    with pytest.raises(NotSimulatedError, match="nisa.topk is part of NKI 0.6 but not simulated"):
        nisa.topk(None, None, None, 8)


def test_random_instructions_are_seeded_and_in_range():
    a = _x((16, 64))

    def body(t):
        seed = nl.ndarray((1, 1), nl.int32)
        nisa.memset(dst=seed, value=7)
        nisa.set_rng_seed(seed)
        bits = nl.ndarray((16, 64), nl.uint16)
        nisa.rng(dst=bits)
        u = nl.ndarray((16, 64), nl.float32)
        nisa.rand2(dst=u, min=-1.0, max=1.0)
        d = nl.ndarray(t.shape, nl.float32)
        nisa.dropout(dst=d, data=t, prob=0.5)
        return u, d

    u1, d1 = run_tile(body, a, out_shapes=[(16, 64)] * 2)
    u2, d2 = run_tile(body, a, out_shapes=[(16, 64)] * 2)
    np.testing.assert_array_equal(u1, u2)                      # same seed, same values
    assert u1.min() >= -1.0 and u1.max() < 1.0 and u1.std() > 0.3
    kept = d1 != 0
    np.testing.assert_array_equal(d1[kept], a[kept])            # kept values are not rescaled
    assert 0.3 < kept.mean() < 0.7


def test_dma_transpose_gather_with_2d_indices():
    """The dma_transpose docstring's indirect example: flat = indices.T.flatten(); dst = src[flat].T."""
    import ml_dtypes
    from nkisim_helpers import nki
    src = RNG.standard_normal((256, 128)).astype(ml_dtypes.bfloat16)
    idx = RNG.integers(0, 256, (128, 2)).astype(np.uint32)

    @nki.jit
    def gather_transpose_2d_kernel(src_hbm, idx_hbm):
        P, F = 128, 256
        output = nl.ndarray((P, F), dtype=src_hbm.dtype, buffer=nl.shared_hbm)
        idx_sb = nl.load(idx_hbm)
        dst_sb = nl.ndarray((P, F), dtype=src_hbm.dtype, buffer=nl.sbuf)
        nisa.memset(dst=dst_sb, value=0)
        src_ap = src_hbm.ap(pattern=[[P, F], [1, P]], vector_offset=idx_sb, indirect_dim=0)
        nisa.dma_transpose(dst=dst_sb, src=src_ap, axes=(1, 0))
        nisa.dma_copy(dst=output, src=dst_sb)
        return output

    out = gather_transpose_2d_kernel(src, idx)
    np.testing.assert_array_equal(out.view(np.uint16), src[idx.T.flatten()].T.view(np.uint16))


def test_nonzero_with_count_docstring_example():
    src = np.zeros((32, 8), np.float32)
    src[0] = [0, 1, 1, 0, 0, 1, 0, 0]
    src[16] = [5, 0, 0, 0, 0, 0, 0, 2]

    def body(t):
        d = nl.ndarray((32, 9), nl.int32)
        nisa.memset(dst=d, value=7)
        nisa.nonzero_with_count(dst=d, src=t, index_offset=16, padding_val=-1)
        return d

    out = run_tile(body, src, out_shapes=[(32, 9)], out_dtypes=[np.int32])
    np.testing.assert_array_equal(out[0], [17, 18, 21, -1, -1, -1, -1, -1, 3])
    np.testing.assert_array_equal(out[16], [16, 23, -1, -1, -1, -1, -1, -1, 2])
    assert (out[1] == 7).all()          # only partitions 0, 16, ... are written


def test_nc_n_gather():
    data = _x((16, 4, 8))
    idx = RNG.integers(0, 32, (16, 10)).astype(np.uint32)

    def body(d, i):
        o = nl.ndarray((16, 10), nl.float32)
        nisa.nc_n_gather(dst=o, data=d, indices=i)
        return o

    out = run_tile(body, data, idx, out_shapes=[(16, 10)])
    np.testing.assert_array_equal(out, np.take_along_axis(data.reshape(16, -1), idx.astype(np.int64), axis=1))
