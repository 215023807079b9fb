"""The scheduler: engines run concurrently, each in program order; RAW/WAR/WAW dependencies
through overlapping memory (SBUF, PSUM, HBM); DMA latency overlaps while bandwidth is shared;
PE tiling runs matmuls on disjoint sub-arrays concurrently."""

import ml_dtypes
import numpy as np
import pytest

import nkisim
from nkisim.cost import constants as C
from nkisim.cost.schedule import schedule_program
from cost_synthetic import matmul

nkisim.install()
import nki  # noqa: E402 - resolves to nkisim after install()
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

TRN2 = C.TARGETS["trn2"]
BF16 = ml_dtypes.bfloat16


def run(kernel, *arrays):
    with nkisim.trace() as t:
        nkisim.simulate(kernel)(*arrays)
    return schedule_program(t.instructions, TRN2).slots


def slots_named(slots, name):
    return [s for s in slots if s.instr.name == name]


@nki.jit
def vector_and_scalar_in_parallel(x):
    tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    a = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    b = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    for _ in range(4):
        nisa.tensor_copy(dst=a, src=tile)                   # VectorE
        nisa.activation(dst=b, op=nl.exp, data=tile)        # ScalarE, independent of VectorE's work
    c = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=c, data1=a, data2=b, op=nl.add)  # needs both
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=c)
    return out


def test_independent_engines_overlap_and_raw_waits():
    slots = run(vector_and_scalar_in_parallel, np.zeros((128, 512), BF16))
    copies, acts = slots_named(slots, "tensor_copy"), slots_named(slots, "activation")
    load = slots_named(slots, "dma_copy")[0]
    assert copies[0].start >= load.end and acts[0].start >= load.end          # RAW on the loaded tile
    assert acts[0].start < copies[-1].end                                     # ScalarE runs beside VectorE
    for earlier, later in zip(copies, copies[1:]):                            # one engine: program order
        assert later.start >= earlier.end
    add = slots_named(slots, "tensor_tensor")[0]
    assert add.start >= max(copies[-1].end, acts[-1].end)                     # RAW on both inputs
    store = slots_named(slots, "dma_copy")[1]
    assert store.start >= add.end


@nki.jit
def war_and_waw(x):
    tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=y, op=nl.exp, data=tile)            # ScalarE reads tile
    nisa.memset(dst=tile, value=0.0, engine=nisa.engine.vector)   # VectorE overwrites it: WAR
    nisa.tensor_copy(dst=y, src=tile, engine=nisa.engine.gpsimd)  # GpSimd writes y again: WAW (and RAW on tile)
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=y)
    return out


def test_write_after_read_and_write_after_write():
    slots = run(war_and_waw, np.zeros((128, 512), BF16))
    act, memset = slots_named(slots, "activation")[0], slots_named(slots, "memset")[0]
    copy = slots_named(slots, "tensor_copy")[0]
    assert memset.start >= act.end                 # WAR: VectorE waits for ScalarE's read
    assert copy.start >= max(act.end, memset.end)  # WAW on y, RAW on tile


@nki.jit
def disjoint_parts_of_one_tile(x):
    tile = nl.ndarray((128, 256, 2), dtype=nl.float32, buffer=nl.sbuf)
    src = nl.ndarray((128, 256), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=x)
    nisa.tensor_copy(dst=tile[:, :, 0], src=src)                          # even elements, VectorE
    nisa.activation(dst=tile[:, :, 1], op=nl.exp, data=src)              # odd elements, ScalarE
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=tile.reshape((128, 512)))
    return out


def test_interleaved_views_of_one_tile_do_not_depend_on_each_other():
    slots = run(disjoint_parts_of_one_tile, np.zeros((128, 256), BF16))
    copy, act = slots_named(slots, "tensor_copy")[0], slots_named(slots, "activation")[0]
    assert act.start < copy.end and copy.start < act.end      # they overlap in time: no false WAW
    store = slots_named(slots, "dma_copy")[1]
    assert store.start >= max(copy.end, act.end)              # the store reads both halves


@nki.jit
def per_head_stores_then_reload(x):
    S, H, D = x.shape
    out = nl.ndarray((S, H, D), dtype=x.dtype, buffer=nl.shared_hbm)
    for h in range(H):
        tile = nl.ndarray((S, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x[:, h, :])
        nisa.dma_copy(dst=out[:, h, :], src=tile)
    back = nl.ndarray((S, D), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=back, src=out[:, 0, :])                # reads what the first store wrote
    final = nl.ndarray((S, D), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=final, src=back)
    return final


def test_hbm_regions_of_different_heads_are_independent():
    slots = run(per_head_stores_then_reload, np.zeros((128, 4, 64), BF16))
    dmas = slots_named(slots, "dma_copy")
    stores = [dmas[i] for i in (1, 3, 5, 7)]
    assert stores[1].start < stores[0].end                   # no false WAW between heads in one HBM tensor
    reload = dmas[8]
    assert reload.start >= stores[0].end                     # RAW through HBM


@nki.jit
def many_loads(x):
    n = x.shape[0] // 128
    for i in range(n):
        tile = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x[i * 128:(i + 1) * 128, :])
    out = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=tile)
    return out


