"""install()/find_spec, nki.jit / nki.simulate / kernel[2], NumPy and torch conversion, trace."""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
import torch

import nkisim

from nkisim_helpers import BF16, nisa, nki, nl


@nki.jit
def add_kernel(a_input, b_input):
    """The docs' add kernel (nki-reference.md section 1.2)."""
    assert a_input.shape[0] <= nl.tile_size.pmax
    a = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=a_input)
    b = nl.ndarray(b_input.shape, dtype=b_input.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=b, src=b_input)
    c = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=c, data1=a, data2=b, op=nl.add)
    out = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=c)
    return out


def test_install_resolves_nki_with_module_specs():
    assert nkisim.install() is True and nkisim.installed()
    assert importlib.util.find_spec("nki") is not None
    assert importlib.util.find_spec("nki.language") is not None
    assert importlib.util.find_spec("nki.isa") is not None
    import nki.isa
    import nki.language
    assert nki.isa.nc_matmul is nkisim.isa.nc_matmul
    assert nki.language.tile_size.pmax == 128 and nki.jit is nkisim.jit
    from nki.isa.constants import dge_mode       # the real package's enum module, used by NKI's library
    import nki.typing as nt
    assert dge_mode.hwdge == nki.isa.dge_mode.hwdge and isinstance(nki.language.float32, nki.dtype)
    assert repr(nt.tensor[128, 512]) == "nt.tensor[128, 512]"


def test_install_in_a_fresh_interpreter():
    code = ("import importlib.util, nkisim; assert importlib.util.find_spec('nki') is None or True; "
            "print(nkisim.install()); import nki, nki.language as nl, nki.isa as nisa; "
            "print(importlib.util.find_spec('nki').name, nl.psum, nisa.reduce_cmd.reset_reduce.value)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "nki", "psum", "3"]


def test_numpy_in_numpy_out_and_jit_call():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = nki.simulate(add_kernel)(a, a)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_array_equal(out, 2 * a)
    np.testing.assert_array_equal(add_kernel(a, a), 2 * a)       # calling the @nki.jit kernel simulates too


def test_torch_in_torch_out_bf16():
    a = torch.randn(8, 16, dtype=torch.bfloat16)
    out = add_kernel(a, a)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    # bf16 + bf16 of equal values doubles exactly
    torch.testing.assert_close(out, a * 2, rtol=0, atol=0)


def test_ml_dtypes_inputs_and_float64_rejected():
    a = np.ones((2, 2), BF16)
    assert nki.simulate(add_kernel)(a, a).dtype == BF16
    with pytest.raises(ValueError, match="NKI has no 64-bit types"):
        nki.simulate(add_kernel)(np.ones((2, 2)), np.ones((2, 2)))


def test_non_tensor_arguments_are_compile_time_constants_and_inputs_written_back():
    def kernel(x, scale, out_buf):
        t = nl.ndarray(x.shape, nl.float32)
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=float(scale))
        nisa.dma_copy(dst=out_buf, src=t)       # preallocated output argument, written in place

    a = np.ones((2, 3), np.float32)
    buf = np.zeros((2, 3), np.float32)
    assert nki.simulate(kernel)(a, 3, buf) is None
    np.testing.assert_array_equal(buf, 3 * a)


@nki.jit
def lnc_scale_kernel(x):
    """Each logical core scales its half of the rows (program_id splits the work)."""
    rows = x.shape[0] // nl.num_programs(0)
    start = nl.program_id(0) * rows
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((rows, x.shape[1]), x.dtype)
    nisa.dma_copy(dst=t, src=x[start:start + rows])
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=float(nl.program_id(0) + 1))
    nisa.dma_copy(dst=out[start:start + rows], src=t)
    return out


def test_lnc2_programs_split_work_into_one_shared_output():
    a = np.zeros((256, 8), np.float32)
    with nkisim.trace() as t:
        out = lnc_scale_kernel[2](a)
    np.testing.assert_array_equal(out[:128], 1.0)
    np.testing.assert_array_equal(out[128:], 2.0)
    assert {i.program_id for i in t} == {0, 1}
    ids = [(i.program_id, i.index) for i in t]
    assert ids == sorted(ids)       # deterministic order although the programs ran as two threads
    np.testing.assert_array_equal(nki.simulate(lnc_scale_kernel[2])(a), out)
    np.testing.assert_array_equal(lnc_scale_kernel(a[:128]), 1.0)     # LNC=1: one program, all rows


def test_bad_launch_grids():
    with pytest.raises(ValueError, match="must be 1 or 2"):
        lnc_scale_kernel[4]
    with pytest.raises(ValueError, match="one LNC degree"):
        lnc_scale_kernel[2, 2]


def test_trace_records_operands():
    a = np.ones((4, 8), BF16)
    with nkisim.trace() as t:
        add_kernel(a, a)
    assert t.names() == ["dma_copy", "dma_copy", "tensor_tensor", "dma_copy"]
    tt = t.instructions[2]
    assert tt.engine == "vector" and tt.attrs["op"] == "add"
    assert tt.operand("dst").buffer == "sbuf" and tt.operand("data1").dtype == "bfloat16"
    assert tt.elements == 8 and t.instructions[0].bytes_moved == 64


def test_target_selection(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "gen4")
    assert nisa.get_nc_version() == nisa.nc_version.gen4
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn9")
    with pytest.raises(ValueError, match="unknown target 'trn9'"):
        nisa.get_nc_version()


