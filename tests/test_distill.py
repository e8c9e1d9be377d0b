"""Pretraining from a frozen CLIP teacher (UMT): the loss and the token
selection against UMT's definitions written as plain code, the teacher
against the CLIP tower's own layers, and the :debug recipe's run (resumed
after SIGTERM, handed to k400_ft, its teacher never trained)."""

import os
import signal

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import debug_runs
from vidjax import (
  config as config_lib,
  models,
  sharding,
  steps as steps_lib,
  tasks,
  train,
)
from vidjax.base import errors
from vidjax.checkpoints import checkpoint_reader, teacher as teacher_lib
from vidjax.config import defaults
from vidjax.data import batches
from vidjax.models import flops as flops_lib, shapes, spec as spec_lib, umt
from vidjax.report import monitor
from vidjax.tasks import distill
from vidjax.weights import init_from

RECIPE = "umt_vitb_k400_pretrain"


def _normalised(rng, shape):
  x = rng.standard_normal(shape).astype(np.float32)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_losses_are_umts():
  """UMT's engine: l2 = (2 - 2 * (out * target).sum(-1)).mean(); mse and
  smooth_l1 are PyTorch's MSELoss and SmoothL1Loss (means over all)."""
  rng = np.random.default_rng(0)
  p, t = _normalised(rng, (3, 2, 5, 8)), _normalised(rng, (3, 2, 5, 8))
  l2 = np.mean(2 - 2 * np.sum(p * t, axis=-1))
  mse = np.mean((p - t) ** 2)
  d = np.abs(p - t) * 3  # Past 1 too.
  smooth = np.mean(np.where(d < 1, 0.5 * d**2, d - 0.5))
  for kind, want, (a, b) in (
    ("l2", l2, (p, t)),
    ("mse", mse, (p, t)),
    ("smooth_l1", smooth, (3 * p, 3 * t)),
  ):
    per_example = distill.align_error(jnp.asarray(a), jnp.asarray(b), kind)
    assert per_example.shape == (2,)
    # Every example keeps as many tokens: their mean is UMT's mean.
    np.testing.assert_allclose(np.mean(per_example), want, rtol=1e-5)


def _umt_kept(attn, draw, mask_ratio, batch):
  """UMT's engine, in numpy: `importance = torch.multinomial(attn, N)`
  (here the draw's order: a draw without replacement is the order of
  exponential noise / weight), the first N_vis visible, the mask
  reshaped to [B, T x N]; the kept tokens, in order."""
  frames_total, n = attn.shape
  n_vis = n - int(n * mask_ratio)
  importance = np.argsort(draw / attn, axis=1, kind="stable")
  masked = np.ones((frames_total, n), bool)
  for row in range(frames_total):
    masked[row, importance[row, :n_vis]] = False
  masked = masked.reshape(batch, -1)
  return np.stack([np.flatnonzero(~row) for row in masked])


def test_attention_selection_keeps_what_umt_keeps():
  rng = np.random.default_rng(1)
  batch, frames, n, ratio = 2, 3, 10, 0.8
  attn = rng.random((batch * frames, n)).astype(np.float32) + 1e-3
  draw = rng.exponential(size=(batch * frames, n)).astype(np.float32)
  keep = umt.kept_per_frame(n, ratio)
  assert keep == n - int(n * ratio) == 2
  got = umt.select_tokens(
    attn.reshape(batch, frames, n),
    draw.reshape(batch, frames, n),
    keep,
    "attention",
  )
  np.testing.assert_array_equal(got, _umt_kept(attn, draw, ratio, batch))
  # 'topk': the most attended; 'random': the least noise.
  top = umt.select_tokens(
    attn.reshape(batch, frames, n), draw.reshape(batch, frames, n), 2, "topk"
  )
  want = [
    sorted(
      f * n + i
      for f in range(frames)
      for i in np.argsort(-attn[b * frames + f])[:2]
    )
    for b in range(batch)
  ]
  np.testing.assert_array_equal(top, want)


