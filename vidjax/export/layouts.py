"""Our parameters -> the layouts PyTorch code loads: the import side inverted.

Every name map here is the import side's (`vidjax.weights.conversion`'s
tables from the canonical names to ours, `vidjax.weights.tensor_io`'s rules
from AVION's and Hugging Face's names to the canonical ones) run backwards,
and every exported name is checked to map back to the tensor it came from:

  ours --(conversion tables, inverted)--> canonical (OpenAI CLIP names, the
  original VideoMAE names) --(tensor_io rules, undone)--> AVION / Hugging Face

Layout changes are undone the same way: Linear kernels transposed back,
patch kernels back to conv weights (`tensor_io.kernel_to_conv`), AVION's
`--use-fast-conv1` Linear patch embedding, Hugging Face's split query, key
and value. Tensors are numpy arrays throughout; shapes are PyTorch's.
"""

from __future__ import annotations

import re

import numpy as np

from vidjax.base import errors
from vidjax.weights import conversion, tensor_io


def _inverse(transform, *, tubelet: int):
  """The inverse of one of the import tables' tensor transforms."""
  if transform is None:
    return lambda x: x
  if transform is tensor_io.conv_to_kernel:
    return lambda x: tensor_io.kernel_to_conv(x, tubelet=tubelet)
  if transform is np.ravel:  # VideoMAE's mask token is [1, 1, D].
    return lambda x: x.reshape(1, 1, -1)
  return lambda x: x.T  # The Linear kernels' transpose.


def _inverted(names) -> tuple[dict, list]:
  """An import table (`conversion.CLIP_NAMES`, `VIDEOMAE_NAMES`) inverted:
  ({our path: [(canonical name, forward transform)]}, [(our block regex,
  canonical prefix with {i}, {our leaf: [(canonical leaf, transform)]})])."""
  top, blocks, _ = names
  inverse_top = {}
  for name, (ours, transform) in top.items():
    inverse_top.setdefault(ours, []).append((name, transform))
  inverse_blocks = []
  for pattern, prefix, table in blocks:
    leaves = {}
    for leaf, (ours, transform) in table.items():
      leaves.setdefault(ours, []).append((leaf, transform))
    canonical = pattern.replace(r"\.", ".").replace(r"(\d+)", "{i}")
    inverse_blocks.append((re.escape(prefix) + r"\.(\d+)\.", canonical, leaves))
  return inverse_top, inverse_blocks


def to_canonical(
  tensors: dict[str, np.ndarray],
  names,
  *,
  tubelet: int,
  prefer: tuple[str, ...] = (),
) -> tuple[dict[str, np.ndarray], list[str]]:
  """Our tensors (unstacked paths) -> the canonical state dict of `names`.

  Args:
    tensors: {our path: array in our layout}.
    names: `conversion.CLIP_NAMES` or `conversion.VIDEOMAE_NAMES`.
    tubelet: the patch kernel's frames per patch.
    prefer: canonical names to take where two map to one of ours (e.g.
      'encoder.fc_norm.' for a mean-pooled classifier's norm).

  Returns:
    ({canonical name: array in PyTorch's layout}, our paths with no place).
  """
  top, blocks = _inverted(names)
  out, homeless = {}, []
  for path, value in tensors.items():
    options, stem = top.get(path), ""
    if options is None:
      for pattern, canonical, leaves in blocks:
        match = re.match(pattern, path)
        if match and path[match.end() :] in leaves:
          options = leaves[path[match.end() :]]
          stem = canonical.format(i=match.group(1))
          break
    if not options:
      homeless.append(path)
      continue
    preferred = [o for o in options if (stem + o[0]).startswith(prefer)]
    leaf, transform = (preferred or options)[0]
    exported = _inverse(transform, tubelet=tubelet)(np.asarray(value))
    back = transform(exported) if transform else exported
    if not np.array_equal(back, value):  # A bug, not a user's mistake.
      raise AssertionError(f"{path}: its inverse layout does not map back")
    out[stem + leaf] = exported
  return out, homeless


