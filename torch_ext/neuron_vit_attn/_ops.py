"""Op namespace of this package (kernel-builder's noarch ``_ops.py`` convention).

The Hub build replaces this file with one naming a unique namespace per build
(``_neuron_vit_attn_<backend>_<id>``), so two loaded builds never register the same op. Every other
module gets the namespace only from here: ``from ._ops import ops, add_op_namespace_prefix``.
"""

import torch

_OPS_NAME = "_neuron_vit_attn_dev"

ops = getattr(torch.ops, _OPS_NAME)


def add_op_namespace_prefix(op_name: str) -> str:
    """Qualified op name, e.g. ``_neuron_vit_attn_dev::attention_fwd``."""
    return f"{_OPS_NAME}::{op_name}"
