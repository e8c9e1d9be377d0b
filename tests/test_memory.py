"""The start-up memory check, and the attention check: 'cudnn' that cannot
run refused, 'auto' that falls back to XLA warned about."""

from pathlib import Path
import re
import types

from absl import logging
import jax
import psutil
import pytest

import debug_runs
from debug_runs import counting_compiles
from vidjax import config as config_lib, main, memory, models, startup
from vidjax.base import errors
from vidjax.data.synthetic import layouts
from vidjax.models import attention

CONFIGS = Path(__file__).parents[1] / "configs"
RECIPE = str(CONFIGS / "clip_vitb16_ego4d.py")
# The :debug recipes' synthetic corpus (tests/debug_runs.py), for any recipe.
SYNTHETIC = (
  "--config.data.synthetic.enabled=True",
  "--config.data.synthetic.num_videos=8",
  "--config.data.synthetic.segment_seconds=2.0",
)


def _on_synthetic(spec, workdir, tmp_path_factory, *overrides):
  """The overrides that run `spec` on the session's synthetic corpus (put
  into WORKDIR/synthetic), in its own annotation format where the corpus
  has it."""
  config = config_lib.load_config(spec, SYNTHETIC)
  debug_runs.prepare(config, workdir, tmp_path_factory)
  own_format = config.data.format in layouts.FILES
  return [*SYNTHETIC, *overrides] + (
    [] if own_format else ["--config.data.format=jsonl"]
  )


