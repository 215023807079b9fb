"""Tiny random-weight vision models, built from configs (no download), for the Transformers swap-in tests.

Head dim 64 as in the real checkpoints (ViT-B/16, DeiT-B, CLIP ViT-B, SigLIP-B, DINOv2-B); sequence lengths are
odd or non-multiples of 128 on purpose: ViT 17 tokens (16 patches + CLS), DeiT 18 (+ distillation token),
CLIP 17, SigLIP 16 (no CLS), DINOv2 17, Qwen2-VL vision one image of 8x8 patches (64 tokens, one cu_seqlens chunk).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

HIDDEN = 128
HEADS = 2            # head_dim 64
LAYERS = 2
MLP = 256
IMAGE = 32
PATCH = 8
QWEN_GRID = (1, 8, 8)           # t, h, w in patches
QWEN_PATCH = 4
QWEN_TEMPORAL = 2


@dataclass(frozen=True)
class TinyModel:
    name: str
    build: Callable[[str], torch.nn.Module]      # attn_implementation -> model (eval mode)
    inputs: Callable[[], dict]                   # forward kwargs, seeded


def _pixels() -> dict:
    generator = torch.Generator().manual_seed(0)
    return {"pixel_values": torch.randn(1, 3, IMAGE, IMAGE, generator=generator)}


def _qwen_inputs() -> dict:
    generator = torch.Generator().manual_seed(0)
    t, h, w = QWEN_GRID
    patch_dim = 3 * QWEN_TEMPORAL * QWEN_PATCH * QWEN_PATCH
    return {"hidden_states": torch.randn(t * h * w, patch_dim, generator=generator),
            "grid_thw": torch.tensor([QWEN_GRID])}


def _vision(config_cls, model_cls, **extra):
    def build(attn_implementation: str) -> torch.nn.Module:
        config = config_cls(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                            intermediate_size=MLP, image_size=IMAGE, patch_size=PATCH, **extra)
        return model_cls._from_config(config, attn_implementation=attn_implementation).eval()
    return build


def _dinov2(attn_implementation: str) -> torch.nn.Module:
    from transformers import Dinov2Config, Dinov2Model
    config = Dinov2Config(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                          mlp_ratio=MLP // HIDDEN, image_size=IMAGE, patch_size=PATCH)
    return Dinov2Model._from_config(config, attn_implementation=attn_implementation).eval()


def _qwen2_vl_vision(attn_implementation: str) -> torch.nn.Module:
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel
    config = Qwen2VLVisionConfig(depth=LAYERS, embed_dim=HIDDEN, hidden_size=HIDDEN, num_heads=HEADS,
                                 mlp_ratio=MLP // HIDDEN, patch_size=QWEN_PATCH, temporal_patch_size=QWEN_TEMPORAL)
    return Qwen2VisionTransformerPretrainedModel._from_config(config, attn_implementation=attn_implementation).eval()


def tiny_models() -> dict:
    from transformers import (CLIPVisionConfig, CLIPVisionModel, DeiTConfig, DeiTModel, SiglipVisionConfig,
                              SiglipVisionModel, ViTConfig, ViTModel)
    models = [
        TinyModel("vit", _vision(ViTConfig, ViTModel), _pixels),
        TinyModel("deit", _vision(DeiTConfig, DeiTModel), _pixels),
        TinyModel("clip_vision", _vision(CLIPVisionConfig, CLIPVisionModel), _pixels),
        TinyModel("siglip_vision", _vision(SiglipVisionConfig, SiglipVisionModel), _pixels),
        TinyModel("dinov2", _dinov2, _pixels),
        TinyModel("qwen2_vl_vision", _qwen2_vl_vision, _qwen_inputs),
    ]
    return {m.name: m for m in models}
