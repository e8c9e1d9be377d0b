"""Each tower's tokens and attention shape, from the model config.

One home for the sequence lengths that FLOPs (`flops.py`), the start-up
memory check (`vidjax.memory`) and the GPU check's attention measurements
count, those of the training step:

  clip        'vision' (1 + (T/t) x (H/p) x (W/p) tokens; under
              `model.mask_ratio` 1 + the kept ones, `vit.num_kept_tokens`),
              'text' (77, causal)
  videomae    'vision' (the visible tokens only), 'decoder' (every patch)
  classifier  'vision' (every patch, + 1 with a CLIP backbone's class token)
  umt         'vision' (the student's kept tokens); its frozen teacher runs
              without a backward pass, one frame at a time (`flops.py`
              counts it)

A CLIP's evaluation (and its unmasked tuning) sees every token: the shapes
of `unmasked(config)`.
"""

from __future__ import annotations

import dataclasses
import math

import ml_collections

from vidjax import config as config_lib
from vidjax.models import spec as spec_lib
from vidjax.models.umt import kept_per_frame
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


def unmasked(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of the model config whose video tower trains on every token
  (a CLIP's evaluation, and its unmasked tuning); other models as given."""
  if config.name == "clip":
    config = config_lib.copy(config)
    config.mask_ratio = 0.0
  return config


def attention_shapes(
  config: ml_collections.ConfigDict,
) -> dict[str, AttentionShape]:
  """The towers' attention shapes in training (module docstring), by name.

  Args:
    config: a model config (`vidjax.config.defaults.model_config`).

  Returns:
    dict of `AttentionShape`, vision tower first.
  """
  spec = spec_lib.from_config(config)

  def shape(tokens, stack, causal=False):
    return AttentionShape(
      tokens, stack.heads, stack.width // stack.heads, stack.depth, causal
    )

  if config.name == "clip":
    vision = spec.vision
    kept = num_kept_tokens(vision.grid, vision.mask_ratio, vision.mask_kind)
    return {
      "vision": shape(1 + kept, vision.blocks),
      "text": shape(spec.text.context_length, spec.text.blocks, causal=True),
    }
  encoder = spec.encoder
  patches = math.prod(encoder.grid)
  if config.name == "umt":
    time, rows, columns = encoder.grid
    kept = time * kept_per_frame(rows * columns, spec.mask_ratio)
    return {"vision": shape(kept, encoder.blocks)}
  if config.name == "videomae":
    visible = patches - num_masked_tokens(encoder.grid, spec.mask_ratio)
    return {
      "vision": shape(visible, encoder.blocks),
      "decoder": shape(patches, spec.decoder),
    }
  return {"vision": shape(patches + encoder.class_token, encoder.blocks)}
