{
  # The kernel-builder flake, for when kernel-builder builds Neuron kernels in Nix (its Neuron support
  # is experimental today, so `make build` writes the same build/torch-neuron/ output with
  # tools/hub_build.py).
  description = "Flake for the neuron-vit-attn NKI kernels";

  inputs = {
    kernel-builder.url = "github:huggingface/kernels";
  };

  outputs =
    {
      self,
      kernel-builder,
    }:
    kernel-builder.lib.genKernelFlakeOutputs {
      inherit self;
      path = ./.;
    };
}
