"""Scans, partition reduce, stream shuffle, activate2 (trn3) and the not-simulated APIs."""

import numpy as np
import pytest

from nkisim.errors import NotSimulatedError, TargetError

from conftest import nisa, nl, run_tile

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
