"""The nki.language convenience layer: results against NumPy and the instructions it lowers to."""

import numpy as np
import pytest

import nkisim
from nkisim.errors import DataDependentWarning

from nkisim_helpers import nisa, nki, nl

RNG = np.random.default_rng(4)


def _sim(kernel, *args):
    with nkisim.trace() as t:
        out = nki.simulate(kernel)(*args)
    return out, t


def test_load_elementwise_store():
    a, b = RNG.standard_normal((128, 64)).astype(np.float32), RNG.standard_normal((128, 64)).astype(np.float32)

    def kernel(x, y):
        tx, ty = nl.load(x), nl.load(y)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        r = nl.add(nl.multiply(tx, ty), 1.0)
        r = nl.subtract(2.0, r)                  # number on the left: reversed tensor_scalar
        r = nl.divide(r, nl.exp(ty, dtype=nl.float32))
        r = nl.maximum(r, nl.negative(tx))
        nl.store(out, r)
        return out

    out, t = _sim(kernel, a, b)
    ref = np.maximum((2.0 - (a * b + 1.0)) / np.exp(b), -a)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    assert {"tensor_tensor", "tensor_scalar", "activation", "reciprocal", "dma_copy"} <= set(t.names())


def test_reductions_signature_and_values():
    a = RNG.standard_normal((64, 4, 32)).astype(np.float32)

    def kernel(x):
        t = nl.load(x)
        s = nl.sum(t, axis=2)                           # (64, 4)
        m = nl.max(t, (1, 2), nl.float32, True)          # positional dtype, keepdims -> (64, 1, 1)
        mu = nl.mean(t, axis=(1, 2))                     # (64, 1)
        v = nl.var(t, axis=(1, 2))
        out = nl.ndarray((64, 7), nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:4], s)
        nl.store(out[:, 4:5], m.reshape((64, 1)))
        nl.store(out[:, 5:6], mu)
        nl.store(out[:, 6:7], v.reshape((64, 1)))
        return out

    out, _ = _sim(kernel, a)
    np.testing.assert_allclose(out[:, :4], a.sum(2), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[:, 4], a.max((1, 2)))
    np.testing.assert_allclose(out[:, 5], a.mean((1, 2)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[:, 6], a.var((1, 2)), rtol=1e-4)


def test_matmul_transpose_softmax_rms_norm():
    x = RNG.standard_normal((64, 128)).astype(np.float32)     # [M, K]
    y = RNG.standard_normal((64, 96)).astype(np.float32)      # [K, N] with K = 64

    def kernel(a, b):
        ta, tb = nl.load(a), nl.load(b)
        prod_ps = nl.matmul(ta[:, 0:64], tb)                  # transpose_x=False: a transpose is inserted
        prod = nl.ndarray(prod_ps.shape, nl.float32)
        nisa.tensor_copy(dst=prod, src=prod_ps)
        sm = nl.softmax(prod, axis=1)
        w = nl.full(prod.shape, 2.0, nl.float32)
        rn = nl.rms_norm(prod, w, axis=1, n=96)
        tr_ps = nl.transpose(ta)
        tr = nl.copy(tr_ps)
        out = nl.ndarray((3, 64, 96), nl.float32, buffer=nl.shared_hbm)
        nl.store(out[0], prod)
        nl.store(out[1], sm)
        nl.store(out[2], rn)
        out_t = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        nl.store(out_t, tr)
        return out, out_t

    (out, out_t), t = _sim(kernel, x, y)
    prod = x[:, :64] @ y
    np.testing.assert_allclose(out[0], prod, rtol=1e-4, atol=1e-4)
    e = np.exp(prod - prod.max(1, keepdims=True))
    np.testing.assert_allclose(out[1], e / e.sum(1, keepdims=True), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(out[2], prod / np.sqrt((prod ** 2).mean(1, keepdims=True) + 1e-6) * 2, rtol=1e-4)
    np.testing.assert_array_equal(out_t, x.T)
    assert t.count("nc_transpose") == 2 and t.count("nc_matmul") == 1


def test_where_broadcast_expand_identity():
    cond = (RNG.random((128, 32)) > 0.5).astype(np.float32)
    a = RNG.standard_normal((128, 32)).astype(np.float32)
    row = RNG.standard_normal((1, 32)).astype(np.float32)
    col = RNG.standard_normal((128, 1)).astype(np.float32)

    def kernel(c, x, r, k):
        w = nl.where(nl.load(c), nl.load(x), -1.0)
        br = nl.broadcast_to(nl.load(r), (128, 32))           # partition broadcast (ones matmul)
        bc = nl.broadcast_to(nl.load(k), (128, 32))           # free broadcast
        ident = nl.shared_identity_matrix(128, dtype=nl.float32)
        e = nl.expand_dims(bc, 1)
        out = nl.ndarray((4, 128, 32), nl.float32, buffer=nl.shared_hbm)
        nl.store(out[0], w)
        nl.store(out[1], br)
        nl.store(out[2], e.reshape((128, 32)))
        nl.store(out[3], ident[:, 0:32])
        return out

    out, _ = _sim(kernel, cond, a, row, col)
    np.testing.assert_array_equal(out[0], np.where(cond != 0, a, -1.0))
    np.testing.assert_array_equal(out[1], np.broadcast_to(row, (128, 32)))
    np.testing.assert_array_equal(out[2], np.broadcast_to(col, (128, 32)))
    np.testing.assert_array_equal(out[3], np.eye(128, 32))


def test_binary_ops_broadcast_free_dims_only():
    def kernel():
        a = nl.full((128, 4), 2.0, nl.float32)
        b = nl.full((128, 1), 3.0, nl.float32)
        assert nl.equal(nl.multiply(a, b), nl.full((128, 4), 6.0, nl.float32))   # [P, 1] operand (API examples)
        nl.add(a, nl.zeros((1, 4), nl.float32))

    with pytest.raises(ValueError, match="do not broadcast; only size-1 free dims"), \
            pytest.warns(DataDependentWarning, match="does not compile for Trainium"):
        nki.simulate(kernel)()


def test_dtype_promotion():
    from nkisim.language_ops import _promote
    assert _promote(nl.float16, nl.bfloat16) == nl.float32
    assert _promote(nl.float8_e4m3, nl.float8_e5m2) == nl.bfloat16
    assert _promote(nl.int8, nl.uint8) == nl.int16
    assert _promote(nl.int32, nl.uint32) == nl.float32
    assert _promote(nl.int32, nl.bfloat16) == nl.bfloat16


def test_tile_size_constants_follow_target(monkeypatch):
    assert nl.tile_size.pmax == 128 and nl.tile_size.psum_bank_fmax == 512 and nl.tile_size.bn_stats_fmax == 512
    assert nl.tile_size.total_available_sbuf_size == 212984 and nl.tile_size.psum_num_banks == 8
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    assert nl.tile_size.sbuf_fmax_bytes == 245752


def test_api_doc_examples_with_asserts():
    """Snippets from the nki.language docstrings, including their ``assert nl.equal(...)``."""
    def kernel():
        a = nl.full((128, 512), 3.2, dtype=nl.float32, buffer=nl.sbuf)
        assert nl.equal(nl.ceil(a), nl.full((128, 512), 4.0, dtype=nl.float32, buffer=nl.sbuf))
        z = nl.full((128, 512), 0.0, dtype=nl.float32, buffer=nl.sbuf)
        assert nl.equal(nl.cos(z), nl.full((128, 512), 1.0, dtype=nl.float32, buffer=nl.sbuf))
        cond = nl.full((128, 512), 0.0, dtype=nl.float32, buffer=nl.sbuf)
        x = nl.full((128, 512), 10.0, dtype=nl.float32, buffer=nl.sbuf)
        y = nl.full((128, 512), 5.0, dtype=nl.float32, buffer=nl.sbuf)
        assert nl.equal(nl.where(cond, x, y), y)
        identity = nl.shared_identity_matrix(n=128, dtype=nl.float32)
        result_psum = nl.transpose(identity)
        result = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(result, result_psum)
        assert nl.equal(result, identity)
        ones = nl.full((128, 128), 1.0, dtype=nl.float32, buffer=nl.sbuf)
        mm = nl.matmul(identity, ones, transpose_x=True)
        mm_sb = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(mm_sb, mm)
        assert nl.equal(mm_sb, ones)
        assert not nl.equal(mm_sb, identity)
        assert nl.equal(nl.fmod(nl.full((2, 2), -7.0, nl.float32), 3.0), nl.full((2, 2), -1.0, nl.float32))

    # Each assert on a tensor is data-dependent Python: it runs here, flagged, but would not compile.
    with pytest.warns(DataDependentWarning, match="does not compile for Trainium"):
        nki.simulate(kernel)()


def test_gather_flattened():
    data = RNG.standard_normal((16, 32)).astype(np.float32)
    idx = RNG.integers(0, 32, (16, 8)).astype(np.uint32)

    def kernel(d, i):
        out = nl.ndarray((16, 8), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.gather_flattened(nl.load(d), nl.load(i)))
        return out

    out, _ = _sim(kernel, data, idx)
    np.testing.assert_array_equal(out, np.take_along_axis(data, idx.astype(np.int64), axis=1))


def test_nl_rsqrt_runs_on_gpsimd_and_refuses_psum():
    x = RNG.random((8, 16)).astype(np.float32) + 0.5

    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.rsqrt(nl.load(a)))
        return out

    out, t = _sim(kernel, x)
    np.testing.assert_allclose(out, 1 / np.sqrt(x), rtol=1e-6)
    assert [i.engine for i in t if i.name == "tensor_scalar"] == ["gpsimd"]

    def psum_kernel():
        p = nl.zeros((8, 16), nl.float32, buffer=nl.psum)
        nl.rsqrt(p)

    with pytest.raises(ValueError, match="GpSimd cannot access PSUM"):
        nki.simulate(psum_kernel)()