def test_runtime_loops_and_registers():
    def kernel(x, n):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        count = nl.ndarray((1, 1), nl.int32)
        nisa.dma_copy(dst=count, src=n)
        upper = nisa.register_alloc()
        nisa.register_load(upper, count)
        t = nl.ndarray((1, x.shape[1]), x.dtype)

        def body(i):
            nisa.dma_copy(dst=t, src=x.ap([[x.shape[1], 1], [1, x.shape[1]]], offset=0, scalar_offset=i,
                                          indirect_dim=0))
            nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
            nisa.dma_copy(dst=out.ap([[x.shape[1], 1], [1, x.shape[1]]], offset=0, scalar_offset=i, indirect_dim=0),
                          src=t)

        nl.fori_loop(0, upper, body)
        return out

    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    out = nki.simulate(kernel)(x, np.array([[3]], np.int32))
    np.testing.assert_array_equal(out[:3], 2 * x[:3])


def test_dynamic_while_and_dynamic_range_with_register_bound():
    """The language guide's dynamic control flow: ``for i in dynamic_range(reg)`` and ``while reg:``."""
    def kernel(x, count_in):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        count_sb = nl.ndarray((1, 1), nl.int32)
        nisa.dma_copy(dst=count_sb, src=count_in)
        count = nisa.register_alloc(0)
        nisa.register_load(count, count_sb)
        t = nl.ndarray((1, x.shape[1]), x.dtype)
        for i in nl.dynamic_range(count):
            nisa.dma_copy(dst=t, src=x[i:i + 1])
            nisa.dma_copy(dst=out[i:i + 1], src=t)
        cond = nl.ndarray((1, 1), nl.int32)
        one = nl.ndarray((1, 1), nl.int32)
        nisa.memset(dst=one, value=1)
        reg = nisa.register_alloc(1)
        nisa.register_store(cond, reg)
        while reg:                                    # runs once: cond becomes 0
            nisa.tensor_tensor(dst=cond, data1=cond, data2=one, op=nl.subtract)
            nisa.register_load(reg, cond)
        return out

    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    out = nki.simulate(kernel)(x, np.array([[2]], np.int32))
    np.testing.assert_array_equal(out[:2], x[:2])


@nki.jit
def lnc_barrier_kernel(x):
    """Each core writes its half of a shared tensor, both wait at core_barrier, then each core reads
    the *other* core's half: correct only if the programs really run concurrently."""
    rows = x.shape[0] // 2
    me = nl.program_id(0)
    other = 1 - me
    shared = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((rows, x.shape[1]), x.dtype)
    nisa.dma_copy(dst=t, src=x[me * rows:(me + 1) * rows])
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=10.0)
    nisa.dma_copy(dst=shared[me * rows:(me + 1) * rows], src=t)
    nisa.core_barrier(data=shared, cores=(0, 1))
    u = nl.ndarray((rows, x.shape[1]), x.dtype)
    nisa.dma_copy(dst=u, src=shared[other * rows:(other + 1) * rows])
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[me * rows:(me + 1) * rows], src=u)
    # ring exchange of one tile through sendrecv
    got = nl.ndarray((rows, x.shape[1]), x.dtype)
    nisa.sendrecv(src=t, dst=got, send_to_rank=other, recv_from_rank=other, pipe_id=0)
    swapped = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=swapped[me * rows:(me + 1) * rows], src=got)
    return out, swapped


def test_lnc2_core_barrier_and_sendrecv_run_concurrently():
    x = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
    out, swapped = lnc_barrier_kernel[2](x)
    expected = np.concatenate([x[4:] * 10, x[:4] * 10])
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(swapped, expected)


def test_lnc_communication_errors():
    with pytest.raises(ValueError, match="core_barrier: needs an LNC=2 launch"):
        lnc_barrier_kernel(np.zeros((8, 4), np.float32))

    @nki.jit
    def one_sided(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        if nl.program_id(0) == 0:
            nisa.core_barrier(data=out, cores=(0, 1))
        return out

    with pytest.raises(ValueError, match="core_barrier: program 0 waits for program 1, which already finished"):
        one_sided[2](np.zeros((8, 4), np.float32))


def test_scheduling_apis_are_accepted():
    def kernel(x):
        t = nl.ndarray(x.shape, x.dtype)
        load = nisa.dma_copy(dst=t, src=x, name="load")
        with nl.no_reorder():
            scale = nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0, name="scale")
        scale.depends_on(load)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.ones((2, 2), np.float32)
    np.testing.assert_array_equal(nki.jit(kernel).with_schedule([("scale", "load")])(x), 2 * x)


def test_nkiobject_initializer_semantics():
    """Language guide "Class Support": fields become initializer parameters, with or without @dataclass."""
    from dataclasses import dataclass

    @dataclass
    class C(nl.NKIObject):
        x: int
        y: bool = False

        def toggle(self):
            self.y = not self.y

    @dataclass
    class Params(nl.NKIObject):     # plain class attributes, as in NKI's attention kernel
        section_idx = None
        section_offset = 0

    class A(nl.NKIObject):
        x: int = 1

        def __init__(self, x):
            self.x = x

    c = C(1)
    c.toggle()
    assert (c.x, c.y) == (1, True)
    p = Params(section_idx=3)
    assert (p.section_idx, p.section_offset) == (3, 0)
    assert A(5).x == 5