def test_the_race_is_a_draw_without_replacement():
  """The order of exponential noise / weight is torch.multinomial's draw
  without replacement: P(i then j) = w_i / S x w_j / (S - w_i)."""
  rng = np.random.default_rng(2)
  w = np.array([0.5, 0.3, 0.2])
  draws = 40_000
  order = np.argsort(rng.exponential(size=(draws, 3)) / w, axis=1)
  for i in range(3):
    for j in range(3):
      if i != j:
        want = w[i] * w[j] / (1 - w[i])
        seen = np.mean((order[:, 0] == i) & (order[:, 1] == j))
        assert abs(seen - want) < 0.01, (i, j, seen, want)


def _tiny_clip_tower():
  """A CLIP's vision tower (one frame; class token, learned positions)."""
  spec = spec_lib.of(
    "clip",
    variant="Ti/8",
    width=32,
    depth=3,
    heads=2,
    image_size=16,
    num_frames=1,
    embed_dim=16,
    dtype="float32",
  ).vision
  return models.VisionTransformer(spec, rngs=nnx.Rngs(3))


def _tiny_umt(**teacher):
  config = defaults.model_config("umt")
  config.update(
    variant="Ti/8", width=32, depth=2, heads=2, image_size=16, num_frames=2
  )
  config.update(dtype="float32", align_layers=2, mask_ratio=0.5)
  config.teacher.update(teacher)
  return models.build_model(config, rngs=nnx.Rngs(4))


def test_the_teacher_is_the_clip_towers_own_layers():
  """The teacher loaded from a CLIP's weights returns the tower's own
  blocks' outputs (its norm, projection, L2), and its last block's
  class-token attention, the heads' mean, computed here from its weights."""
  tower = _tiny_clip_tower()
  visual = {
    "visual." + ".".join(map(str, p)): np.asarray(v.get_value())
    for p, v in nnx.to_flat_state(nnx.state(tower, nnx.Param))
  }
  source = init_from.Source("clip", visual, {k: k for k in visual}, "tiny")
  model = _tiny_umt(
    variant="B/8", width=32, depth=3, heads=2, mlp_dim=128, embed_dim=16
  )
  graphdef, trained, rest = nnx.split(model, nnx.Param, ...)
  rest, _ = teacher_lib.load(rest, source)
  model = nnx.merge(graphdef, trained, rest)
  video = jax.random.normal(jax.random.key(5), (2, 2, 16, 16, 3))
  features, attention = nnx.jit(lambda m, v: m.teach(v))(model, video)
  assert features.shape == (2, 2, 2 * 4, 16) and attention.shape == (2, 2, 4)

  @nnx.jit
  def own_layers(tower, frames):
    """Each block's input and output, the tower's own code."""
    x = tower.pre_norm(tower.prepend_class_token(tower.embed(frames)))
    inputs, outputs = [], []
    for block in tower.blocks.layers:
      inputs.append(x)
      x = block(x, drop_rate=0.0, key=None)
      outputs.append(x)
    last = tower.blocks.layers[-1]
    qkv = last.attn.qkv(last.norm1(inputs[-1]))
    return [tower.proj(tower.norm(y)) for y in outputs], qkv

  projected, qkv = own_layers(tower, video.reshape(4, 1, 16, 16, 3))
  for k, hidden in enumerate(projected[-2:]):
    want = np.asarray(hidden)[:, 1:]
    want = want / np.linalg.norm(want, axis=-1, keepdims=True)
    np.testing.assert_allclose(
      features[k], want.reshape(2, 8, 16), rtol=2e-5, atol=2e-6
    )
  qkv = np.asarray(qkv).reshape(4, 5, 3, 2, 16)
  logits = np.einsum("bhd,bkhd->bhk", qkv[:, 0, 0], qkv[:, :, 1]) / 4.0
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  np.testing.assert_allclose(
    attention, weights.mean(1)[:, 1:].reshape(2, 2, 4), rtol=1e-5, atol=1e-7
  )


