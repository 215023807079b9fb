"""Loading the built artifact the way users do: LOCAL_KERNELS + ``get_kernel(repo, version=1)``, on a CPU host
and on a simulated Neuron host (see conftest.py), and the Transformers entry point it exposes."""

from __future__ import annotations

import nkisim
import pytest
import torch
import torch.nn.functional as F
from hub_env import REPO_ID, fake_torch_neuron
from kernels import get_kernel, get_loaded_kernels
from kernels._rust import Backend

from hubtools import upload

BATCH, HEADS, SEQ, HEAD_DIM = 2, 3, 197, 64        # ViT-B/16 sequence length, odd on purpose
# Tolerances against SDPA on the same inputs, by dtype. fp32: the kernel accumulates in fp32 in a different order
# than SDPA (blockwise softmax), ~1e-6 relative per op over a 197-long reduction. bf16: one bf16 rounding of the
# output (2^-8 relative) plus bf16 probabilities fed to the PV matmul.
TOLERANCE = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def transformers_qkv(dtype):
    """q, k, v as Transformers hands them to the attention function: (B, H, S, D) views of (B, S, H, D)."""
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(BATCH, SEQ, HEADS, HEAD_DIM, generator=generator).to(dtype).transpose(1, 2)
            for _ in range(3)]


def vision_attention_module():
    """What Transformers passes as ``module``: vision attention layers set ``is_causal = False``."""
    module = torch.nn.Module()
    module.is_causal = False
    return module


def sdpa_bshd(q, k, v):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float()).transpose(1, 2)


def loaded_metadata(module):
    return next(k.metadata for k in get_loaded_kernels() if k.module is module)


def test_cpu_host_loads_torch_cpu_and_runs_the_reference_by_default(local_hub):
    module = get_kernel(REPO_ID, version=1)
    assert module.__name__ == local_hub.variant_ids["torch-cpu"]
    metadata = loaded_metadata(module)
    assert metadata.backend.backend_type == Backend.CPU and metadata.python_depends == []
    assert module.supports_flash_attn is True
    q, k, v = transformers_qkv(torch.float32)
    with nkisim.trace() as executed:
        out, weights = module.flash_attn_forward(vision_attention_module(), q, k, v, None, dropout=0.0, scaling=None)
    assert len(executed) == 0, "the default CPU backend is the eager reference, not the kernel"
    assert weights is None and out.shape == (BATCH, SEQ, HEADS, HEAD_DIM) and out.is_contiguous()
    torch.testing.assert_close(out, sdpa_bshd(q, k, v), **TOLERANCE[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_simulated_neuron_host_loads_torch_neuron_and_runs_the_nki_kernel(local_hub, neuron_host, dtype):
    module = get_kernel(REPO_ID, version=1)
    assert module.__name__ == local_hub.variant_ids["torch-neuron"]
    metadata = loaded_metadata(module)
    assert metadata.backend.backend_type == Backend.Neuron and metadata.python_depends == ["nki"]
    q, k, v = transformers_qkv(dtype)
    with nkisim.trace() as executed:
        out, weights = module.flash_attn_forward(vision_attention_module(), q, k, v, None, dropout=0.0,
                                                 scaling=HEAD_DIM ** -0.5, is_causal=False)
    assert executed.count("nc_matmul") > 0, "the NKI kernel must have run"
    assert weights is None and out.shape == (BATCH, SEQ, HEADS, HEAD_DIM) and out.is_contiguous()
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), sdpa_bshd(q, k, v), **TOLERANCE[dtype])


def test_cpu_variant_runs_the_nki_kernel_with_the_sim_backend(local_hub, monkeypatch):
    monkeypatch.setenv("NEURON_VIT_ATTN_BACKEND", "sim")
    module = get_kernel(REPO_ID, version=1)
    assert module.__name__ == local_hub.variant_ids["torch-cpu"]
    q, k, v = (t.contiguous() for t in transformers_qkv(torch.float32))
    with nkisim.trace() as executed:
        out = module.attention(q, k, v)
    assert executed.count("nc_matmul") > 0
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), **TOLERANCE[torch.float32])


def test_both_variants_in_one_process_keep_separate_op_namespaces(local_hub, monkeypatch):
    cpu = get_kernel(REPO_ID, version=1)
    fake_torch_neuron(monkeypatch)
    nkisim.install()
    neuron = get_kernel(REPO_ID, version=1)
    assert cpu is not neuron
    namespaces = {cpu._ops._OPS_NAME, neuron._ops._OPS_NAME}
    assert namespaces == {local_hub.variant_ids["torch-cpu"], local_hub.variant_ids["torch-neuron"]}


def test_dry_run_upload_of_this_build_names_branch_v1_and_the_neuron_files(hub_build, capsys):
    root, _ = hub_build
    assert upload.main(["--repo-id", REPO_ID, "--build-dir", str(root / "build"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "branch: v1" in out
    neuron_files = sorted(p.relative_to(root).as_posix() for p in (root / "build" / "torch-neuron").rglob("*")
                          if p.is_file() and "__pycache__" not in p.parts)
    assert "build/torch-neuron/_nki/attention.py" in neuron_files
    for path in neuron_files:
        assert f"  {path}\n" in out
