"""Illegal kernels are rejected with a ValueError naming the instruction, operand, value and limit."""

import numpy as np
import pytest

from nkisim.errors import (CapacityError, KernelError, MemoryPlacementError, NkiError, PartitionError, ShapeError)

from nkisim_helpers import nisa, nki, nl


def _run(kernel, *args):
    return nki.simulate(kernel)(*args)


def test_errors_are_value_errors():
    assert issubclass(NkiError, ValueError)


def test_129_partitions():
    def kernel(x):
        t = nl.ndarray((129, 4), nl.float32)
        nisa.dma_copy(dst=t, src=x)

    with pytest.raises(ShapeError, match="ndarray: partition dim 129 exceeds 128 \\(nl.tile_size.pmax\\)"):
        _run(kernel, np.zeros((129, 4), np.float32))


def test_partition_check_names_instruction_operand_and_limit():
    from nkisim.isa import _checks
    from nkisim.tensor import Storage, NkiTensor
    view = NkiTensor(Storage("sbuf", (256, 4), np.float32))     # a storage nl.ndarray would refuse
    with pytest.raises(PartitionError, match="memset: operand 'dst' partition dim is 256, limit 128"):
        _checks.partitions("memset", "dst", view)


@pytest.mark.parametrize("start, size, ok", [(0, 128, True), (64, 64, True), (32, 64, False), (96, 32, True),
                                             (16, 16, False), (32, 33, False)])
def test_start_partition_alignment(start, size, ok):
    def kernel():
        t = nl.ndarray((128, 8), nl.float32)
        view = t[start:start + size] if start + size <= 128 else t.ap([[8, size], [1, 8]], offset=start * 8)
        nisa.memset(dst=view, value=0.0)

    if ok:
        _run(kernel)
    else:
        with pytest.raises(PartitionError, match=f"start partition \\(for {size} partitions\\) is {start}, limit one of"):
            _run(kernel)


def test_dma_from_psum():
    def kernel():
        p = nl.ndarray((128, 8), nl.float32, buffer=nl.psum)
        nisa.memset(dst=p, value=0.0)
        out = nl.ndarray((128, 8), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=p)
        return out

    with pytest.raises(MemoryPlacementError, match="dma_copy: operand 'src' is in psum; DMA cannot access PSUM"):
        _run(kernel)


def test_tensor_tensor_both_inputs_in_psum():
    def kernel():
        a = nl.ndarray((128, 8), nl.float32, buffer=nl.psum)
        b = nl.ndarray((128, 8), nl.float32, buffer=nl.psum)
        nisa.memset(dst=a, value=0.0)
        nisa.memset(dst=b, value=0.0)
        nisa.tensor_tensor(dst=nl.ndarray((128, 8), nl.float32), data1=a, data2=b, op=nl.add)

    with pytest.raises(MemoryPlacementError, match="tensor_tensor: operands 'data1' and 'data2' are both in psum"):
        _run(kernel)


def test_gpsimd_never_touches_psum():
    def kernel():
        p = nl.ndarray((128, 8), nl.int32, buffer=nl.psum)
        nisa.iota(dst=p, pattern=[[1, 8]])

    with pytest.raises(MemoryPlacementError, match="iota: operand 'dst' is in psum; GpSimd cannot access PSUM"):
        _run(kernel)


def test_mismatched_element_counts():
    def dma():
        t = nl.ndarray((128, 8), nl.float32)
        nisa.memset(dst=t, value=0.0)
        out = nl.ndarray((128, 9), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)

    def vector():
        t = nl.ndarray((128, 8), nl.float32)
        nisa.memset(dst=t, value=0.0)
        nisa.tensor_copy(dst=nl.ndarray((128, 4), nl.float32), src=t)

    with pytest.raises(ShapeError, match="dma_copy: dst has 1152 elements .* src has 1024 .* element counts must match"):
        _run(dma)
    with pytest.raises(ShapeError, match="tensor_copy: operands have different element counts per partition"):
        _run(vector)


def test_fp32_scalar_operands():
    def kernel():
        t = nl.ndarray((128, 8), nl.float32)
        nisa.memset(dst=t, value=1.0)
        col = nl.ndarray((128, 1), nl.bfloat16)
        nisa.memset(dst=col, value=1.0)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=col)

    with pytest.raises(Exception, match="tensor_scalar: operand 'operand0' is bfloat16; .* must be float32"):
        _run(kernel)