def test_a_run_needs_a_teacher_named_by_its_absolute_path(tmp_path):
  config = debug_runs.load(RECIPE)
  with pytest.raises(errors.ConfigError, match="model.teacher.source"):
    teacher_lib.read(config)
  config = debug_runs.load(RECIPE, "--config.model.teacher.source=demo_run")
  config_lib.make_paths_absolute(config)
  assert config.model.teacher.source == os.path.abspath("demo_run")


def test_the_teacher_counts_forward_only_in_the_flops():
  """UMT ViT-B/16: 8 frames through the teacher (a ViT-B/16 forward each),
  the student on 8 x 40 kept tokens; training is 3x the student's forward
  and 1x the teacher's."""
  config = config_lib.load_config(str(debug_runs.CONFIGS / f"{RECIPE}.py"))
  flops = flops_lib.flops_per_example(config.model)
  assert shapes.attention_shapes(config.model)["vision"].tokens == 8 * 40
  image = flops_lib.transformer_flops(197, 768, 12, 3072)
  embed = 2 * 196 * 16 * 16 * 3 * 768
  projection = 2 * 6 * 196 * 768 * 512
  assert flops["teacher"] == 8 * (image + embed + projection)
  student = flops["vision"] + flops["align"]
  assert flops["training"] == 3 * student + flops["teacher"]
  # 0.47 TFLOP per clip, 61% of it the teacher's forward.
  assert 0.60 < flops["teacher"] / flops["training"] < 0.62


def test_repeated_views_and_microbatches_trace():
  """`data.repeats` (the teacher on every view) and `accum_steps` (the
  mean over examples of microbatches) on the :debug recipe's step."""
  config = debug_runs.load(
    RECIPE, "--config.data.repeats=2", "--config.accum_steps=2"
  )
  mesh = sharding.make_mesh(fsdp=1)
  task = tasks.get_task(config.task)
  state, rest, steps = steps_lib.build_state_and_steps(
    config, task, mesh, abstract=True
  )
  batch = batches.batch_spec(config, 8)
  (loss, _), grads = jax.eval_shape(
    steps.gradients, state["params"], rest, batch, jax.random.key(0)
  )
  assert loss.shape == () and set(grads) == {"encoder", "align"}


def test_a_teacher_is_settled_from_its_weights_and_must_have_the_layers():
  shapes = {
    "visual.patch_embed.kernel": (3 * 8 * 8, 128),
    "visual.proj.kernel": (128, 32),
    **{
      f"visual.blocks.layers.{i}.mlp.fc1.kernel": (128, 512) for i in range(3)
    },
  }
  tensors = {k: np.ones(v, np.float32) for k, v in shapes.items()}
  source = init_from.Source("clip", tensors, {}, "three blocks")
  config = debug_runs.load(RECIPE, "--config.model.align_layers=3")
  lines = teacher_lib.settle(config, source)
  teacher = config.model.teacher
  assert (teacher.variant, teacher.width, teacher.depth) == ("B/8", 128, 3)
  assert (teacher.heads, teacher.mlp_dim, teacher.embed_dim) == (2, 512, 32)
  assert teacher.checksum == teacher_lib.checksum(source) and len(lines) == 7
  with pytest.raises(errors.ConfigError, match="align_layers=6 but"):
    teacher_lib.settle(
      debug_runs.load(RECIPE, "--config.model.align_layers=6"), source
    )


# ------------------------------------------------------- the :debug recipe


def _losses(workdir) -> list[float]:
  return [
    r["train/loss"] for r in monitor.read_metrics(workdir) if "train/loss" in r
  ]


