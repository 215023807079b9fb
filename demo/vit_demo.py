"""Demo (``make demo``): build the Hub kernel, load it like a user, and run a ViT-B/16 with it swapped in.

Steps: ``make build``'s build (:mod:`hubtools.build`) writes ``build/``; ``LOCAL_KERNELS`` maps
``org/neuron-vit-attn`` to this checkout so ``kernels.get_kernel("org/neuron-vit-attn", version=1)`` loads the
artifact offline; a ViT-B/16-architecture model (hidden 768, 12 layers, 12 heads, 224 px -> 197 tokens; random
weights, batch 1) is built twice from its config, once with ``attn_implementation="sdpa"`` and once with
``attn_implementation="org/neuron-vit-attn"``, with the same weights, and their outputs are compared in fp32
and in bf16 (the dtype vision towers run in on Trainium; sdpa's own bf16-vs-fp32 drift is printed as the yardstick).

On a CPU host the CPU build runs the NKI kernel in nkisim (``NEURON_VIT_ATTN_BACKEND=sim``); every attention call
is traced, and the cost model estimates what those calls would take on trn2 (an estimate, not a measurement).
On a Neuron host (TorchNeuron with a device) the torch-neuron build runs the kernel on the ``neuron`` device.
No network is used (``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
REPO_ID = "org/neuron-vit-attn"
COST_TARGET = "trn2"
# Set before huggingface_hub is imported: it reads HF_HUB_OFFLINE once.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["LOCAL_KERNELS"] = f"{REPO_ID}={REPO_ROOT}"

import torch  # noqa: E402 - after the environment above

# ViT-B/16 (google/vit-base-patch16-224's architecture)
VIT_B16 = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
               image_size=224, patch_size=16)
BATCH = 1
SEED = 0
DTYPES = (torch.float32, torch.bfloat16)
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16"}

_start = time.perf_counter()


def say(message: str) -> None:
    print(f"[{time.perf_counter() - _start:6.1f} s] {message}", flush=True)


def neuron_device_available() -> bool:
    neuron = getattr(torch, "neuron", None)
    return neuron is not None and bool(getattr(neuron, "is_available", lambda: False)())


class AttentionCallTraces:
    """One ``nkisim.trace()`` per attention layer call, opened by forward hooks on the attention modules, so the
    cost model sees each kernel launch on its own (the estimate of the model is the sum over launches)."""

    def __init__(self, modules, on_call):
        self.traces, self._open, self._handles = [], [], []
        self._modules, self._on_call = list(modules), on_call

    def __enter__(self):
        import nkisim

        def before(_module, _args):
            stack = contextlib.ExitStack()
            self._open.append((stack, stack.enter_context(nkisim.trace())))

        def after(_module, _args, _output):
            stack, trace = self._open.pop()
            stack.close()
            self.traces.append(trace)
            self._on_call(len(self.traces), trace)

        for module in self._modules:
            self._handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()


def cost_estimate(traces, dtype_name: str) -> str:
    try:
        profiles = [trace.estimate(COST_TARGET) for trace in traces]
    except ImportError as err:            # nkisim without its cost model
        return f"cost model unavailable ({err})"
    total_us = sum(p.time_us for p in profiles)
    return (f"{total_us:.1f} us for {len(profiles)} {dtype_name} attention calls ({total_us / len(profiles):.1f} us each) "
            f"[cost-model estimate, {COST_TARGET}; not a measurement]")


def main() -> None:
    from hubtools.build import build

    say("building the Hub artifact (make build) ...")
    result = build(REPO_ROOT, log=lambda message: say(message.removeprefix("[build] ")))
    say(f"built build/torch-neuron ({result.variant_ids['torch-neuron']}) and build/torch-cpu "
        f"({result.variant_ids['torch-cpu']})")

    on_device = neuron_device_available()
    if not on_device:
        import nkisim
        nkisim.install()                                  # `import nki` -> nkisim
        os.environ["NEURON_VIT_ATTN_BACKEND"] = "sim"     # CPU tensors: the NKI kernel in nkisim
    from kernels import get_kernel, get_loaded_kernels
    from transformers import ViTConfig, ViTModel
    from transformers.models.vit.modeling_vit import ViTAttention

    kernel = get_kernel(REPO_ID, version=1)
    metadata = next(k.metadata for k in get_loaded_kernels() if k.module is kernel)
    variant = next(name for name, build_id in result.variant_ids.items() if build_id == kernel.__name__)
    backend = ("NKI kernel on the neuron device" if on_device
               else "NKI kernel in nkisim on CPU (NEURON_VIT_ATTN_BACKEND=sim)")
    say(f'get_kernel("{REPO_ID}", version=1) loaded build/{variant} as {kernel.__name__} '
        f"(backend {metadata.backend.backend_type}); attention runs as: {backend}")

    say("building two ViT-B/16 models (random weights): sdpa and attn_implementation=\"org/neuron-vit-attn\" ...")
    torch.manual_seed(SEED)
    # One config each: _from_config keeps the config object and writes attn_implementation into it, so a shared
    # config would switch the sdpa twin to the kernel as well.
    reference = ViTModel._from_config(ViTConfig(**VIT_B16), attn_implementation="sdpa").eval()
    model = ViTModel._from_config(ViTConfig(**VIT_B16), attn_implementation=REPO_ID).eval()
    if reference.config._attn_implementation != "sdpa":
        raise SystemExit(f"the reference model uses {reference.config._attn_implementation!r}, not sdpa")
    model.load_state_dict(reference.state_dict())
    config = model.config
    tokens = (VIT_B16["image_size"] // VIT_B16["patch_size"]) ** 2 + 1
    pixel_values = torch.randn(BATCH, 3, VIT_B16["image_size"], VIT_B16["image_size"],
                               generator=torch.Generator().manual_seed(SEED))
    if on_device:
        reference, model, pixel_values = reference.to("neuron"), model.to("neuron"), pixel_values.to("neuron")

    attention_modules = [m for m in model.modules() if isinstance(m, ViTAttention)]
    layers, heads = len(attention_modules), config.num_attention_heads
    shape = f"q/k/v ({BATCH}, {heads}, {tokens}, {config.hidden_size // heads})"
    results = []
    for dtype in DTYPES:                    # fp32 first, then bf16, the dtype models run in on Trainium
        reference, model = reference.to(dtype), model.to(dtype)
        inputs = pixel_values.to(dtype)
        with torch.no_grad():
            started = time.perf_counter()
            expected = reference(pixel_values=inputs).last_hidden_state
            say(f"{DTYPE_NAMES[dtype]}: sdpa forward {time.perf_counter() - started:.2f} s; kernel forward, "
                f"{layers} attention calls, {shape} ...")
            started = time.perf_counter()
            if on_device:
                traces = None
                got = model(pixel_values=inputs).last_hidden_state
            else:
                def progress(index, trace):
                    say(f"  attention call {index}/{layers}: {len(trace)} NKI instructions "
                        f"({trace.count('nc_matmul')} nc_matmul)")
                with AttentionCallTraces(attention_modules, progress) as calls:
                    got = model(pixel_values=inputs).last_hidden_state
                traces = calls.traces
                if not traces or not all(t.count("nc_matmul") for t in traces):
                    raise SystemExit("the NKI kernel did not run for every attention call")
            say(f"{DTYPE_NAMES[dtype]}: kernel forward {time.perf_counter() - started:.2f} s")
        expected = expected.float().cpu()
        fp32_expected = results[0][4] if results else expected
        error = (got.float().cpu() - expected).abs().max().item()
        # How far sdpa itself moves from its fp32 result in this dtype: the yardstick for the kernel's error.
        dtype_error = (expected - fp32_expected).abs().max().item()
        results.append((dtype, error, expected.abs().max().item(), traces, expected, dtype_error))

    print()
    print(f"variant:      build/{variant} ({kernel.__name__})")
    print(f"backend:      {backend}")
    lnc = importlib.import_module(f"{kernel.__name__}._backend").logical_core_degree(on_device=on_device)
    print(f"launch:       attention_fwd[{lnc}] (physical NeuronCores per logical core: NEURON_LOGICAL_NC_CONFIG, "
          f"else the runtime default)")
    print(f"model:        ViT-B/16 architecture, random weights, batch {BATCH}, {tokens} tokens")
    for dtype, error, scale, traces, _, dtype_error in results:
        name = DTYPE_NAMES[dtype]
        print(f"{name}:")
        yardstick = f"; sdpa in {name} vs sdpa in fp32: {dtype_error:.2e}" if dtype != DTYPES[0] else ""
        print(f"  max abs error vs sdpa in {name} (last_hidden_state): {error:.2e} (max |sdpa| {scale:.2f}"
              f"{yardstick})")
        if traces is not None:
            print(f"  estimate: {cost_estimate(traces, name)}")
    print(f"total time:   {time.perf_counter() - _start:.1f} s")


if __name__ == "__main__":
    main()
