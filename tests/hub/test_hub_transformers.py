"""Transformers swaps the Hub kernel in at load time: ``attn_implementation="org/neuron-vit-attn"`` for ViT, DeiT,
CLIP vision, SigLIP vision, DINOv2 and the Qwen2-VL vision tower (tiny random-weight models from configs, weights
copied from an sdpa twin), on a simulated Neuron host where the torch-neuron variant's NKI kernel runs in nkisim."""

from __future__ import annotations

import nkisim
import pytest
import torch
from hub_env import REPO_ID
from hub_models import LAYERS, tiny_models
from transformers import AutoModel

MODELS = tiny_models()
# fp32 end to end: a few layers of kernel-vs-SDPA differences (~1e-6 relative each, different summation order)
# pass through LayerNorms and MLPs; 1e-4 leaves room for that and still catches a wrong softmax or head mix-up.
TOLERANCE = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(autouse=True)
def fresh_kernel_registration(monkeypatch):
    """Transformers loads a Hub attention kernel once per process and registers it globally; each test here
    changes the host (CPU or simulated Neuron), so each starts unloaded and leaves the registries as they were."""
    import transformers.modeling_flash_attention_utils as flash_utils
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    monkeypatch.setattr(flash_utils, "_loaded_implementation", None)
    for registry in (ALL_ATTENTION_FUNCTIONS, ALL_MASK_ATTENTION_FUNCTIONS):
        monkeypatch.setattr(type(registry), "_global_mapping", dict(type(registry)._global_mapping))


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs).last_hidden_state


def registered_module_name():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    return ALL_ATTENTION_FUNCTIONS[REPO_ID].__module__


@pytest.mark.parametrize("name", list(MODELS))
def test_model_with_the_hub_kernel_matches_its_sdpa_twin(name, local_hub, neuron_host):
    tiny = MODELS[name]
    reference = tiny.build("sdpa")
    model = tiny.build(REPO_ID)
    assert model.config._attn_implementation == REPO_ID and reference.config._attn_implementation == "sdpa"
    assert registered_module_name().startswith(local_hub.variant_ids["torch-neuron"] + "."), \
        "Transformers must call the torch-neuron build's flash_attn_forward"
    model.load_state_dict(reference.state_dict())
    inputs = tiny.inputs()
    with nkisim.trace() as executed:
        out = run(model, inputs)
    # one kernel launch per layer and head group, each with QK^T and PV matmuls
    assert executed.count("nc_matmul") >= 2 * LAYERS, f"the NKI kernel did not run for {name}"
    torch.testing.assert_close(out, run(reference, inputs), **TOLERANCE)


def test_from_pretrained_swaps_the_kernel_in(tmp_path, local_hub, neuron_host):
    tiny = MODELS["vit"]
    reference = tiny.build("sdpa")
    reference.save_pretrained(tmp_path)
    model = AutoModel.from_pretrained(tmp_path, attn_implementation=REPO_ID).eval()
    assert model.config._attn_implementation == REPO_ID
    inputs = tiny.inputs()
    with nkisim.trace() as executed:
        out = run(model, inputs)
    assert executed.count("nc_matmul") > 0
    torch.testing.assert_close(out, run(reference, inputs), **TOLERANCE)


def test_cpu_host_loads_the_cpu_build_and_runs_the_reference(local_hub):
    tiny = MODELS["siglip_vision"]
    reference = tiny.build("sdpa")
    model = tiny.build(REPO_ID)
    assert registered_module_name().startswith(local_hub.variant_ids["torch-cpu"] + ".")
    model.load_state_dict(reference.state_dict())
    inputs = tiny.inputs()
    with nkisim.trace() as executed:
        out = run(model, inputs)
    assert len(executed) == 0, "the CPU build's default backend is the eager reference"
    torch.testing.assert_close(out, run(reference, inputs), **TOLERANCE)