def test_sbuf_tensor_returned_as_output():
    def kernel(x):
        t = nl.ndarray(x.shape, x.dtype)
        nisa.dma_copy(dst=t, src=x)
        return t

    with pytest.raises(KernelError, match="returned tensor .* lives in sbuf; kernel outputs must be allocated with "
                                          "buffer=nl.shared_hbm"):
        _run(kernel, np.zeros((4, 4), np.float32))


def test_hbm_output_not_shared_is_rejected():
    def kernel(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.hbm)
        nisa.dma_copy(dst=out, src=x)
        return out

    with pytest.raises(KernelError, match="lives in hbm"):
        _run(kernel, np.zeros((4, 4), np.float32))


def test_sbuf_over_capacity_names_the_limit():
    def kernel():
        tiles = []
        for i in range(3):       # 3 x 128 KiB per partition live at once > 212984 B on trn2
            t = nl.ndarray((128, 32768), nl.float32)
            nisa.memset(dst=t, value=0.0)
            tiles.append(t)
        for t in tiles:
            nisa.memset(dst=t, value=1.0)

    with pytest.raises(CapacityError, match="peak live SBUF is 393216 bytes per partition, limit 212984 "
                                            "\\(usable SBUF on trn2\\)"):
        _run(kernel)


def test_sbuf_tiles_that_die_are_not_counted():
    def kernel():
        for i in range(10):      # 10 x 128 KiB, but each dies before the next is allocated
            t = nl.ndarray((128, 32768), nl.float32)
            nisa.memset(dst=t, value=0.0)

    _run(kernel)


def test_psum_over_capacity():
    def kernel():
        banks = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(9)]
        for b in banks:
            nisa.memset(dst=b, value=0.0)
        for b in banks:
            nisa.memset(dst=b, value=1.0)

    with pytest.raises(CapacityError, match="peak live PSUM is 18432 bytes per partition, limit 16384"):
        _run(kernel)


def test_bool_value_is_not_a_scalar_operand():
    def kernel():
        t = nl.ndarray((128, 8), nl.float32)
        nisa.memset(dst=t, value=1.0)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=True)

    with pytest.raises(ShapeError, match="operand 'operand0' is a bool"):
        _run(kernel)


def test_compiler_shape_rules():
    """Rules the compiler enforces beyond element counts (found by comparing with NKI, see triton-viz)."""
    def reduce_refactored():
        t = nl.ndarray((16, 8, 3), nl.float32)
        nisa.memset(dst=t, value=0.0)
        nisa.tensor_reduce(dst=nl.ndarray((16, 4, 2), nl.float32), op=nl.add, data=t, axis=2)

    def transpose_reshaped():
        t = nl.ndarray((8, 3), nl.float32)
        nisa.memset(dst=t, value=0.0)
        nisa.nc_transpose(dst=nl.ndarray((3, 2, 4), nl.float32, buffer=nl.psum), data=t, engine=nisa.engine.tensor)

    def matmul_3d_stationary():
        s = nl.ndarray((32, 2, 3), nl.float32)
        nisa.memset(dst=s, value=0.0)
        mv = nl.ndarray((32, 4, 5), nl.float32)
        nisa.memset(dst=mv, value=0.0)
        nisa.nc_matmul(dst=nl.ndarray((6, 4, 5), nl.float32, buffer=nl.psum), stationary=s, moving=mv)

    def reduce_res_3d():
        t = nl.ndarray((8, 4), nl.float32)
        nisa.memset(dst=t, value=0.0)
        nisa.activation(dst=t, op=nl.copy, data=t, reduce_op=nl.add, reduce_res=nl.ndarray((8, 1, 1), nl.float32),
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)

    def rsqrt_on_vector():
        t = nl.ndarray((8, 4), nl.float32)
        nisa.memset(dst=t, value=1.0)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.rsqrt, operand0=0, engine=nisa.engine.vector)

    for kernel, message in ((reduce_refactored, "free dims must be the kept dims"),
                            (transpose_reshaped, "TensorE transpose writes dst shape \\(3, 8\\) exactly"),
                            (matmul_3d_stationary, "operand 'stationary' must be rank-2"),
                            (reduce_res_3d, "operand 'reduce_res' has shape \\(8, 1, 1\\), must be \\[8, 1\\]"),
                            (rsqrt_on_vector, "nl.rsqrt is not a VectorE ALU operator")):
        with pytest.raises(ValueError, match=message):
            _run(kernel)


