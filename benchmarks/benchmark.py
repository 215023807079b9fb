"""``kernels benchmark ./``: the package's attention on the real vision-model shapes.

Each workload builds bf16 q, k, v as Transformers does (a contiguous (B, S, H, D) projection viewed
as (B, H, S, D)), times ``kernel.attention`` and verifies it against PyTorch SDPA (the runner
compares with allclose, atol 1e-2). On a Neuron host the runner's device is ``neuron`` and this
times the NKI kernel; on CPU it times the package's eager reference path. The kernels runner only
synchronizes cuda/xpu/mps, so ``benchmark_*`` synchronizes the Neuron device itself. Cost-model
estimates live in bench/ (``make bench``), not here.
"""

import torch
import torch.nn.functional as F

from kernels.benchmark import Benchmark

# (batch, tokens, heads, head dim)
WORKLOADS = {
    "vit_b16": (1, 197, 12, 64),
    "vit_b16_batch8": (8, 197, 12, 64),
    "vit_l14_336": (1, 577, 16, 64),
    "siglip_so400m": (1, 729, 16, 72),
    "dinov2_b14": (1, 257, 12, 64),
    "clip_b32": (1, 50, 12, 64),
}


def _synchronize(device: str) -> None:
    if device == "neuron":
        sync = getattr(getattr(torch, "neuron", None), "synchronize", None)
        if sync is not None:
            sync()


class VisionAttentionBenchmark(Benchmark):
    seed = 0

    def _setup(self, workload: str) -> None:
        batch, tokens, heads, head_dim = WORKLOADS[workload]
        self.scale = head_dim ** -0.5
        self.q, self.k, self.v = (
            torch.randn(batch, tokens, heads, head_dim, dtype=torch.bfloat16, device=self.device).transpose(1, 2)
            for _ in range(3))

    def _run(self) -> None:
        self.out = self.kernel.attention(self.q, self.k, self.v, scale=self.scale)
        _synchronize(self.device)

    def _reference(self) -> torch.Tensor:
        out = F.scaled_dot_product_attention(self.q.float(), self.k.float(), self.v.float(), scale=self.scale)
        return out.to(torch.bfloat16)

    def setup_vit_b16(self):
        self._setup("vit_b16")

    def benchmark_vit_b16(self):
        self._run()

    def verify_vit_b16(self):
        return self._reference()

    def setup_vit_b16_batch8(self):
        self._setup("vit_b16_batch8")

    def benchmark_vit_b16_batch8(self):
        self._run()

    def verify_vit_b16_batch8(self):
        return self._reference()

    def setup_vit_l14_336(self):
        self._setup("vit_l14_336")

    def benchmark_vit_l14_336(self):
        self._run()

    def verify_vit_l14_336(self):
        return self._reference()

    def setup_siglip_so400m(self):
        self._setup("siglip_so400m")

    def benchmark_siglip_so400m(self):
        self._run()

    def verify_siglip_so400m(self):
        return self._reference()

    def setup_dinov2_b14(self):
        self._setup("dinov2_b14")

    def benchmark_dinov2_b14(self):
        self._run()

    def verify_dinov2_b14(self):
        return self._reference()

    def setup_clip_b32(self):
        self._setup("clip_b32")

    def benchmark_clip_b32(self):
        self._run()

    def verify_clip_b32(self):
        return self._reference()
