"""Names of pytree leaves: a jax key path -> 'visual.blocks.layers.0.norm1.scale'.

One naming for every place that matches parameters by name: weight import,
the optimizer's decay masks and layer decay, checkpoint reading and the
resume check. It is `jax.tree_util.keystr(path, simple=True)` less a final
'value' (an `nnx.Variable`'s leaf attribute, or the key Orbax saves it
under), which is not part of a parameter's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax


def name(key_path: Sequence[Any], sep: str = ".") -> str:
  """`sep`-joined names of a key path's entries (dict keys, attribute names,
  sequence indices), without a final 'value'."""
  key_path = tuple(key_path)
  if key_path and jax.tree_util.keystr(key_path[-1:], simple=True) == "value":
    key_path = key_path[:-1]
  return jax.tree_util.keystr(key_path, simple=True, separator=sep)
