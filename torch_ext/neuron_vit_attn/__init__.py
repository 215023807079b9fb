"""neuron-vit-attn: NKI attention for vision transformers on AWS Trainium, as torch custom ops.

Public API:

- :func:`attention` -- ``torch.nn.functional.scaled_dot_product_attention``'s layout and semantics
  (GQA, causal, bool/float masks, scale); NKI kernel on ``neuron`` tensors, eager reference on CPU.
- :func:`flash_attn_forward` + ``supports_flash_attn`` -- the Transformers attention interface, so
  ``attn_implementation="<org>/neuron-vit-attn"`` loads this package from the Hub.
- :func:`attention_reference` -- the eager reference (also SDPA-compatible).
- ``layers`` -- stateless layers for ``kernels.kernelize``.

``NEURON_VIT_ATTN_BACKEND`` = auto (default) | sim | reference picks the implementation; see
``_backend.py``. Autograd works; the backward recomputes through the eager reference until an
NKI backward kernel exists.
"""

from . import layers
from ._attention import attention, flash_attn_forward
from .reference import attention_reference

supports_flash_attn = True

__all__ = ["attention", "attention_reference", "flash_attn_forward", "layers", "supports_flash_attn"]
