"""TensorE: nc_matmul accumulate rules (None/True/False), limits per target, transposes."""

import numpy as np
import pytest

from nkisim.errors import DtypeError, MemoryPlacementError, ShapeError, TargetError

from nkisim_helpers import BF16, nisa, nki, nl

RNG = np.random.default_rng(1)


def _mm_kernel(accumulates, memset_first=False, k_tiles=2):
    """lhsT [K*k_tiles, M], rhs [K*k_tiles, N]; one matmul per K tile with the given accumulate flags."""
    def kernel(lhsT, rhs):
        k, m = 128, lhsT.shape[1]
        n = rhs.shape[1]
        acc = nl.ndarray((m, n), nl.float32, buffer=nl.psum)
        if memset_first:
            nisa.memset(dst=acc, value=0.0)
        for i, flag in enumerate(accumulates):
            s = nl.ndarray((k, m), lhsT.dtype)
            nisa.dma_copy(dst=s, src=lhsT[i * k:(i + 1) * k, :])
            mv = nl.ndarray((k, n), rhs.dtype)
            nisa.dma_copy(dst=mv, src=rhs[i * k:(i + 1) * k, :])
            nisa.nc_matmul(dst=acc, stationary=s, moving=mv, accumulate=flag)
        res = nl.ndarray((m, n), nl.float32)
        nisa.tensor_copy(dst=res, src=acc)
        out = nl.ndarray((m, n), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=res)
        return out
    return kernel


def _operands(k_tiles=2, m=64, n=96, dtype=BF16):
    return (RNG.standard_normal((128 * k_tiles, m)).astype(dtype), RNG.standard_normal((128 * k_tiles, n)).astype(dtype))


def _ref(lhsT, rhs, tiles):
    a, b = lhsT.astype(np.float32), rhs.astype(np.float32)
    return sum(a[i * 128:(i + 1) * 128].T @ b[i * 128:(i + 1) * 128] for i in tiles)


@pytest.mark.parametrize("flags, tiles", [
    ((None, None), (0, 1)),            # inferred: first write overwrites, then accumulates
    ((False, True), (0, 1)),           # the accumulate=(k > 0) idiom
    ((False, False), (1,)),            # False always overwrites
    ((None, False), (1,)),
])
def test_accumulate_rules(flags, tiles):
    lhsT, rhs = _operands()
    out = nki.simulate(_mm_kernel(flags))(lhsT, rhs)
    # bf16 products are exact in fp32; sums of 256 terms in fp32 differ from NumPy's order by ~1e-5.
    np.testing.assert_allclose(out, _ref(lhsT, rhs, tiles), rtol=1e-5, atol=1e-4)


def test_accumulate_true_onto_uninitialised_psum_is_rejected():
    lhsT, rhs = _operands(1)
    with pytest.raises(ShapeError, match="accumulate=True onto PSUM .* no matmul wrote"):
        nki.simulate(_mm_kernel((True,), k_tiles=1))(lhsT, rhs)


def test_accumulate_true_onto_memset_psum_is_ub_on_trn2_but_legal_on_trn3(monkeypatch):
    lhsT, rhs = _operands(1)
    with pytest.raises(ShapeError, match="undefined behaviour on trn2"):
        nki.simulate(_mm_kernel((True,), memset_first=True))(lhsT, rhs)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    out = nki.simulate(_mm_kernel((True,), memset_first=True))(lhsT, rhs)
    np.testing.assert_allclose(out, _ref(lhsT, rhs, (0,)), rtol=1e-5, atol=1e-4)


def test_none_after_eviction_starts_a_new_group():
    """A PSUM tile reused across output tiles: the copy-out closes the group, the next matmul overwrites."""
    lhsT, rhs = _operands(1)

    def kernel(a, b):
        acc = nl.ndarray((64, 96), nl.float32, buffer=nl.psum)
        s = nl.ndarray((128, 64), a.dtype)
        nisa.dma_copy(dst=s, src=a)
        mv = nl.ndarray((128, 96), b.dtype)
        nisa.dma_copy(dst=mv, src=b)
        out = nl.ndarray((2, 64, 96), nl.float32, buffer=nl.shared_hbm)
        for rep in range(2):
            nisa.nc_matmul(dst=acc, stationary=s, moving=mv)
            res = nl.ndarray((64, 96), nl.float32)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[rep], src=res)
        return out

    out = nki.simulate(kernel)(lhsT, rhs)
    np.testing.assert_allclose(out[1], _ref(lhsT, rhs, (0,)), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("k, m, n, target, message", [
    (128, 129, 64, "trn2", "operand 'stationary' free size \\(M\\) is 129, limit 128"),
    (128, 128, 513, "trn2", "operand 'moving' free size \\(N\\) is 513, limit 512"),
    (128, 128, 4097, "trn3", "operand 'moving' free size \\(N\\) is 4097, limit 4096"),
])
def test_matmul_operand_limits(monkeypatch, k, m, n, target, message):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)

    def kernel():
        s = nl.ndarray((k, m), nl.bfloat16)
        nisa.memset(dst=s, value=1.0)
        mv = nl.ndarray((k, n), nl.bfloat16)
        nisa.memset(dst=mv, value=1.0)
        acc = nl.ndarray((min(m, 128), n), nl.float32, buffer=nl.psum) if m <= 128 else \
            nl.ndarray((128, n), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=s, moving=mv)

    with pytest.raises(ShapeError, match=message):
        nki.simulate(kernel)()