def test_compiler_shape_rules_accept_the_legal_forms():
    def kernel():
        t = nl.ndarray((16, 8, 3), nl.float32)
        nisa.memset(dst=t, value=1.0)
        nisa.tensor_reduce(dst=nl.ndarray((16, 8, 1), nl.float32), op=nl.add, data=t, axis=2, keepdims=True)
        s = nl.ndarray((32, 6), nl.float32)
        nisa.memset(dst=s, value=1.0)
        mv = nl.ndarray((32, 4, 5), nl.float32)
        nisa.memset(dst=mv, value=1.0)
        nisa.nc_matmul(dst=nl.ndarray((6, 4, 5), nl.float32, buffer=nl.psum), stationary=s, moving=mv)
        nisa.nc_matmul(dst=nl.ndarray((6, 20), nl.float32, buffer=nl.psum), stationary=s, moving=mv)
        r = nl.ndarray((16, 24), nl.float32)
        nisa.tensor_scalar(dst=r, data=t, op0=nl.rsqrt, operand0=0)        # placed on GpSimd

    with __import__("nkisim").trace() as t:
        _run(kernel)
    assert t.instructions[-1].engine == "gpsimd"


def test_pinned_addresses_share_bytes_and_must_fit():
    """Modular (multi-buffer) allocation as NKI's library does it: many PSUM tiles pinned to 4 banks."""
    def modular():
        for i in range(16):      # 16 x 2 KiB tiles, but only 4 distinct bank addresses
            acc = nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, (i % 4) * 2048))
            nisa.memset(dst=acc, value=0.0)
        late = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(4)]   # allocated up front
        for t in late:
            nisa.memset(dst=t, value=1.0)                                             # first used here

    _run(modular)

    def outside():
        acc = nl.ndarray((128, 1024), nl.float32, buffer=nl.psum, address=(0, 7 * 2048))
        nisa.memset(dst=acc, value=0.0)

    with pytest.raises(CapacityError, match="pinned at address 14336 needs bytes \\[14336, 18432\\) per partition, "
                                            "limit 16384"):
        _run(outside)


def test_raw_integer_enum_constants_are_refused():
    """NKI 0.3.0 migration guide: raw integers (e.g. dge_mode=2) are no longer accepted for enums."""
    def kernel(x):
        t = nl.ndarray(x.shape, x.dtype)
        nisa.dma_copy(dst=t, src=x, dge_mode=2)

    with pytest.raises(ValueError, match="dma_copy: 'dge_mode' must be a nisa.dge_mode member, got 2"):
        _run(kernel, np.zeros((2, 2), np.float32))

    def kernel2(x):
        t = nl.ndarray(x.shape, x.dtype)
        nisa.dma_copy(dst=t, src=x)
        nisa.activation(dst=t, op=nl.exp, data=t, reduce_op=nl.add, reduce_cmd=3)

    with pytest.raises(ValueError, match="'reduce_cmd' must be a nisa.reduce_cmd member"):
        _run(kernel2, np.zeros((2, 2), np.float32))


def test_migration_rules_strings_and_memset_types():
    """NKI 0.3.0: string buffer names are refused; memset wants an integer literal for integer tiles."""
    with pytest.raises(KernelError, match="string buffer names are not accepted since NKI 0.3.0; use nl.sbuf"):
        _run(lambda: nl.ndarray((128, 4), nl.float16, buffer="sbuf"))

    def int_memset():
        t = nl.ndarray((128, 4), nl.int32)
        nisa.memset(dst=t, value=2.0)

    with pytest.raises(ValueError, match="memset: value 2.0 must be an integer literal for dtype int32"):
        _run(int_memset)

    def legal():
        t = nl.ndarray((128, 4), nl.bfloat16, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0)                 # an int for a float tile is fine (docs do this)
        assert t.buffer == nl.sbuf == "sbuf"
        nl.full((2, 2), 1.0, nl.int32)              # nl.full converts an integral fill value

    _run(legal)
