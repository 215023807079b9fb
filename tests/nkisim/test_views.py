"""NkiTensor views and indexing rules (nki-reference.md section 1.4, NKI language guide)."""

import numpy as np
import pytest

import nkisim
from nkisim.errors import AccessPatternError, ShapeError

from nkisim_helpers import nisa, nki, nl


def _in_kernel(fn):
    """Run ``fn`` inside a kernel launch (allocation needs one) and return its result."""
    box = {}

    def kernel():
        box["value"] = fn()
        return None

    nki.simulate(kernel)()
    return box["value"]


def test_on_chip_integer_indexing_keeps_rank_two():
    def body():
        t = nl.ndarray((64, 64, 64), nl.float32, buffer=nl.sbuf)
        return t[0, 0, 10].shape, t[:, 0].shape, t[:, 0, 10].shape, t[3].shape, t[..., 5].shape
    assert _in_kernel(body) == ((1, 1), (64, 64), (64, 1), (1, 64, 64), (64, 64))


def test_hbm_integer_indexing_drops_dims_but_stays_1d():
    def body():
        t = nl.ndarray((4, 8, 16), nl.float32, buffer=nl.hbm)
        return t[1].shape, t[1, 2].shape, t[1, 2, 3].shape, t[-1, ::2, 1:-1].shape
    assert _in_kernel(body) == ((8, 16), (16,), (1,), (4, 14))


def test_slices_steps_negative_indices_and_ds_address_the_right_elements():
    a = np.arange(4 * 32, dtype=np.float32).reshape(4, 32)

    def kernel(x):
        t = nl.ndarray((4, 32), nl.float32)
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray((4, 8), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[:, 0:4], src=t[:, 2:10:2])
        nisa.dma_copy(dst=out[:, 4:8], src=t[:, nl.ds(-6, 4)])
        return out

    out = nki.simulate(kernel)(a)
    np.testing.assert_array_equal(out[:, :4], a[:, 2:10:2])
    np.testing.assert_array_equal(out[:, 4:], a[:, -6:-2])


def test_reverse_slice_and_views_share_storage():
    a = np.arange(2 * 6, dtype=np.float32).reshape(2, 6)

    def kernel(x):
        t = nl.ndarray((2, 6), nl.float32)
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray((2, 2, 3), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[0], src=t[:, 5:2:-1])
        nisa.dma_copy(dst=out[1], src=t.reshape((2, 2, 3))[:, 1, :])
        return out

    out = nki.simulate(kernel)(a)
    np.testing.assert_array_equal(out.reshape(2, 2, 3)[0], a[:, 5:2:-1])
    np.testing.assert_array_equal(out.reshape(2, 2, 3)[1], a[:, 3:6])


def test_view_methods_shapes_and_strides():
    def body():
        t = nl.ndarray((128, 4, 6), nl.float32)
        u = nl.ndarray((128, 64), nl.float32)
        return (t.reshape((128, 24)).shape, t.reshape_dim(2, (2, -1)).shape, t.flatten_dims(1, 2).shape,
                t.permute((0, 2, 1)).strides, t[:, 0:1, :].broadcast(1, 8).strides, u.expand_dim(1).shape,
                u.expand_dim(1).squeeze_dim(1).shape, u.slice(1, 8, 24).get_pattern(), u.slice(1, 8, 24).offset,
                u.rearrange(("b", ("h", "w")), ("b", "w", "h"), {"h": 4}).shape,
                u.select(1, 3).shape, u.is_contiguous(), u[:, ::2].is_contiguous(), u[0:64].is_contiguous())
    (r1, r2, r3, perm, bcast, exp, sq, pattern, off, rear, sel, c1, c2, c3) = _in_kernel(body)
    assert r1 == (128, 24) and r2 == (128, 4, 2, 3) and r3 == (128, 24)
    assert perm == (24, 1, 6) and bcast[1] == 0 and exp == (128, 1, 64) and sq == (128, 64)
    assert pattern == [[64, 128], [1, 16]] and off == 8
    assert rear == (128, 16, 4) and sel == (128, 1)
    assert c1 and not c2 and c3     # on chip, partition slicing keeps free contiguity


def test_view_dtype_rescales_last_dim_and_shares_bits():
    a = np.array([[1.0, -2.0]], dtype=np.float32)

    def kernel(x):
        t = nl.ndarray((1, 2), nl.float32)
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray((1, 8), nl.uint8, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t.view(nl.uint8))
        back = nl.ndarray((1, 2), nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=back, src=t.view(nl.uint8).view(nl.int32))
        return out, back

    out, back = nki.simulate(kernel)(a)
    np.testing.assert_array_equal(out, a.view(np.uint8))
    np.testing.assert_array_equal(back, a.view(np.int32))


