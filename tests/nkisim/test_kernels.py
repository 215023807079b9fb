"""Complete small kernels written from the nki-reference.md section 7 idioms, checked against NumPy."""

import numpy as np

import nkisim

from nkisim_helpers import BF16, nisa, nki, nl

RNG = np.random.default_rng(3)


@nki.jit
def softmax_kernel(x):
    """Row softmax of [N, D] (N multiple of 128): max -> exp with fused row sum -> reciprocal -> scale."""
    n, d = x.shape
    out = nl.ndarray((n, d), x.dtype, buffer=nl.shared_hbm)
    for i in range(n // 128):
        t = nl.ndarray((128, d), x.dtype)
        nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, :])
        neg_max = nl.ndarray((128, 1), nl.float32)
        nisa.tensor_reduce(dst=neg_max, op=nl.maximum, data=t, axis=1, negate=True, keepdims=True)
        e = nl.ndarray((128, d), nl.float32)
        s = nl.ndarray((128, 1), nl.float32)
        nisa.activation(dst=e, op=nl.exp, data=t, bias=neg_max, reduce_op=nl.add, reduce_res=s,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        inv = nl.ndarray((128, 1), nl.float32)
        nisa.reciprocal(dst=inv, data=s)
        y = nl.ndarray((128, d), x.dtype)
        nisa.tensor_scalar(dst=y, data=e, op0=nl.multiply, operand0=inv)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=y)
    return out


def test_softmax_kernel():
    x = (RNG.standard_normal((256, 384)) * 4).astype(np.float32)
    ref = np.exp(x - x.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    np.testing.assert_allclose(softmax_kernel(x), ref, rtol=1e-5, atol=1e-7)   # fp32 throughout


@nki.jit
def layernorm_kernel(x, gamma, beta, eps):
    """LayerNorm over D (multiple of 512) with bn_stats per 512 chunk + one bn_aggr; gamma/beta [1, D]
    replicated over partitions with a stride-0 HBM broadcast view."""
    n, d = x.shape
    chunks = d // nl.tile_size.bn_stats_fmax
    out = nl.ndarray((n, d), x.dtype, buffer=nl.shared_hbm)
    g = nl.ndarray((128, d), nl.float32)
    nisa.dma_copy(dst=g, src=gamma.broadcast(0, 128))
    b = nl.ndarray((128, d), nl.float32)
    nisa.dma_copy(dst=b, src=beta.broadcast(0, 128))
    for i in range(n // 128):
        t = nl.ndarray((128, d), x.dtype)
        nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128])
        stats = nl.ndarray((128, 6 * chunks), nl.float32)
        for c in range(chunks):
            nisa.bn_stats(dst=stats[:, 6 * c:6 * (c + 1)], data=t[:, 512 * c:512 * (c + 1)])
        mv = nl.ndarray((128, 2), nl.float32)
        nisa.bn_aggr(dst=mv, data=stats)
        rstd = nl.ndarray((128, 1), nl.float32)
        nisa.activation(dst=rstd, op=nl.rsqrt, data=mv[:, 1:2], bias=eps)
        y = nl.ndarray((128, d), nl.float32)
        nisa.tensor_scalar(dst=y, data=t, op0=nl.subtract, operand0=mv[:, 0:1], op1=nl.multiply, operand1=rstd)
        nisa.tensor_tensor(dst=y, data1=y, data2=g, op=nl.multiply)
        res = nl.ndarray((128, d), x.dtype)
        nisa.tensor_tensor(dst=res, data1=y, data2=b, op=nl.add)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128], src=res)
    return out


def test_layernorm_kernel_bf16():
    x = (RNG.standard_normal((128, 1024)) * 2 + 1).astype(BF16)
    gamma = RNG.standard_normal((1, 1024)).astype(np.float32)
    beta = RNG.standard_normal((1, 1024)).astype(np.float32)
    out = layernorm_kernel(x, gamma, beta, 1e-5)
    xf = x.astype(np.float32)
    ref = (xf - xf.mean(1, keepdims=True)) / np.sqrt(xf.var(1, keepdims=True) + 1e-5) * gamma + beta
    # bf16 output: one final rounding (2^-8 relative) on values of magnitude up to ~10
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=2 ** -8, atol=2e-2)


@nki.jit
def transpose_kernel(x):
    """[P, F] -> [F, P] in 128x128 blocks via TensorE transpose and PSUM eviction."""
    p, f = x.shape
    out = nl.ndarray((f, p), x.dtype, buffer=nl.shared_hbm)
    for i in range(p // 128):
        for j in range(f // 128):
            t = nl.ndarray((128, 128), x.dtype)
            nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128])
            tp = nl.ndarray((128, 128), x.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=tp, data=t)
            sb = nl.ndarray((128, 128), x.dtype)
            nisa.tensor_copy(dst=sb, src=tp)
            nisa.dma_copy(dst=out[j * 128:(j + 1) * 128, i * 128:(i + 1) * 128], src=sb)
    return out


def test_transpose_kernel_is_bit_exact():
    x = RNG.standard_normal((256, 384)).astype(BF16)
    np.testing.assert_array_equal(transpose_kernel(x).view(np.uint16), x.T.view(np.uint16))


