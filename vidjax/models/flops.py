"""Model FLOPs per example, from the config, for TFLOP/s and MFU logging.

The tokens counted are those the training step processes
(`shapes.attention_shapes`): under a CLIP's `model.mask_ratio` the video
tower's blocks run on the kept tokens only (the patch embedding still sees
every patch); `flops_per_example(shapes.unmasked(config))` counts every
token, as evaluation and the unmasked tuning do.

Counts matrix multiplies (2 FLOPs per multiply-add) and attention's two
batched matmuls (Q K^T and weights x V, over the full T x T matrix, as XLA
computes them; causal masking is not discounted). Elementwise work (norms,
softmax, activations) is left out, as usual for MFU. Training is 3x the
forward pass (the backward pass costs two matmuls per forward one);
rematerialisation's recompute is not counted, so MFU stays comparable
across remat policies. The second forward pass of a contrastive step
accumulated by embedding cache (`vidjax.steps.caches_embeddings`) is work
the recipe asked for, not a memory trade inside the step: `vidjax.train`
adds one forward pass per example for it (4x the forward in all).
"""

from __future__ import annotations

import ml_collections

from vidjax.models import spec as spec_lib
from vidjax.models.shapes import attention_shapes


def transformer_flops(tokens: int, width: int, depth: int, mlp_dim: int) -> int:
  """Forward FLOPs of `depth` pre-LN blocks over `tokens` tokens."""
  projections = 2 * tokens * width * (3 * width + width + 2 * mlp_dim)
  attention = 2 * 2 * tokens * tokens * width
  return depth * (projections + attention)


def _vision_flops(vision: spec_lib.Vision, tokens: int) -> int:
  """Patch embedding of all patches plus the blocks over `tokens` tokens."""
  time, rows, columns = vision.grid
  blocks = vision.blocks
  patch_features = vision.tubelet * vision.patch_size**2 * 3
  embed = 2 * time * rows * columns * patch_features * blocks.width
  return embed + transformer_flops(
    tokens, blocks.width, blocks.depth, blocks.mlp_dim
  )


def flops_per_example(config: ml_collections.ConfigDict) -> dict[str, int]:
  """FLOPs to process one example with the model `config` describes.

  Args:
    config: a model config (see `vidjax.config.defaults.model_config`).

  Returns:
    dict with 'forward' and 'training' (forward + backward) FLOPs per
    example of the training step, plus the forward FLOPs of each part
    ('vision', 'text', 'decoder', 'head', 'align', 'teacher' where they
    exist; a distilled student's frozen teacher runs forward only).
  """
  spec = spec_lib.from_config(config)
  tokens = {
    name: shape.tokens for name, shape in attention_shapes(config).items()
  }
  parts = {}
  if config.name == "clip":
    vision, text = spec.vision, spec.text.blocks
    parts["vision"] = (
      _vision_flops(vision, tokens["vision"])
      + 2 * vision.blocks.width * spec.embed_dim
    )
    parts["text"] = (
      transformer_flops(tokens["text"], text.width, text.depth, text.mlp_dim)
      + 2 * text.width * spec.embed_dim
    )
  elif config.name == "videomae":
    encoder, decoder = spec.encoder, spec.decoder
    visible, patches = tokens["vision"], tokens["decoder"]
    parts["vision"] = _vision_flops(encoder, visible)
    patch_features = encoder.tubelet * encoder.patch_size**2 * 3
    parts["decoder"] = (
      2 * visible * encoder.blocks.width * decoder.width
      + transformer_flops(
        patches, decoder.width, decoder.depth, decoder.mlp_dim
      )
      + 2 * (patches - visible) * decoder.width * patch_features
    )
  elif config.name == "umt":
    encoder, teacher = spec.encoder, spec.teacher
    kept, layers = tokens["vision"], spec.align_layers
    parts["vision"] = _vision_flops(encoder, kept)
    parts["align"] = (
      2 * layers * kept * encoder.blocks.width * (teacher.output_dim)
    )
    # Every frame through the teacher, forward only; its projection of
    # the aligned layers' patch tokens.
    patches = teacher.grid[1] * teacher.grid[2]
    parts["teacher"] = encoder.num_frames * (
      _vision_flops(teacher, 1 + patches)
      + 2 * layers * patches * teacher.blocks.width * teacher.output_dim
    )
  else:
    parts["vision"] = _vision_flops(spec.encoder, tokens["vision"])
    parts["head"] = 2 * spec.encoder.blocks.width * spec.num_classes
  forward = sum(parts.values())
  # The backward pass: twice the forward of what trains (not the teacher).
  frozen = parts.get("teacher", 0)
  return dict(forward=forward, training=3 * forward - 2 * frozen, **parts)
