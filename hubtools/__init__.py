"""Build and publish tools for the neuron-vit-attn Hub kernel.

- ``python -m hubtools.build``  (``make build``): ``torch_ext/neuron_vit_attn/`` + ``kernels/`` + ``build.toml``
  -> ``build/torch-neuron/``, ``build/torch-cpu/`` and ``build/CARD.md`` (see :mod:`hubtools.build`).
- ``python -m hubtools.upload`` (``make upload``): ``build/`` -> a kernel-type Hub repo, branch ``v<version>``,
  card as ``README.md`` on ``main`` (see :mod:`hubtools.upload`).

kernel-builder (Rust + Nix) collects Python only from ``torch-ext/<module>/`` and has no Neuron build yet, so this
repo writes the same output layout itself. Nothing here is imported by the published package.
"""