def test_ap_loop_nest_on_flattened_storage():
    a = np.arange(16 * 16, dtype=np.float32).reshape(16, 16)

    def kernel(x):
        t = nl.ndarray((16, 16), nl.float32)
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray((16, 8), nl.float32, buffer=nl.shared_hbm)
        # the deep-dive example: t[0:16, 8:16] as an access pattern; ignores the view it is called on
        nisa.dma_copy(dst=out, src=t[0:4, 0:2].ap(pattern=[[16, 16], [1, 8]], offset=8))
        return out

    np.testing.assert_array_equal(nki.simulate(kernel)(a), a[:, 8:16])


def test_ap_scalar_offset_from_tensor_and_register():
    a = np.arange(4 * 128 * 4, dtype=np.float32).reshape(4 * 128, 4)

    def kernel(x):
        idx = nl.ndarray((1, 1), nl.int32)
        nisa.memset(dst=idx, value=2 * 128)
        t = nl.ndarray((128, 4), nl.float32)
        nisa.dma_copy(dst=t, src=x.ap(pattern=[[4, 128], [1, 4]], offset=0, scalar_offset=idx, indirect_dim=0))
        reg = nisa.register_alloc(3)
        u = nl.ndarray((128, 4), nl.float32)
        nisa.dma_copy(dst=u, src=x.reshape((4, 128, 4)).select(0, reg))
        out = nl.ndarray((2, 128, 4), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[0], src=t)
        nisa.dma_copy(dst=out[1], src=u)
        return out

    out = nki.simulate(kernel)(a)
    np.testing.assert_array_equal(out[0], a[256:384])
    np.testing.assert_array_equal(out[1], a[384:512])


@pytest.mark.parametrize("make, message", [
    (lambda t: t[0:64:2], "partitions must be contiguous"),
    (lambda t: t[:, 0:65], "out of bounds"),
    (lambda t: t.permute((1, 0)), "dims\\[0\\] must stay 0"),
    (lambda t: t[0:1].broadcast(0, 4), "partition dim of an on-chip tensor cannot be broadcast"),
    (lambda t: t.reshape((64, 128)), "changes the partition dim"),
    (lambda t: t[:, ::2].reshape((128, 32)), "contiguous"),
    (lambda t: t.ap([[32, 128], [1, 64]]), "must start with \\[free_size_of_storage=64"),
])
def test_illegal_views_are_rejected(make, message):
    def body():
        make(nl.ndarray((128, 64), nl.float32))
    with pytest.raises(AccessPatternError, match=message):
        _in_kernel(body)


def test_allocation_limits():
    with pytest.raises(ShapeError, match="partition dim 129 exceeds 128"):
        _in_kernel(lambda: nl.ndarray((129, 4), nl.float32))
    with pytest.raises(ShapeError, match="2 KiB bank boundary"):
        _in_kernel(lambda: nl.ndarray((128, 4), nl.float32, buffer=nl.psum, address=(0, 100)))
    with pytest.raises(nkisim.errors.KernelError, match="only run inside a kernel"):
        nl.ndarray((4, 4), nl.float32)


def test_new_allocations_hold_nan_or_four():
    def kernel():
        f = nl.ndarray((2, 3), nl.bfloat16)
        i = nl.ndarray((2, 3), nl.int32)
        of = nl.ndarray((2, 3), nl.bfloat16, buffer=nl.shared_hbm)
        oi = nl.ndarray((2, 3), nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=of, src=f)
        nisa.dma_copy(dst=oi, src=i)
        return of, oi
    f, i = nki.simulate(kernel)()
    assert np.isnan(f.astype(np.float32)).all() and (i == 4).all()


