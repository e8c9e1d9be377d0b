"""Names of pytree leaves: a jax key path -> 'visual.blocks.layers.0.norm1.scale'.

One naming for every place that matches parameters by name: weight import,
the optimizer's decay masks and layer decay, checkpoint reading and the
resume check. A final 'value' (an `nnx.Variable`'s leaf attribute, or the
key Orbax saves it under) is not part of a parameter's name.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def name(key_path: Sequence[Any], sep: str = ".") -> str:
  """`sep`-joined names of a key path's entries (dict keys, attribute names,
  sequence indices), without a final 'value'."""
  parts = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
           for k in key_path]
  if parts and parts[-1] == "value":
    parts.pop()
  return sep.join(parts)
