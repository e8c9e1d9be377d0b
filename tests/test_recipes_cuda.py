"""Every recipe's train and eval steps take cuDNN attention on a GPU.

Each configs/*.py is traced at its real model shapes and frame counts in
bfloat16, as on an H100/H200 (`forced_cudnn`), with a batch of 8 over the 8
fake devices, exactly as `train.setup` builds the steps, and lowered for
CUDA. The state is abstract (`jax.eval_shape`): nothing is allocated or
compiled. Each tower keeps 2 of its blocks (`BLOCKS`): its blocks are one
program repeated, of the real widths, heads and token counts. JAX's cuDNN
shape checks run while tracing, so a tower length the kernel rejects fails
here; the lowered steps must call cuDNN in every attention layer, forward
and backward, the training step over the vision tower's training length
(the kept tokens of a masked CLIP) padded to a multiple of 8.
"""

from pathlib import Path

import jax
import pytest

from benchmarks.cuda_trace import (
  cudnn_attention_calls,
  forced_cudnn,
  lower_for_cuda,
)
from vidjax import config as config_lib, sharding, steps as steps_lib, tasks
from vidjax.data import batches
from vidjax.models import attention, shapes

CONFIGS = Path(__file__).parents[1] / "configs"
# And the masked CLIP step (FLIP): 1 + 392 of the 785 vision tokens.
RECIPES = sorted(p.name for p in CONFIGS.glob("*.py")) + [
  "clip_vitb16_ego4d.py:flip"
]
# Policies under which the backward pass runs no attention forward again.
KEEPS_ATTENTION = ("none", "save_attention", "save_dots_and_attention")
# Blocks per tower lowered (a ViT-B's 12 would take 3x the time).
BLOCKS = 2


def attention_layers(model) -> int:
  return sum(shape.layers for shape in shapes.attention_shapes(model).values())


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_steps_lower_for_cuda_with_cudnn_attention(recipe):
  config = config_lib.load_config(str(CONFIGS / recipe))
  config.model.dtype = "bfloat16"
  # Sizes a run reads off its files (0 in `own_videos.py`): CLIP's vocabulary
  # and a label count.
  if "text" in config.model and not config.model.text.vocab_size:
    config.model.text.vocab_size = 49408
  if "num_classes" in config.model and not config.model.num_classes:
    config.model.num_classes = 10
  config.model.depth = BLOCKS
  if "text" in config.model:
    config.model.text.layers = BLOCKS
  if "decoder" in config.model:
    config.model.decoder.depth = min(BLOCKS, config.model.decoder.depth)
  if "align_layers" in config.model:  # UMT aligns the last K of them.
    config.model.align_layers = min(BLOCKS, config.model.align_layers)
  task = tasks.get_task(config.task)
  mesh = sharding.make_mesh(fsdp=config.get("fsdp", 1))
  batch = batches.batch_spec(config, 8)
  key = jax.eval_shape(lambda: jax.random.key(0))
  with forced_cudnn():
    state, rest, steps = steps_lib.build_state_and_steps(
      config, task, mesh, abstract=True
    )
    if config.model.get("probe"):  # Its encoder runs in the step that
      # caches the features, and in evaluation; its training reads the cache.
      batch = batches.batch_spec(config, 8, train=False)
      lowered = lower_for_cuda(steps.features, state["params"], rest, batch)
      train_calls = None
    else:
      lowered = lower_for_cuda(steps.train, state, rest, batch, key)
      train_calls = cudnn_attention_calls(lowered)
    eval_calls = cudnn_attention_calls(
      lower_for_cuda(steps.eval, state["params"], rest, batch)
    )

  layers = attention_layers(config.model)
  vision = shapes.attention_shapes(config.model)["vision"]
  multiple = attention.CUDNN_LENGTH_MULTIPLE
  padded = -(-vision.tokens // multiple) * multiple
  assert f"8x{padded}x{vision.heads}x{vision.head_dim}xbf16" in (
    lowered.as_text()
  )
  if train_calls is None:
    assert cudnn_attention_calls(lowered)["forward"] == layers
  else:
    assert train_calls["backward"] == layers, train_calls
    if config.model.remat in KEEPS_ATTENTION:
      assert train_calls["forward"] == layers, train_calls
    else:
      assert train_calls["forward"] > layers, train_calls
  assert eval_calls["forward"] == layers and not eval_calls["backward"], (
    eval_calls
  )