def test_matmul_n_4096_is_legal_on_trn3(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")

    def kernel():
        s = nl.ndarray((128, 4), nl.bfloat16)
        nisa.memset(dst=s, value=1.0)
        mv = nl.ndarray((128, 4096), nl.bfloat16)
        nisa.memset(dst=mv, value=0.5)
        acc = nl.ndarray((4, 4096), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=s, moving=mv)
        res = nl.ndarray((4, 4096), nl.float32)
        nisa.tensor_copy(dst=res, src=acc)
        out = nl.ndarray((4, 4096), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=res)
        return out

    assert (nki.simulate(kernel)() == 64.0).all()


@pytest.mark.parametrize("case, error, message", [
    ("k_mismatch", ShapeError, "contraction \\(partition\\) dims differ: stationary K=128, moving K=64"),
    ("psum_operand", MemoryPlacementError, "operand 'moving' is in psum, allowed buffers are sbuf"),
    ("sbuf_dst", MemoryPlacementError, "operand 'dst' is in sbuf, allowed buffers are psum"),
    ("bf16_dst", DtypeError, "operand 'dst' dtype is bfloat16, allowed float32 on trn2"),
    ("mixed_fp32", DtypeError, "if one operand is fp32/tf32 the other must be too"),
    ("cross_bank", ShapeError, "one 2048-byte bank"),
])
def test_matmul_rejections(case, error, message):
    def kernel():
        s = nl.ndarray((128, 64), nl.float32 if case == "mixed_fp32" else nl.bfloat16)
        nisa.memset(dst=s, value=1.0)
        mv = nl.ndarray((64 if case == "k_mismatch" else 128, 128), nl.bfloat16,
                        buffer=nl.psum if case == "psum_operand" else nl.sbuf)
        nisa.memset(dst=mv, value=1.0)
        big = nl.ndarray((64, 1024), nl.float32, buffer=nl.psum)
        dst = {"sbuf_dst": nl.ndarray((64, 128), nl.float32),
               "bf16_dst": nl.ndarray((64, 128), nl.bfloat16, buffer=nl.psum),
               "cross_bank": big[:, 448:576]}.get(case, big[:, 0:128])
        nisa.nc_matmul(dst=dst, stationary=s, moving=mv)

    with pytest.raises(error, match=message):
        nki.simulate(kernel)()


def test_tensor_engine_transpose_and_is_transpose_mode():
    a = RNG.standard_normal((96, 128)).astype(BF16)

    def kernel(x):
        t = nl.ndarray((96, 128), x.dtype)
        nisa.dma_copy(dst=t, src=x)
        tp = nl.ndarray((128, 96), x.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=tp, data=t)
        ident = nl.shared_identity_matrix(96, dtype=nl.bfloat16)
        tp2 = nl.ndarray((128, 96), x.dtype, buffer=nl.psum)
        nisa.nc_matmul(dst=tp2, stationary=t, moving=ident, is_transpose=True)
        out = nl.ndarray((2, 128, 96), x.dtype, buffer=nl.shared_hbm)
        for i, src in enumerate((tp, tp2)):
            sb = nl.ndarray((128, 96), x.dtype)
            nisa.tensor_copy(dst=sb, src=src)
            nisa.dma_copy(dst=out[i], src=sb)
        return out

    out = nki.simulate(kernel)(a)
    np.testing.assert_array_equal(out[0].view(np.uint16), a.T.view(np.uint16))
    np.testing.assert_array_equal(out[1].view(np.uint16), a.T.view(np.uint16))


def test_transpose_limits():
    def tensor_engine_too_big():
        t = nl.ndarray((128, 256), nl.bfloat16)
        nisa.memset(dst=t, value=0.0)
        nisa.nc_transpose(dst=nl.ndarray((128, 256), nl.bfloat16, buffer=nl.psum), data=t)

    def vector_engine_too_big():
        t = nl.ndarray((64, 64), nl.float32)
        nisa.memset(dst=t, value=0.0)
        nisa.nc_transpose(dst=nl.ndarray((64, 64), nl.float32), data=t, engine=nisa.engine.vector)

    with pytest.raises(ShapeError, match="free size \\(TensorE transpose\\) is 256, limit 128"):
        nki.simulate(tensor_engine_too_big)()
    with pytest.raises(ShapeError, match="shape \\(VectorE transpose\\) is \\[64, 64\\], limit \\[32, 32\\]"):
        nki.simulate(vector_engine_too_big)()


def test_is_transpose_needs_trn2(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")

    def kernel():
        t = nl.ndarray((32, 32), nl.bfloat16)
        nisa.memset(dst=t, value=0.0)
        ident = nl.shared_identity_matrix(32, dtype=nl.bfloat16)
        nisa.nc_matmul(dst=nl.ndarray((32, 32), nl.bfloat16, buffer=nl.psum), stationary=t, moving=ident,
                       is_transpose=True)

    with pytest.raises(TargetError, match="is_transpose=True needs NeuronCore-v3 \\(trn2\\) or newer; target is trn1"):
        nki.simulate(kernel)()