def clip_canonical(tensors: dict, *, kind: str, tubelet: int):
  """A CLIP or its classifier (`kind`) -> OpenAI's CLIP names, AVION's
  classifier head as 'head.*': (state dict, our paths with no place)."""
  if kind == "classifier":  # Its tower is the CLIP's vision tower.
    tensors = {
      re.sub(r"^encoder\.", "visual.", path): value
      for path, value in tensors.items()
    }
  return to_canonical(tensors, conversion.CLIP_NAMES, tubelet=tubelet)


def videomae_canonical(tensors: dict, *, kind: str, pool: str, tubelet: int):
  """A VideoMAE or its classifier -> the original VideoMAE names; a
  mean-pooled classifier's norm is `encoder.fc_norm`."""
  mean = kind == "classifier" and pool == "mean"
  prefer = ("encoder.fc_norm.",) if mean else ("encoder.norm.",)
  return to_canonical(
    tensors, conversion.VIDEOMAE_NAMES, tubelet=tubelet, prefer=prefer
  )


def avion_names(canonical: dict) -> dict[str, np.ndarray]:
  """OpenAI's CLIP names -> AVION's (`tensor_io.AVION_CLIP` undone): the
  vision tower in its flash-attention names (`attn.Wqkv`, `mlp.fc1/fc2`)
  with the `--use-fast-conv1` Linear patch embedding [D, 3*p*p] over
  (channel, row, column), the text tower under `textual.` in its standard
  names, `visual.image_projection`, the classifier's head as `fc_cls`."""
  out = {}
  for name, value in canonical.items():
    vision = name.startswith(("visual.", "head.", "logit_scale"))
    # AVION's text tower keeps OpenAI's names (no flash attention) under
    # `textual.`, the prefix its rules drop.
    foreign = tensor_io.foreign_name(name, tensor_io.AVION_CLIP, undo=vision)
    if not vision:
      foreign = f"textual.{foreign}"
      if tensor_io.renamed(foreign, tensor_io.AVION_CLIP) != name:
        raise AssertionError(f"{name}: {foreign} does not rename back")
    if name == "visual.conv1.weight":
      value = value.reshape(value.shape[0], -1)
    out[foreign] = value
  return out


def hf_videomae_names(canonical: dict) -> tuple[dict[str, np.ndarray], float]:
  """The original VideoMAE names -> transformers' (`tensor_io.HF_VIDEOMAE`
  undone), query/key/value split; the attention biases as Hugging Face's
  legacy `q_bias` / `v_bias` (which every transformers version reads).

  Returns:
    (state dict, the largest key bias dropped: Hugging Face has no key bias;
    adding one shifts every logit of a query alike, so softmax drops it).
  """
  out, key_bias = {}, 0.0
  for name, value in canonical.items():
    foreign = tensor_io.foreign_name(name, tensor_io.HF_VIDEOMAE)
    stem, found, leaf = foreign.rpartition(".qkv.")
    if not found:
      out[foreign] = value
    elif leaf == "weight":
      for part, rows in zip(("query", "key", "value"), np.split(value, 3)):
        out[f"{stem}.{part}.weight"] = rows
    else:
      q, k, v = np.split(value, 3)
      out[f"{stem}.q_bias"], out[f"{stem}.v_bias"] = q, v
      key_bias = max(key_bias, float(np.abs(k).max(initial=0.0)))
  return out, key_bias


def refuse_homeless(homeless: list[str], fmt: str, what: str) -> None:
  """A format with no place for some of the model's tensors: refused."""
  if homeless:
    shown = ", ".join(sorted(homeless)[:6]) + (
      " ..." if len(homeless) > 6 else ""
    )
    raise errors.ConfigError(
      f"--format {fmt} cannot hold this {what}: it has no place for "
      f"{len(homeless)} of its tensors ({shown})",
      hint="--format safetensors holds every vidjax model (vidjax's own "
      "names, with the run's config)",
    )
