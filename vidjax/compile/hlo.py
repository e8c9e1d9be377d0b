"""What a program compiled for a GPU calls, read from its optimised HLO.

`compiled.as_text()` of a program XLA's GPU compiler built is the HLO it
would run: after SPMD partitioning (shapes per device), fusion and the
rewrites into library calls. Read here:

  attention    cuDNN's fused attention calls (`__cudnn$fmhaSoftmax`, and
               under a gradient `__cudnn$fmhaSoftmaxBackward`), each given
               to the tower whose attention shape it has: its first
               operand is [b, T, N, H] (T padded to a multiple of 8);
  calls        every other custom call by target (cuBLAS GEMMs, ...);
  fusions      the fusions by kind (Triton GEMMs, loops, ...);
  collectives  all-reduce, all-gather, reduce-scatter, all-to-all and
               collective-permute instructions.

Each is a count of instructions in the program's text: a layer under
`lax.scan` (`model.scan`) appears once, however deep the stack.
"""

from __future__ import annotations

import collections
import re

from vidjax.models import attention, shapes

_CUDNN = re.compile(
  r'custom_call_target="(__cudnn\$fmha\w*)".*?'
  r"operand_layout_constraints=\{\w+\[(\d+),(\d+),(\d+),(\d+)\]"
)
_CALL = re.compile(r'custom_call_target="([^"]+)"')
_FUSION_KIND = re.compile(r'"fusion_backend_config":\{"kind":"([^"]+)"')
COLLECTIVES = (
  "all-reduce",
  "all-gather",
  "reduce-scatter",
  "all-to-all",
  "collective-permute",
)
_COLLECTIVE = re.compile(
  r"=\s*[^=]*?\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\("
)


def tower_shapes(model) -> dict[tuple[int, int, int], str]:
  """{(padded tokens, heads, head size): tower name} of the model config's
  towers, in training (masked tokens) and unmasked (evaluation)."""
  found = {}
  for config in (model, shapes.unmasked(model)):
    for name, shape in shapes.attention_shapes(config).items():
      multiple = attention.CUDNN_LENGTH_MULTIPLE
      tokens = -(-shape.tokens // multiple) * multiple
      key = (tokens, shape.heads, shape.head_dim)
      if found.get(key, name) != name:  # Two towers of one shape.
        name = f"{found[key]}/{name}"
      found[key] = name
  return found


def cudnn_attention(text: str, model) -> dict[str, dict[str, int]]:
  """cuDNN attention calls by tower: {tower: {'forward': n, 'backward': n}}.

  Every tower of the model config is listed (0 where it calls none); a
  call of a shape no tower has counts under 'other'.
  """
  towers = tower_shapes(model)
  counts = {
    name: {"forward": 0, "backward": 0}
    for name in dict.fromkeys(towers.values())
  }
  for line in text.splitlines():
    found = _CUDNN.search(line)
    if not found:
      continue
    target, _, tokens, heads, head_dim = found.groups()
    name = towers.get((int(tokens), int(heads), int(head_dim)), "other")
    direction = "backward" if "Backward" in target else "forward"
    counts.setdefault(name, {"forward": 0, "backward": 0})[direction] += 1
  return counts


def other_calls(text: str) -> dict[str, dict[str, int]]:
  """The custom calls other than cuDNN attention, the fusions by kind and
  the collectives, each {name: count}."""
  calls = collections.Counter(
    t for t in _CALL.findall(text) if not t.startswith("__cudnn$fmha")
  )
  collectives = collections.Counter(_COLLECTIVE.findall(text))
  return {
    "custom_calls": dict(sorted(calls.items())),
    "fusions": dict(
      sorted(collections.Counter(_FUSION_KIND.findall(text)).items())
    ),
    "collectives": dict(sorted(collectives.items())),
  }