@nki.jit
def causal_attention_kernel(qT, kT, v, scale):
    """One head, S <= 128 queries/keys, D <= 128: softmax(mask(q k^T * scale)) v with qT, kT [D, S], v [S, D].
    Scores on TensorE, causal mask with affine_select, softmax on Vector/Scalar, probs transposed on TensorE."""
    d, s = qT.shape
    q_sb = nl.ndarray((d, s), qT.dtype)
    nisa.dma_copy(dst=q_sb, src=qT)
    k_sb = nl.ndarray((d, s), kT.dtype)
    nisa.dma_copy(dst=k_sb, src=kT)
    v_sb = nl.ndarray((s, d), v.dtype)
    nisa.dma_copy(dst=v_sb, src=v)
    scores_ps = nl.ndarray((s, s), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=scores_ps, stationary=q_sb, moving=k_sb)
    scores = nl.ndarray((s, s), nl.float32)
    nisa.activation(dst=scores, op=nl.copy, data=scores_ps, scale=scale)
    masked = nl.ndarray((s, s), nl.float32)
    nisa.affine_select(dst=masked, pattern=[[-1, s]], channel_multiplier=1, on_true_tile=scores,
                       on_false_value=-9984.0, cmp_op=nl.greater_equal, offset=0)
    neg_max = nl.ndarray((s, 1), nl.float32)
    nisa.tensor_reduce(dst=neg_max, op=nl.maximum, data=masked, axis=1, negate=True)
    probs = nl.ndarray((s, s), nl.bfloat16)
    row_sum = nl.ndarray((s, 1), nl.float32)
    nisa.activation(dst=probs, op=nl.exp, data=masked, bias=neg_max, reduce_op=nl.add, reduce_res=row_sum,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    probs_t_ps = nl.ndarray((s, s), nl.bfloat16, buffer=nl.psum)
    nisa.nc_transpose(dst=probs_t_ps, data=probs)
    probs_t = nl.ndarray((s, s), nl.bfloat16)
    nisa.tensor_copy(dst=probs_t, src=probs_t_ps)
    o_ps = nl.ndarray((s, d), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=o_ps, stationary=probs_t, moving=v_sb)
    inv = nl.ndarray((s, 1), nl.float32)
    nisa.reciprocal(dst=inv, data=row_sum)
    o_sb = nl.ndarray((s, d), v.dtype)
    nisa.tensor_scalar(dst=o_sb, data=o_ps, op0=nl.multiply, operand0=inv)
    out = nl.ndarray((s, d), v.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=o_sb)
    return out


def test_causal_attention_kernel():
    s, d = 128, 64
    q, k, v = (RNG.standard_normal((s, d)).astype(BF16) for _ in range(3))
    out = causal_attention_kernel(np.ascontiguousarray(q.T), np.ascontiguousarray(k.T), v, d ** -0.5)
    qf, kf, vf = (t.astype(np.float32) for t in (q, k, v))
    scores = qf @ kf.T * d ** -0.5
    scores[np.triu(np.ones((s, s), bool), 1)] = -np.inf
    p = np.exp(scores - scores.max(1, keepdims=True))
    ref = (p / p.sum(1, keepdims=True)) @ vf
    # probabilities rounded to bf16 (2^-8 relative) before the PV matmul, output rounded to bf16
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=2e-2, atol=2e-2)


@nki.jit
def lnc2_matmul_kernel(lhsT, rhs):
    """Tiled matmul whose N tiles are split between the two logical cores."""
    k, m = lhsT.shape
    n = rhs.shape[1]
    result = nl.ndarray((m, n), nl.float32, buffer=nl.shared_hbm)
    per_core = n // nl.num_programs(0)
    for j in range(per_core // 512):
        col = nl.program_id(0) * per_core + j * 512
        acc = nl.ndarray((m, 512), nl.float32, buffer=nl.psum)
        for kk in range(k // 128):
            a = nl.ndarray((128, m), lhsT.dtype)
            nisa.dma_copy(dst=a, src=lhsT[kk * 128:(kk + 1) * 128, :])
            b = nl.ndarray((128, 512), rhs.dtype)
            nisa.dma_copy(dst=b, src=rhs[kk * 128:(kk + 1) * 128, col:col + 512])
            nisa.nc_matmul(dst=acc, stationary=a, moving=b, accumulate=(kk > 0))
        res = nl.ndarray((m, 512), nl.float32)
        nisa.tensor_copy(dst=res, src=acc)
        nisa.dma_copy(dst=result[:, col:col + 512], src=res)
    return result


def test_lnc2_tiled_matmul():
    lhsT = RNG.standard_normal((256, 128)).astype(BF16)
    rhs = RNG.standard_normal((256, 2048)).astype(BF16)
    with nkisim.trace() as t:
        out = lnc2_matmul_kernel[2](lhsT, rhs)
    np.testing.assert_allclose(out, lhsT.astype(np.float32).T @ rhs.astype(np.float32), rtol=1e-5, atol=1e-4)
    assert sum(1 for i in t if i.name == "nc_matmul" and i.program_id == 1) == 4


def test_tiled_matmul_example_larger():
    from nkisim.examples.matmul import matmul_tiled
    lhsT = RNG.standard_normal((384, 256)).astype(BF16)
    rhs = RNG.standard_normal((384, 1024)).astype(BF16)
    with nkisim.trace() as t:
        out = matmul_tiled(lhsT, rhs)
    ref = lhsT.astype(np.float32).T @ rhs.astype(np.float32)
    # bf16 output: one rounding of the fp32 accumulation (2^-8 relative)
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=2 ** -8, atol=1e-3)
    assert t.count("nc_matmul") == 2 * 2 * 3


def test_trn1_target_runs_the_same_kernel(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    x = RNG.standard_normal((128, 64)).astype(np.float32)
    ref = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(softmax_kernel(x), ref / ref.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