def test_a_step_that_cannot_fit_is_refused_before_compiling(tmp_path_factory):
  # A 141 GB GPU without cuDNN, as XLA sees it: the CLIP recipe at 256
  # clips per device keeps XLA attention's weights for the backward pass
  # (save_dots_and_attention: ~510 MiB per clip, ~130 GiB in all). Here the
  # CPU's attention is XLA too, and the memory is stated.
  workdir = tmp_path_factory.mktemp("run")
  overrides = _on_synthetic(
    RECIPE,
    workdir,
    tmp_path_factory,
    "--config.device_memory_gib=125.8",
    "--config.model.dtype=bfloat16",
  )
  with counting_compiles() as compiles, pytest.raises(errors.ConfigError) as e:
    main.run(RECIPE, str(workdir), overrides=overrides)
  assert e.value.exit_code == errors.EXIT_USAGE
  text = e.value.describe()
  assert (
    "will not fit in the device's memory: about 130.0 GiB per device" in text
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
  assert [p.name for p in workdir.iterdir()] == ["synthetic"]
  assert not compiles, compiles


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


class _Reached(Exception):
  """Start-up got as far as the test needs."""


def _recipe_variants() -> list[str]:
  """Every recipe in configs/, alone and with each of its variants (and a
  variant with its recipe's CPU one), distinct configs only."""
  specs, seen = [], set()
  for path in sorted(CONFIGS.glob("*.py")):
    try:
      config_lib.load_config(f"{path}:no_such_variant")
    except errors.ConfigError as e:
      known = re.findall(r":(\w+)", str(e).split("known variants:")[1])
    small = [v for v in known if v in ("cpu", "debug")]
    args = [None, *known] + [f"{v},{s}" for v in known for s in small if v != s]
    for arg in args:
      spec = f"{path}:{arg}" if arg else str(path)
      try:
        text = config_lib.load_config(spec).to_json()
      except errors.ConfigError:  # Variants that exclude each other.
        continue
      if text not in seen:
        seen.add(text)
        specs.append(spec)
  return specs


@pytest.mark.parametrize(
  "spec",
  _recipe_variants(),
  ids=lambda s: Path(s).name,
)
def test_what_the_files_decide_is_settled_before_a_model_is_built(
  spec, tmp_path_factory, monkeypatch
):
  """Each recipe and variant, sizes left to the files, as on a GPU of 20
  GiB: when the memory check is reached, the vocabulary size, the class
  count and the steps of `total_epochs` are the files', and no model has
  been built (the check builds the first)."""
  workdir = tmp_path_factory.mktemp("start")
  overrides = _on_synthetic(
    spec,
    workdir,
    tmp_path_factory,
    "--config.device_memory_gib=20",
    "--config.total_epochs=3",
  )
  debug_runs.stand_in_teacher(monkeypatch)  # A distilled student's.
  builds, seen = [], {}
  build = models.build_model
  monkeypatch.setattr(
    models, "build_model", lambda *a, **k: builds.append(a) or build(*a, **k)
  )

  def reached(config, built=None):
    assert built is not None  # The run's own abstract state, reused.
    seen.update(config=config.copy_and_resolve_references(), builds=len(builds))
    raise _Reached

  monkeypatch.setattr(memory, "check_step_fits", reached)
  with pytest.raises(_Reached):
    main.run(spec, str(workdir), overrides=overrides)
  config = seen["config"]
  # The run's one abstract model (and a masked CLIP's unmasked graph).
  unmasked = config.model.name == "clip" and config.model.mask_ratio > 0
  assert seen["builds"] == 1 + unmasked, builds
  if "text" in config.model:
    assert config.model.text.vocab_size > 0
  if "num_classes" in config.model:
    assert config.model.num_classes > 0
  # At most 16 training clips (8 videos, 2 segments) in a batch of 16 or
  # more: one step per epoch.
  assert config.total_steps == 3


@pytest.mark.parametrize("variant", ["captions", "labels"])
def test_own_videos_on_a_gpu_of_20_gib_get_a_verdict(
  variant, tmp_path_factory, monkeypatch
):
  """The real check, on sizes the files gave (ViT-B/16, 8 frames): it
  fits, or is refused with a hint; never a traceback."""
  spec = f"{CONFIGS / 'own_videos.py'}:{variant}"
  workdir = tmp_path_factory.mktemp("own")
  overrides = _on_synthetic(
    spec, workdir, tmp_path_factory, "--config.device_memory_gib=20"
  )
  verdicts = []
  check = memory.check_step_fits
  # A host that could train what passes (its own check: the next test).
  host = types.SimpleNamespace(available=2**50)
  monkeypatch.setattr(psutil, "virtual_memory", lambda: host)

  def check_then_stop(config, built=None):
    verdicts.append(check(config, built))
    raise _Reached  # What comes after the check: the state.

  monkeypatch.setattr(memory, "check_step_fits", check_then_stop)
  try:
    with pytest.raises(_Reached):
      main.run(spec, str(workdir), overrides=overrides)
  except memory.StepTooLarge as e:
    assert not e.on_host and "--config.device_memory_gib" in e.hint
  else:
    assert isinstance(verdicts[0], memory.StepMemory), verdicts
    assert verdicts[0].remat == "full"


def test_a_gpu_recipe_on_a_cpu_is_refused_naming_its_cpu_variant(
  tmp_path_factory, monkeypatch
):
  """configs/own_videos.py:captions without `,cpu` on a host of 64 GiB: the
  step is held against the host's memory and refused before compiling."""
  spec = f"{CONFIGS / 'own_videos.py'}:captions"
  workdir = tmp_path_factory.mktemp("cpu")
  overrides = _on_synthetic(spec, workdir, tmp_path_factory)
  host = types.SimpleNamespace(available=64 * memory.GiB)
  monkeypatch.setattr(psutil, "virtual_memory", lambda: host)
  with (
    counting_compiles() as compiles,
    pytest.raises(memory.StepTooLarge) as e,
  ):
    main.run(spec, str(workdir), overrides=overrides)
  text = e.value.describe()
  assert e.value.on_host and e.value.exit_code == errors.EXIT_USAGE
  assert text.startswith("the training step will not fit in this host's")
  assert f"train --config {spec},cpu, or --config.batch_size=" in text, text
  assert re.search(r"\(at most \d+ clips per device fit here\)", text), text
  assert "--config.device_memory_gib=N plans for N GiB per device" in text
  assert len(text.splitlines()) == 2 and not compiles, compiles
  # The variant it names fits the same host.
  small = config_lib.load_config(
    f"{spec},cpu", ["--config.model.text.vocab_size=1024"]
  )
  assert memory.check_step_fits(small).remat == "none"


def test_a_plan_for_a_gpu_on_a_cpu_checks_the_host_too(monkeypatch):
  """`device_memory_gib` on a CPU: the plan's verdict, then the host's own
  memory, which the run would train in (held as on a CPU: remat 'none')."""
  demo = config_lib.load_config(
    str(CONFIGS / "demo.py:debug"), ["--config.device_memory_gib=20"]
  )
  host = types.SimpleNamespace(available=8 * memory.MiB)
  monkeypatch.setattr(psutil, "virtual_memory", lambda: host)
  with pytest.raises(memory.StepTooLarge) as e:
    memory.check_step_fits(demo)
  text = e.value.describe()
  assert e.value.on_host and e.value.exit_code == errors.EXIT_USAGE
  assert "it fits the 20.0 GiB per device planned (device_memory_gib)" in text
  assert "python -m vidjax.compile" in e.value.hint
  host.available = 2**40
  assert memory.check_step_fits(demo).remat == demo.model.remat


def test_on_a_gpu_the_compiled_step_is_held_against_the_device(monkeypatch):
  """The GPU path, simulated: the step compiled first (here for the CPU)
  and XLA's figure held against the device; the estimate where it does not
  compile, and for the hints, which say so."""
  demo = config_lib.load_config(
    str(CONFIGS / "demo.py:debug"), ["--config.device_memory_gib=1"]
  )
  host = types.SimpleNamespace(available=2**40)
  monkeypatch.setattr(psutil, "virtual_memory", lambda: host)
  monkeypatch.setattr(memory.check, "compiles_first", lambda: True)
  built = startup.build_abstract(config_lib.lock(demo))[2]
  compiled = memory.compiled_step_bytes(demo, built)
  assert 0 < compiled < memory.GiB
  figures = iter([None, 2 * memory.GiB])
  monkeypatch.setattr(
    memory.check, "compiled_step_bytes", lambda *a: next(figures)
  )
  assert memory.check_step_fits(demo, built).remat == demo.model.remat
  with pytest.raises(memory.StepTooLarge) as e:
    memory.check_step_fits(demo, built)
  text = e.value.describe()
  assert not e.value.on_host
  assert "about 2.0 GiB per device (as XLA compiled the step;" in text
  assert "hint: by the analytic estimate: " in text


def test_out_of_memory_during_a_run_ends_in_two_lines():
  error = jax.errors.JaxRuntimeError(
    "RESOURCE_EXHAUSTED: Out of memory allocating 384313021760 bytes.\n"
    "  more lines from XLA"
  )
  lines = main.out_of_memory(error).describe().splitlines()
  assert lines == [
    "the device ran out of memory: RESOURCE_EXHAUSTED: Out of memory "
    "allocating 384313021760 bytes. (357.9 GiB)",
    "  hint: raise --config.accum_steps (the same batch in smaller parts), "
    "lower --config.batch_size, or --config.model.remat=full; on a CPU, the "
    "recipe's CPU variant (configs/own_videos.py:...,cpu, or :debug)",
  ]
  assert main.out_of_memory(RuntimeError("something else")) is None


@pytest.mark.parametrize(
  "spec",
  [
    "demo.py:debug",  # Contrastive: a [B, B] similarity.
    "clip_vitb16_ego4d.py:debug,flip",  # Masked video tokens.
    "videomae_vitb_k400_pretrain.py:debug",  # Tube masks, 2 views a clip.
    "k400_ft.py:debug",  # Classification, mixup.
  ],
)
def test_one_trace_keeps_what_a_trace_at_each_batch_keeps(spec):
  """The loss traced once (`memory.estimate._kept_for_backward`) gives the
  bytes kept for backward at any batch that a trace at that batch gives."""
  import numpy as np

  from vidjax import sharding, steps, tasks
  from vidjax.base import internals
  from vidjax.data import batches

  config = config_lib.load_config(str(CONFIGS / spec))
  if config.model.get("text"):
    config.model.text.vocab_size = 100
  if config.model.get("num_classes") == 0:  # From the files, at start-up.
    config.model.num_classes = 5
  state, rest, built = steps.build_state_and_steps(
    config,
    tasks.get_task(config.task),
    sharding.make_mesh(),
    abstract=True,
  )
  kept = memory.estimate._kept_for_backward(config, built, state, rest)
  key = jax.eval_shape(lambda: jax.random.key(0))
  per_view = jax.device_count() * config.data.get("repeats", 1)
  for size in (per_view, 3 * per_view):
    residuals = internals.saved_residuals(
      lambda *a: built.loss(*a)[0],
      state["params"],
      rest,
      batches.batch_spec(config, size),
      key,
    )
    assert kept(size) == sum(
      int(np.prod(aval.shape)) * aval.dtype.itemsize
      for aval, where in residuals
      if not where.startswith("from the argument")
    ), size
