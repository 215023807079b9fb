"""Attention benchmarks over the real vision-model shapes (bshd layout, bf16, batch 1 and 8).

Per case: CPU wall time of the eager reference (torch SDPA), CPU wall time of the nkisim run of
kernels/attention.py (one round: it is an interpreter), and the cost-model ESTIMATE of that trace
on trn1/trn2/trn3 in extra_info and bench/out/. On a host with a Neuron device the device cases
time the real kernel through the torch op and the eager and torch.compile SDPA references on the
device; elsewhere they are skipped with the reason (skipped, not passed).
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

from cases import (BATCHES, MODELS, TARGETS, attention_bytes, attention_flops, load_attention_kernel,
                   neuron_device_available)
from estimates import record_nkisim_run

ATTENTION = load_attention_kernel()
CASES = [pytest.param(shape, batch, id=f"{shape.model}-B{batch}") for shape in MODELS for batch in BATCHES]
NO_KERNEL = "kernels/attention.py does not exist yet; bench/test_bench_matmul.py benchmarks the nkisim matmul example"
NO_DEVICE = ("no Neuron device on this host (torch.neuron unavailable): device timing skipped; the report holds "
             "cost-model estimates only")


def bshd_inputs(shape, batch):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(batch, shape.seq, shape.heads, shape.head_dim, generator=g).to(torch.bfloat16)
            for _ in range(3)]


def sdpa_bshd(q, k, v, scale):
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale)
    return out.transpose(1, 2)


@pytest.mark.parametrize("shape, batch", CASES)
def test_eager_reference_cpu(benchmark, collector, shape, batch):
    q, k, v = bshd_inputs(shape, batch)
    scale = shape.head_dim ** -0.5
    benchmark.group = f"attention {shape.label(batch)}"
    benchmark(sdpa_bshd, q, k, v, scale)
    collector.add_cpu(shape.label(batch), eager_cpu_us=benchmark.stats.stats.mean * 1e6)


@pytest.mark.skipif(ATTENTION is None, reason=NO_KERNEL)
@pytest.mark.parametrize("lnc", [1, 2], ids=["lnc1", "lnc2"])
@pytest.mark.parametrize("shape, batch", CASES)
def test_nkisim_attention(benchmark, collector, progress, shape, batch, lnc):
    """lnc=2: attention_fwd[2], the LNC=2 launch (trn2's default runtime configuration) that splits
    the work across two physical NeuronCores; estimated on trn2/trn3 against the 2-core roofline."""
    q, k, v = bshd_inputs(shape, batch)
    scale = shape.head_dim ** -0.5
    traces = []

    def run():
        import nkisim
        with nkisim.trace() as t:
            out = ATTENTION[lnc](q, k, v, scale=scale, layout="bshd")
        traces.append(t)
        return out

    benchmark.group = f"attention {shape.label(batch)}"
    start = time.perf_counter()
    out = benchmark.pedantic(run, rounds=1, iterations=1)      # an interpreter run: one round is enough
    elapsed = time.perf_counter() - start
    ref = sdpa_bshd(q.float(), k.float(), v.float(), scale)
    # bf16 inputs: P is rounded to bf16 before the PV matmul and the output to bf16 (2^-8 relative each).
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)

    kernel, targets = ("attention_fwd", TARGETS) if lnc == 1 else (f"attention_fwd[{lnc}]", ("trn2", "trn3"))
    record_nkisim_run(benchmark, collector, progress, traces[-1], kernel, shape.label(batch),
                      attention_flops(batch, shape), attention_bytes(batch, shape), elapsed, targets=targets, cores=lnc)


def _timed_on_device(benchmark, shape, batch, fn):
    """Benchmark ``fn()`` on the Neuron device, waiting for the device inside the timed region."""
    sync = getattr(getattr(torch, "neuron", None), "synchronize", None)

    def run():
        out = fn()
        if sync is not None:
            sync()
        return out

    benchmark.group = f"attention {shape.label(batch)}"
    return benchmark(run)


@pytest.mark.skipif(not neuron_device_available(), reason=NO_DEVICE)
@pytest.mark.parametrize("shape, batch", CASES)
def test_device_kernel(benchmark, collector, shape, batch):
    import neuron_vit_attn
    q, k, v = (x.to("neuron") for x in bshd_inputs(shape, batch))
    scale = shape.head_dim ** -0.5
    out = _timed_on_device(benchmark, shape, batch, lambda: neuron_vit_attn.attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale))
    ref = sdpa_bshd(q.cpu().float(), k.cpu().float(), v.cpu().float(), scale)
    torch.testing.assert_close(out.transpose(1, 2).cpu().float(), ref, atol=2e-2, rtol=2e-2)   # bf16, as above
    collector.device[shape.label(batch)] = benchmark.stats.stats.mean * 1e6


@pytest.mark.skipif(not neuron_device_available(), reason=NO_DEVICE)
@pytest.mark.parametrize("shape, batch", CASES)
def test_device_eager_reference(benchmark, shape, batch):
    q, k, v = (x.to("neuron") for x in bshd_inputs(shape, batch))
    scale = shape.head_dim ** -0.5
    _timed_on_device(benchmark, shape, batch, lambda: sdpa_bshd(q, k, v, scale))


@pytest.mark.skipif(not neuron_device_available(), reason=NO_DEVICE)
@pytest.mark.parametrize("shape, batch", CASES)
def test_device_compiled_reference(benchmark, shape, batch):
    q, k, v = (x.to("neuron") for x in bshd_inputs(shape, batch))
    scale = shape.head_dim ** -0.5
    compiled = torch.compile(sdpa_bshd)
    compiled(q, k, v, scale)          # compile outside the timed region
    _timed_on_device(benchmark, shape, batch, lambda: compiled(q, k, v, scale))
