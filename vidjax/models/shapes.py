"""Each tower's tokens and attention shape, from the model config.

One home for the sequence lengths that FLOPs (`flops.py`), the start-up
memory check (`vidjax.memory`) and the GPU check's attention measurements
count, those of the training step:

  clip        'vision' (1 + (T/t) x (H/p) x (W/p) tokens; under
              `model.mask_ratio` 1 + the kept ones, `vit.num_kept_tokens`),
              'text' (77, causal)
  videomae    'vision' (the visible tokens only), 'decoder' (every patch)
  classifier  'vision' (every patch, + 1 with a CLIP backbone's class token)

A CLIP's evaluation (and its unmasked tuning) sees every token: the shapes
of `unmasked(config)`.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from vidjax.models import model_kwargs
from vidjax.models.videomae import num_masked_tokens
from vidjax.models.vit import num_kept_tokens


@dataclasses.dataclass(frozen=True)
class AttentionShape:
  """One tower's self-attention per example.

  Attributes:
    tokens: sequence length (T).
    heads: attention heads (N).
    head_dim: size of one head (H).
    layers: blocks of the tower.
    causal: causal masking (CLIP's text tower).
  """

  tokens: int
  heads: int
  head_dim: int
  layers: int
  causal: bool = False


def patch_grid(kwargs: dict) -> tuple[int, int, int]:
  """(T/t, H/p, W/p) tokens of the video ViT, from `model_kwargs`."""
  size = kwargs["image_size"]
  height, width = (size, size) if isinstance(size, int) else size
  patch = kwargs["patch_size"]
  return (
    kwargs["num_frames"] // kwargs["tubelet"],
    height // patch,
    width // patch,
  )


def unmasked(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of the model config whose video tower trains on every token
  (a CLIP's evaluation, and its unmasked tuning); other models as given."""
  config = config.copy_and_resolve_references()
  if config.name == "clip":
    config.mask_ratio = 0.0
  return config


def attention_shapes(
  config: ml_collections.ConfigDict,
) -> dict[str, AttentionShape]:
  """The towers' attention shapes in training (module docstring), by name.

  Args:
    config: a model config (`vidjax.defaults.model_config`).

  Returns:
    dict of `AttentionShape`, vision tower first.
  """
  kw = model_kwargs(config)
  grid = patch_grid(kw)
  patches = grid[0] * grid[1] * grid[2]
  if config.name == "clip":
    width, heads = kw["vision_width"], kw["vision_heads"]
    text_width, text_heads = kw["text_width"], kw["text_heads"]
    kept = num_kept_tokens(grid, kw["mask_ratio"], kw["mask_kind"])
    return {
      "vision": AttentionShape(
        1 + kept, heads, width // heads, kw["vision_depth"]
      ),
      "text": AttentionShape(
        kw["context_length"],
        text_heads,
        text_width // text_heads,
        kw["text_depth"],
        causal=True,
      ),
    }
  width, heads = kw["width"], kw["heads"]
  if config.name == "videomae":
    visible = patches - num_masked_tokens(grid, kw["mask_ratio"])
    decoder_width, decoder_heads = kw["decoder_width"], kw["decoder_heads"]
    return {
      "vision": AttentionShape(visible, heads, width // heads, kw["depth"]),
      "decoder": AttentionShape(
        patches,
        decoder_heads,
        decoder_width // decoder_heads,
        kw["decoder_depth"],
      ),
    }
  class_token = int(kw["backbone"] == "clip")
  return {
    "vision": AttentionShape(
      patches + class_token, heads, width // heads, kw["depth"]
    )
  }
