"""``kernels.kernelize`` with a layer from the built artifact: Transformers' ViTAttention, marked with
``replace_kernel_forward_from_hub``, gets ``layers.ViTAttention`` of build/torch-neuron on a simulated Neuron host."""

from __future__ import annotations

import nkisim
import torch
from hub_env import REPO_ID
from hub_models import LAYERS, tiny_models
from kernels import LayerRepository, Mode, kernelize, use_kernel_mapping
from transformers.models.vit.modeling_vit import ViTAttention

LAYER = "ViTAttention"
# fp32 model output, kernel vs SDPA summation order through two layers (as test_hub_transformers.py).
TOLERANCE = dict(atol=1e-4, rtol=1e-4)


def test_kernelize_swaps_vit_attention_for_the_hub_layer(local_hub, neuron_host, monkeypatch):
    # What replace_kernel_forward_from_hub(ViTAttention, LAYER) sets, undone after the test.
    monkeypatch.setattr(ViTAttention, "kernel_layer_name", LAYER, raising=False)
    monkeypatch.setattr(ViTAttention, "kernel_condition", staticmethod(lambda module: True), raising=False)
    tiny = tiny_models()["vit"]
    reference = tiny.build("sdpa")
    model = tiny.build("sdpa")
    model.load_state_dict(reference.state_dict())
    # revision="main": offline, LayerRepository(version=1) looks branch v1 up on the Hub before LOCAL_KERNELS.
    mapping = {LAYER: {"neuron": LayerRepository(REPO_ID, layer_name=LAYER, revision="main")}}
    with use_kernel_mapping(mapping, inherit_mapping=False):
        model = kernelize(model, mode=Mode.INFERENCE, device="neuron")
    attention = next(m for m in model.modules() if isinstance(m, ViTAttention))
    assert attention.forward.__func__.__module__ == local_hub.variant_ids["torch-neuron"] + ".layers"
    inputs = tiny.inputs()
    with torch.no_grad(), nkisim.trace() as executed:
        out = model(**inputs).last_hidden_state
    assert executed.count("nc_matmul") >= 2 * LAYERS, "the NKI kernel must run in every attention layer"
    with torch.no_grad():
        torch.testing.assert_close(out, reference(**inputs).last_hidden_state, **TOLERANCE)