@pytest.mark.xdist_group("debug_runs")
def test_debug_resumes_exactly_after_sigterm_and_never_trains_its_teacher(
  tmp_path, tmp_path_factory, monkeypatch
):
  source = debug_runs.teacher_override(tmp_path_factory)
  uninterrupted, final = debug_runs.umt(tmp_path_factory)
  expected = _losses(uninterrupted)
  assert len(expected) == 2 and np.all(np.isfinite(expected))
  assert np.isfinite(final["eval/loss"])

  runs = []
  setup = train.setup

  def setup_and_keep(*args, **kwargs):
    run = setup(*args, **kwargs)
    runs.append((run, teacher_lib.leaves(run.rest)))
    return run

  config = debug_runs.load(RECIPE, source)
  workdir = debug_runs.prepare(config, tmp_path / "run", tmp_path_factory)
  with monkeypatch.context() as patch:
    patch.setattr(train, "setup", setup_and_keep)

    def stop_in_first_step(*args, **kwargs):
      run = setup_and_keep(*args, **kwargs)
      step = run.steps.train

      def sending(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)
        return step(*a, **k)

      patch.setattr(run.steps, "train", sending)
      return run

    patch.setattr(train, "setup", stop_in_first_step)
    with pytest.raises(errors.Preempted):
      train.train_and_evaluate(config, workdir)
    assert checkpoint_reader.latest_complete_step(workdir / "checkpoints") == 1
    patch.setattr(train, "setup", setup_and_keep)
    train.train_and_evaluate(debug_runs.load(RECIPE, source), workdir)
  assert _losses(workdir) == expected

  # The teacher: out of the trained state, named in the checkpoint, and
  # bit-identical to its weights after training.
  weights = teacher_lib.read(config)
  params, saved = checkpoint_reader.read_params(workdir / "checkpoints", 2)
  assert not [n for n in params if "teacher" in n]
  assert {n.split(".")[0] for n in params} == {"encoder", "align"}
  named = saved["model"]["teacher"]
  assert named["source"] == config.model.teacher.source
  assert named["checksum"] == teacher_lib.checksum(weights)
  for run, before in runs:
    after = teacher_lib.leaves(run.rest)
    assert after.keys() == before.keys() and len(after) > 10
    for name, value in after.items():
      np.testing.assert_array_equal(value, before[name])
      want = weights.tensors[f"visual.{name}"]
      if want.shape == value.shape:  # Not the resized temporal table.
        np.testing.assert_array_equal(value, want)


@pytest.mark.xdist_group("debug_runs")
def test_its_checkpoint_starts_k400_ft_with_the_students_weights(
  tmp_path, tmp_path_factory
):
  pretrained, _ = debug_runs.umt(tmp_path_factory)
  config = debug_runs.load("k400_ft", f"--config.init_from={pretrained}")
  workdir = debug_runs.prepare(config, tmp_path / "ft", tmp_path_factory)
  run = train.setup(config, workdir)
  report = run.init_report
  assert set(report.fresh) == {
    "head.kernel",
    "head.bias",
    "encoder.norm.scale",
    "encoder.norm.bias",
  }
  assert {n for n in report.dropped if n.startswith("align.")} == {
    f"align.{k}.{part}"
    for k in range(2)
    for part in ("proj.kernel", "proj.bias", "norm.scale", "norm.bias")
  }
  # k400_ft's tubelets of 2: the one-frame patch kernel is inflated.
  assert list(report.resized) == ["encoder.patch_embed.kernel"]
  saved, _ = checkpoint_reader.read_params(pretrained / "checkpoints", 2)
  encoder = run.state["params"]["encoder"]
  for path in (
    "blocks.layers.1.attn.qkv.kernel",
    "blocks.layers.0.mlp.fc2.bias",
  ):
    node = encoder
    for key in path.split("."):
      node = node[int(key) if key.isdigit() else key]
    np.testing.assert_array_equal(node[...], saved[f"encoder.{path}"])