def test_indirect_gather_and_scatter_docstring_kernels():
    """The dma_copy docstring's vector_offset gather and scatter examples."""
    data = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    indices = np.array([[5], [0], [63], [7]], dtype=np.uint32)

    @nki.jit
    def indirect_gather_kernel(data, indices):
        P, F = indices.shape[0], data.shape[1]
        output = nl.ndarray((P, F), dtype=data.dtype, buffer=nl.shared_hbm)
        idx = nl.ndarray((P, 1), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=indices)
        dst = nl.ndarray((P, F), dtype=data.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=dst, src=data.ap(pattern=[[F, P], [1, F]], vector_offset=idx, indirect_dim=0))
        nisa.dma_copy(dst=output, src=dst)
        return output

    @nki.jit
    def indirect_scatter_kernel(src_data, indices, output):
        P, F = src_data.shape
        src = nl.ndarray((P, F), dtype=src_data.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=src, src=src_data)
        idx = nl.ndarray((P, 1), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=indices)
        nisa.dma_copy(dst=output.ap(pattern=[[F, P], [1, F]], vector_offset=idx, indirect_dim=0), src=src)
        return output

    np.testing.assert_array_equal(indirect_gather_kernel(data, indices), data[indices[:, 0]])
    out = np.zeros((64, 8), np.float32)
    rows = np.arange(4 * 8, dtype=np.float32).reshape(4, 8)
    result = indirect_scatter_kernel(rows, indices, out)
    expected = np.zeros((64, 8), np.float32)
    expected[indices[:, 0]] = rows
    np.testing.assert_array_equal(result, expected)
    np.testing.assert_array_equal(out, expected)       # the output argument was written in place


def test_indirect_out_of_bounds_error_or_skip():
    data = np.arange(16 * 4, dtype=np.float32).reshape(16, 4)
    indices = np.array([[1], [99]], dtype=np.int32)

    def kernel(d, i, skip):
        idx = nl.ndarray((2, 1), nl.int32)
        nisa.dma_copy(dst=idx, src=i)
        t = nl.ndarray((2, 4), nl.float32)
        nisa.memset(dst=t, value=-1.0)
        nisa.dma_copy(dst=t, src=d.vector_select(0, idx),
                      oob_mode=nisa.oob_mode.skip if skip else nisa.oob_mode.error)
        out = nl.ndarray((2, 4), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    with pytest.raises(ValueError, match="indirect indices \\[99\\] are out of bounds"):
        nki.simulate(kernel)(data, indices, False)
    out = nki.simulate(kernel)(data, indices, True)
    np.testing.assert_array_equal(out, [data[1], [-1.0] * 4])


def test_language_guide_view_examples():
    def body():
        t = nl.ndarray((64, 64, 64), dtype=nl.float32, buffer=nl.sbuf)
        u = t[0, ...]
        c = nl.ndarray((128, 4, 16), dtype=nl.float32, buffer=nl.sbuf)
        f = nl.ndarray((128, 1024), dtype=nl.float16, buffer=nl.sbuf)
        pattern = f.get_pattern()
        pattern[0][1] = 64
        h = nl.ndarray((4, 128, 32), dtype=nl.float32, buffer=nl.shared_hbm)
        return (t[0:64, 0, 0:64].shape, t[:, :, ::2].shape, t[...].shape, t[0, ..., :].shape, u[:, 0:32, :].shape,
                c[0:64, :, :].permute((0, 2, 1))[:, 0, :].shape, f.ap(pattern=[(1024, 128), (2, 512)]).shape,
                f.ap(pattern=pattern).shape, h[0, :, :].shape, t.buffer == nl.sbuf, t.dtype == nl.float32)
    assert _in_kernel(body) == ((64, 64), (64, 64, 32), (64, 64, 64), (1, 64, 64), (1, 32, 64), (64, 4), (128, 512),
                                (64, 1024), (128, 32), True, True)


def test_dma_compute_plain_and_scatter_add():
    table = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
    rows = np.ones((3, 4), np.float32)
    idx = np.array([[1], [5], [6]], np.int32)

    def kernel(t, r, i):
        a = nl.ndarray((8, 4), nl.float32)
        nisa.dma_copy(dst=a, src=t)
        doubled = nl.ndarray((8, 4), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_compute(dst=doubled, srcs=[a, t], reduce_op=nl.add)
        idx_sb = nl.ndarray((3, 1), nl.int32)
        nisa.dma_copy(dst=idx_sb, src=i)
        r_sb = nl.ndarray((3, 4), nl.float32)
        nisa.dma_copy(dst=r_sb, src=r)
        scattered = t.ap([[4, 3], [1, 4]], vector_offset=idx_sb, indirect_dim=0)     # RMW into the input table
        nisa.dma_compute(dst=scattered, srcs=[scattered, r_sb], reduce_op=nl.add)
        return doubled

    data = table.copy()
    doubled = nki.simulate(kernel)(data, rows, idx)
    np.testing.assert_array_equal(doubled, 2 * table)
    expected = table.copy()
    expected[[1, 5, 6]] += 1
    np.testing.assert_array_equal(data, expected)
