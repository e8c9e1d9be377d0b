"""The start-up memory check, and the attention check: 'cudnn' that cannot
run refused, 'auto' that falls back to XLA warned about."""

from pathlib import Path
import re

from absl import logging
import jax
import pytest

from debug_runs import counting_compiles
from vidjax import config as config_lib, errors, main, memory
from vidjax.models import attention

RECIPE = str(Path(__file__).parents[1] / "configs/clip_vitb16_ego4d.py")


def test_a_step_that_cannot_fit_is_refused_before_compiling(tmp_path):
  # A 141 GB GPU without cuDNN, as XLA sees it: the CLIP recipe at 256
  # clips per device keeps XLA attention's weights for the backward pass
  # (save_dots_and_attention: ~510 MiB per clip, ~130 GiB in all). Here the
  # CPU's attention is XLA too, and the memory is stated.
  workdir = tmp_path / "run"
  with counting_compiles() as compiles, pytest.raises(errors.ConfigError) as e:
    main.run(
      RECIPE,
      str(workdir),
      overrides=[
        "--config.device_memory_gib=125.8",
        "--config.model.dtype=bfloat16",
      ],
    )
  assert e.value.exit_code == errors.EXIT_USAGE
  text = e.value.describe()
  assert (
    "will not fit in the device's memory: about 129.8 GiB per device" in text
  ), text
  assert "256 clips per device; remat 'save_dots_and_attention', xla" in text
  assert "against 113.2 GiB usable of 125.8 GiB" in text
  # The policy that keeps the most and fits, and the same global batch in
  # smaller microbatches.
  assert "--config.model.remat=dots_with_no_batch_dims_saveable (about" in text
  assert "--config.accum_steps=2 (128 clips per device at a time" in text
  # What it costs: the contrastive loss stays the whole batch's.
  assert (
    "the same global batch; the loss stays the whole batch's, for one " in text
  )
  assert (
    "more forward pass (4/3 the FLOPs) and 2 MiB of cached embeddings" in text
  )
  assert not workdir.exists() and not compiles, compiles


def test_auto_attention_without_cudnn_on_a_gpu_warns_why_and_what_it_costs(
  monkeypatch,
):
  config = config_lib.load_config(RECIPE, ["--config.model.dtype=bfloat16"])
  assert memory.check_attention(config) is None  # A CPU.
  # A Hopper GPU where JAX finds no cuDNN library.
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(attention, "_gpu_compute_capability", lambda: (9, 0))
  monkeypatch.setattr(attention, "cudnn_version", lambda: None)
  warned = []
  monkeypatch.setattr(
    logging, "warning", lambda fmt, *a: warned.append(fmt % a)
  )
  message = memory.check_attention(config)
  assert warned == [message]
  assert message.startswith(
    "attention='auto' runs XLA attention, not cuDNN flash attention, in the "
    "vision and text towers: JAX finds no cuDNN library"
  )
  # 12 layers x 12 heads x 785^2 bf16 weights, + the text tower's.
  assert "(heads x tokens x tokens: 170 MiB per clip" in message
  assert "'save_dots_and_attention' keeps them for the backward pass" in message
  config.model.attention = "xla"  # Chosen knowingly: nothing to say.
  assert memory.check_attention(config) is None


def test_cudnn_attention_that_cannot_run_is_refused():
  config = config_lib.load_config(
    RECIPE, ["--config.model.attention=cudnn", "--config.model.dtype=bfloat16"]
  )
  with pytest.raises(
    errors.ConfigError,
    match=re.escape(
      "'model.attention' = 'cudnn' cannot run in the vision tower: the "
      "default JAX backend is 'cpu'; cuDNN attention needs an NVIDIA GPU; "
      "'auto' uses cuDNN where it can, else XLA"
    ),
  ):
    memory.check_attention(config)


def test_a_masked_run_is_sized_by_its_masked_step_and_tunes_in_microbatches():
  """At mask 0.5 the demo's step keeps less per clip than unmasked: a
  memory just above the masked step's passes it; its unmasked tuning is
  refused at one microbatch (named, with the microbatches that fit) and
  passes in two, at the same global batch."""
  demo = str(Path(__file__).parents[1] / "configs/demo.py:debug")
  masked = config_lib.load_config(
    demo, ["--config.model.mask_ratio=0.5", "--config.unmask_fraction=0.1"]
  )
  alone = memory.step_memory(masked)
  need = alone.total_bytes(memory.clips_per_device(masked))
  masked.device_memory_gib = 1.01 * need / (1 - memory.HEADROOM) / memory.GiB
  with pytest.raises(errors.ConfigError) as e:
    memory.check_step_fits(masked)
  text = e.value.describe()
  assert (
    "the unmasked tuning's training step will not fit in the device's memory"
  ) in text
  assert "--config.unmask_accum_steps=2 (1 clips per device at a time" in text
  masked.unmask_accum_steps = 2
  assert memory.check_step_fits(masked) == alone
