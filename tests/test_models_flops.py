"""FLOPs from the config agree with XLA's count of the compiled step."""

from pathlib import Path

from flax import nnx
import jax
import jax.numpy as jnp
import pytest

from vidjax import config as config_lib
from vidjax.config.defaults import model_config
from vidjax.models import build_model, spec
from vidjax.models.flops import flops_per_example
from vidjax.models.shapes import unmasked

BATCH = 2


def small_config(name):
  config = model_config(name)
  config.update(
    variant="Ti/16",
    width=256,
    heads=4,
    depth=2,
    num_frames=4,
    image_size=64,
    dtype="float32",
    attention="xla",
  )
  if name == "clip":
    config.text.update(layers=1, width=128, heads=2, vocab_size=1000)
    config.embed_dim = 64
  if name == "videomae":
    config.decoder.update(depth=1, width=128, heads=2)
    config.mask_ratio = 0.75
  return config


def xla_flops(config):
  """XLA's FLOPs per example for the forward and the gradient step."""
  model = build_model(config, rngs=nnx.Rngs(0))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  video = jnp.zeros((BATCH, 4, 64, 64, 3))

  def loss(params, rest, video):
    model = nnx.merge(graphdef, params, rest)
    if config.name == "clip":
      video_embedding, text_embedding = model(
        video, jnp.ones((BATCH, 77), jnp.int32)
      )
      return jnp.sum(video_embedding) + jnp.sum(text_embedding)
    if config.name == "videomae":
      masked = jnp.arange(model.encoder.num_patches) < model.num_masked
      return model(video, jnp.broadcast_to(masked, (BATCH, masked.size)))
    return jnp.sum(model(video))

  def count(fn):
    analysis = jax.jit(fn).lower(params, rest, video).compile().cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    return analysis["flops"] / BATCH

  return count(loss), count(jax.grad(loss))


@pytest.mark.parametrize("name", ["clip", "videomae", "classifier"])
def test_flops_match_xla_cost_analysis(name):
  config = small_config(name)
  ours = flops_per_example(config)
  forward, training = xla_flops(config)
  assert ours["training"] == 3 * ours["forward"]
  # XLA also counts elementwise ops, and skips the gradient of the input.
  assert ours["forward"] == pytest.approx(forward, rel=0.1)
  assert ours["training"] == pytest.approx(training, rel=0.15)


def test_vit_b16_clip_figure():
  """ViT-B/16 on 16 frames: 3137 tokens, 12 blocks of 24 L D^2 + 4 L^2 D."""
  tokens, width = 16 * 14 * 14 + 1, 768
  blocks = 12 * (24 * tokens * width**2 + 4 * tokens**2 * width)
  flops = flops_per_example(model_config("clip"))
  assert flops["vision"] == pytest.approx(blocks, rel=0.01)  # ~0.9 TFLOP
  assert flops["forward"] == flops["vision"] + flops["text"]


def test_masked_clip_training_clip_costs_at_most_055x_by_flops_and_xla():
  """configs/clip_vitb16_ego4d.py:flip, its 4-frame ViT-B/16 CLIP at mask
  0.5: a training clip costs <= 0.55x the unmasked one by flops.py and by
  XLA's cost analysis of the lowered gradient (nothing compiled), and the
  two agree within 2% with and without the mask."""
  recipe = Path(__file__).parents[1] / "configs/clip_vitb16_ego4d.py:flip"
  masked = config_lib.load_config(str(recipe)).model
  masked = masked.copy_and_resolve_references()
  masked.update(dtype="float32", attention="xla")
  assert (masked.num_frames, masked.mask_ratio) == (4, 0.5)
  model = nnx.eval_shape(lambda: build_model(masked, rngs=nnx.Rngs(0)))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  # The unmasked tuning's graph, as `steps` has it: its spec's model.
  every_token = spec.unmasked(model.spec)
  assert every_token.vision.mask_ratio == 0 < model.spec.vision.mask_ratio
  every_token = nnx.eval_shape(
    lambda s=every_token: build_model(s, rngs=nnx.Rngs(0))
  )
  graphdefs = {"masked": graphdef, "unmasked": nnx.graphdef(every_token)}
  counted, by_xla = {}, {}
  for name, config in (("masked", masked), ("unmasked", unmasked(masked))):

    def loss(params, video, tokens, graphdef=graphdefs[name]):
      model = nnx.merge(graphdef, params, rest)
      embedding = model.encode_video(
        video, deterministic=False, rngs=jax.random.key(0)
      )
      return jnp.sum(embedding) + jnp.sum(model.encode_text(tokens))

    lowered = (
      jax.jit(jax.grad(loss))
      .trace(
        params,
        jax.ShapeDtypeStruct((1, 4, 224, 224, 3), jnp.float32),
        jax.ShapeDtypeStruct((1, 77), jnp.int32),
      )
      .lower()
    )
    analysis = lowered.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    by_xla[name] = analysis["flops"]
    counted[name] = flops_per_example(config)["training"]
    assert counted[name] == pytest.approx(by_xla[name], rel=0.02)
  assert counted["masked"] <= 0.55 * counted["unmasked"]  # 238 of 489 GFLOP
  assert by_xla["masked"] <= 0.55 * by_xla["unmasked"]