def test_dma_fixed_latency_overlaps_and_bandwidth_is_shared():
    # Small loads (16 KiB): 32 of them cost about one fixed latency plus their data, not 32 latencies.
    small = run(many_loads, np.zeros((128 * 32, 64), BF16))[:32]
    single_ns = small[0].end - small[0].start
    data_ns = single_ns - C.DMA_FIXED_NS
    assert max(s.end for s in small) == pytest.approx(C.DMA_FIXED_NS + 32 * data_ns, rel=0.01)
    assert max(s.end for s in small) < 32 * single_ns / 4
    # Large loads (512 KiB): bandwidth-bound, all 16 engines shared: bytes / (16 x 23 B/ns) + one latency.
    large = run(many_loads, np.zeros((128 * 32, 2048), BF16))[:32]
    bandwidth_ns = 32 * 128 * 2048 * 2 / (C.DMA_ENGINES * TRN2.dma_bytes_per_ns)
    assert max(s.end for s in large) == pytest.approx(bandwidth_ns + C.DMA_FIXED_NS, rel=0.01)


def test_pe_tiling_runs_disjoint_tiles_concurrently():
    quarter = dict(k=32, m=32, n=512)
    left = matmul(tile_position=(0, 0), tile_size=(32, 32), **quarter)
    right = matmul(tile_position=(32, 32), tile_size=(32, 32), **quarter)
    whole_a, whole_b = matmul(**quarter), matmul(**quarter)
    tiled = schedule_program([left, right], TRN2).slots
    untiled = schedule_program([whole_a, whole_b], TRN2).slots
    assert tiled[1].start == tiled[0].start                    # disjoint sub-arrays: concurrent
    assert untiled[1].start >= untiled[0].end                  # whole array: one after the other


@nki.jit
def two_tiled_matmuls(a, b):
    a_sb = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    b_sb = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a_sb, src=a)
    nisa.dma_copy(dst=b_sb, src=b)
    left = nl.ndarray((64, 512), dtype=nl.float32, buffer=nl.psum)
    right = nl.ndarray((64, 512), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=left, stationary=a_sb[0:64, 0:64], moving=b_sb[0:64, :], tile_position=(0, 0),
                   tile_size=(64, 64))
    nisa.nc_matmul(dst=right, stationary=a_sb[64:128, 64:128], moving=b_sb[64:128, :], tile_position=(64, 64),
                   tile_size=(64, 64))
    out = nl.ndarray((64, 1024), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out[:, 0:512], src=left)
    nisa.tensor_copy(dst=out[:, 512:1024], src=right)
    result = nl.ndarray((64, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=result, src=out)
    return result


def test_pe_tiling_from_a_real_trace():
    slots = run(two_tiled_matmuls, np.zeros((128, 128), BF16), np.zeros((128, 512), BF16))
    first, second = slots_named(slots, "nc_matmul")
    assert first.instr.attrs.get("tile_size") == (64, 64)
    assert second.start < first.end                                # disjoint quadrants overlap in time


@nki.jit
def stream_large_tiles(x):
    n, free = x.shape[0] // 128, x.shape[1]
    sums = nl.ndarray((128, n), dtype=nl.float32, buffer=nl.sbuf)
    for i in range(n):
        tile = nl.ndarray((128, free), dtype=x.dtype, buffer=nl.sbuf)      # a fresh 48 KiB per partition
        nisa.dma_copy(dst=tile, src=x[i * 128:(i + 1) * 128, :])
        nisa.tensor_reduce(dst=sums[:, i:i + 1], op=nl.add, data=tile, axis=1, keepdims=True)
    out = nl.ndarray((128, n), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=sums)
    return out


def test_loads_cannot_run_further_ahead_than_sbuf_allows():
    slots = run(stream_large_tiles, np.zeros((128 * 6, 24576), BF16))
    loads, reduces = slots_named(slots, "dma_copy")[:6], slots_named(slots, "tensor_reduce")
    # 212984 B usable per partition on trn2: four 48 KiB tiles (plus the sums) fit, the fifth load
    # must wait until the first tile's reduce has finished and released it.
    assert all(load.start == 0.0 for load in loads[:4])
    assert loads[4].start >= reduces[0].end


@nki.jit
def vector_and_gpsimd_on_sbuf(x):
    tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    b = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=a, src=tile, engine=nisa.engine.vector)
    nisa.tensor_copy(dst=b, src=tile, engine=nisa.engine.gpsimd)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.tensor_tensor(dst=a, data1=a, data2=b, op=nl.add)
    nisa.dma_copy(dst=out, src=a)
    return out


@pytest.mark.parametrize("target, concurrent", [("trn1", False), ("trn2", True)])
def test_trn1_vector_and_gpsimd_take_turns_on_sbuf(target, concurrent):
    with nkisim.trace() as t:
        nkisim.simulate(vector_and_gpsimd_on_sbuf)(np.zeros((128, 512), np.float32))
    slots = slots_named(schedule_program(t.instructions, C.TARGETS[target]).slots, "tensor_copy")
    vector, gpsimd = slots
    assert (gpsimd.start < vector.end) == concurrent
