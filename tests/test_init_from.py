"""`init_from`: task changes, resizing, errors, shardings, vidjax runs.

Small random state dicts (from test_models_weights) stand in for released
files; the models are built abstractly, so nothing here compiles a model.
"""

import json

from flax import nnx
import jax
from jax.sharding import PartitionSpec as P
import ml_collections
import numpy as np
import pytest

from test_models_weights import (
  random_clip_state_dict,
  random_videomae_state_dict,
)
from vidjax import sharding
from vidjax.base import keypaths, rundir
from vidjax.checkpoints import checkpoint, resume
from vidjax.models import CLIP, Classifier, spec
from vidjax.weights import conversion, init_from


def shapes(make):
  """Parameter path -> shape of the model `make()` builds (abstractly)."""
  params = nnx.state(nnx.eval_shape(make), nnx.Param)
  return {
    keypaths.name(k): v.shape
    for k, v in jax.tree_util.tree_flatten_with_path(params)[0]
  }


def clip_classifier(**kw):
  kw = {
    **dict(
      num_classes=5,
      backbone="clip",
      variant="B/8",
      width=64,
      depth=2,
      heads=1,
      image_size=16,
      num_frames=4,
      tubelet=1,
      drop_path=0.0,
      dtype="float32",
    ),
    **kw,
  }
  return lambda: Classifier(spec.of("classifier", **kw), rngs=nnx.Rngs(0))


def test_clip_to_classifier_keeps_the_vision_tower_and_says_what_it_did():
  sd = random_clip_state_dict()
  sd["visual.temporal_embedding"] = np.arange(2 * 64, dtype=np.float32).reshape(
    2, 64
  )  # 2 frames
  source = conversion.convert(sd, "clip.pt")
  values, report = init_from.fill(
    shapes(clip_classifier(scan=True)), source, "classifier"
  )
  qkv = np.stack(
    [
      sd[f"visual.transformer.resblocks.{i}.attn.in_proj_weight"].T
      for i in range(2)
    ]
  )
  np.testing.assert_array_equal(
    values["encoder.blocks.layers.attn.qkv.kernel"], qkv
  )  # Scan: stacked [depth, ...].
  assert "encoder.blocks.layers.attn.qkv.kernel" in report.loaded
  assert report.resized == {
    "encoder.temporal_pos": "(2, 64) -> (4, 64), linear interpolation"
  }
  np.testing.assert_allclose(
    values["encoder.temporal_pos"][[0, -1]],
    sd["visual.temporal_embedding"][[0, -1]],
  )
  assert report.fresh == {
    "head.bias": init_from._NEW_HEAD,
    "head.kernel": init_from._NEW_HEAD,
  }
  assert report.dropped["visual.proj"] == "the classifier has no projection"
  assert report.dropped["transformer.resblocks.1.ln_2.weight"] == (
    "the classifier has no text tower"
  )
  assert report.dropped["logit_scale"] == "the classifier has no temperature"
  assert report.change == "clip -> classifier"
  assert "dropped (29, the classifier has no text tower)" in report.summary()


def test_videomae_to_classifier_drops_the_decoder_and_starts_fc_norm_fresh():
  source = conversion.convert(random_videomae_state_dict())
  make = clip_classifier(num_classes=3, backbone="videomae", depth=1, tubelet=2)
  values, report = init_from.fill(shapes(make), source, "classifier", tubelet=2)
  assert set(report.fresh) == {
    "head.kernel",
    "head.bias",
    "encoder.norm.scale",
    "encoder.norm.bias",
  }
  assert "decoder.blocks.0.attn.qkv.weight" in report.dropped
  assert "encoder_to_decoder.weight" in report.dropped
  assert report.dropped["encoder.norm.weight"] == (
    "fc_norm starts fresh, as in VideoMAE"
  )
  assert "encoder.blocks.layers.0.attn.qkv.bias" in values


def small_clip_text() -> dict:
  return dict(vocab_size=50, context_length=12, width=64, heads=1, layers=1)


def small_clip(embed_dim, **keys):
  """A CLIP of ViT-64/8 (2 blocks) and a 64-wide text tower of 1 block."""
  keys = {
    **dict(
      embed_dim=embed_dim,
      variant="B/8",
      width=64,
      depth=2,
      heads=1,
      image_size=16,
      num_frames=4,
      text=small_clip_text(),
      drop_path=0.0,
      dtype="float32",
    ),
    **keys,
  }
  return lambda: CLIP(spec.of("clip", **keys), rngs=nnx.Rngs(0))


def test_misfits_are_named_projections_start_fresh_where_they_do_not_fit():
  sd = random_clip_state_dict(layers=1)
  target = shapes(small_clip(embed_dim=8))  # The source's are 16-d.
  with pytest.raises(init_from.InitFromError) as error:
    init_from.fill(target, conversion.convert(sd, "clip.npz"), "clip")
  message = str(error.value)
  assert message.startswith(
    "clip.npz (OpenAI/OpenCLIP CLIP) does not fit the clip model:"
  )
  assert "missing (12): visual.blocks.layers.1.attn.out.bias" in message
  sd.update(
    {
      f"visual.transformer.resblocks.1.{k[len('visual.transformer.resblocks.0.') :]}": v
      for k, v in sd.items()
      if k.startswith("visual.transformer.resblocks.0.")
    }
  )
  values, report = init_from.fill(target, conversion.convert(sd), "clip")
  assert report.fresh == {
    "text.proj.kernel": init_from._NEW_PROJECTION,
    "visual.proj.kernel": init_from._NEW_PROJECTION,
    "visual.temporal_pos": init_from._NO_TEMPORAL,
  }
  assert report.dropped["text_projection"] == "(64, 16) does not fit (64, 8)"
  # init_keep: not loaded even though it fits.
  values, report = init_from.fill(
    shapes(small_clip(embed_dim=16)),
    conversion.convert(sd),
    "clip",
    keep_init=("text.proj",),
  )
  assert "visual.proj.kernel" in values and "text.proj.kernel" not in values
  assert report.fresh["text.proj.kernel"] == "config.init_keep"
  assert report.dropped["text_projection"] == "config.init_keep"
  # A text tower of another width alone: init_keep for it can work.
  with pytest.raises(init_from.InitFromError) as error:
    init_from.fill(
      shapes(small_clip(16, text=dict(small_clip_text(), width=32))),
      conversion.convert(sd),
      "clip",
    )
  assert error.value.hint == (
    "to start that part fresh instead, name it in config.init_keep: "
    "--config.init_keep=\"('text.',)\""
  )
  with pytest.raises(
    init_from.InitFromError,
    match="holds a videomae model; it cannot initialise a clip model",
  ):
    init_from.fill(
      target, conversion.convert(random_videomae_state_dict()), "clip"
    )


def test_load_params_puts_each_array_on_the_live_sharding():
  mesh = sharding.make_mesh(fsdp=4)
  make = clip_classifier()
  abstract = nnx.state(nnx.eval_shape(make), nnx.Param)
  shardings = sharding.param_shardings(abstract, mesh, min_size=1)
  live = jax.tree.map(
    lambda x, s: jax.device_put(np.full(x.shape, 7.0, x.dtype), s),
    abstract,
    shardings,
  )
  sd = random_clip_state_dict()
  model_config = ml_collections.ConfigDict(
    dict(name="classifier", tubelet=1, backbone="")
  )
  params, _ = init_from.load_params(live, model_config, conversion.convert(sd))
  kernel = params["encoder"]["blocks"]["layers"][0]["mlp"]["fc1"]["kernel"]
  assert kernel[...].sharding.spec == P(None, "fsdp")  # [64, 256] split
  np.testing.assert_array_equal(
    kernel[...], sd["visual.transformer.resblocks.0.mlp.c_fc.weight"].T
  )
  np.testing.assert_array_equal(params["head"]["kernel"][...], 7.0)  # fresh
  for new, old in zip(jax.tree.leaves(params), jax.tree.leaves(live)):
    assert new.sharding == old.sharding
  model_config.backbone = "videomae"
  with pytest.raises(
    init_from.InitFromError,
    match="has a clip backbone but config.model.backbone is 'videomae'",
  ):
    init_from.load_params(live, model_config, conversion.convert(sd))


def test_a_vidjax_run_loads_across_scan_and_task(tmp_path, caplog):
  """A scanned CLIP run -> an unscanned classifier, from its workdir."""
  model = nnx.eval_shape(small_clip(16, num_frames=2, scan=True))
  rng = np.random.default_rng(0)
  params = jax.tree.map(
    lambda x: rng.standard_normal(x.shape).astype(np.float32),
    nnx.state(model, nnx.Param),
  )
  config = {"model": {"name": "clip", "tubelet": 1}}
  with checkpoint.Checkpointer(
    str(rundir.checkpoints(tmp_path)),
    every_steps=1,
    metadata={"config": config},
    best_metric="eval/r1",
  ) as ckpt:
    ckpt.save(3, {"step": 3, "params": params, "opt": {}})
    ckpt.save(4, {"step": 4, "params": params, "opt": {}})
    ckpt.record_eval(3, {"eval/r1": 0.5}, None)  # Step 3 is saved.
  with caplog.at_level("INFO"):
    source = resume.read_init_from(str(tmp_path))
  assert source.description == f"{tmp_path}/checkpoints/3 (vidjax clip)"
  # Orbax's look for metadata inside the item's folder is no damage.
  assert "Metadata file does not exist" not in caplog.text
  live = nnx.state(nnx.eval_shape(clip_classifier(num_frames=2)), nnx.Param)
  model_config = ml_collections.ConfigDict(
    dict(name="classifier", tubelet=1, backbone="")
  )
  loaded, report = init_from.load_params(live, model_config, source)
  np.testing.assert_array_equal(
    loaded["encoder"]["blocks"]["layers"][1]["attn"]["qkv"]["kernel"][...],
    params["visual"]["blocks"]["layers"]["attn"]["qkv"]["kernel"][...][1],
  )
  assert set(report.fresh) == {"head.kernel", "head.bias"}
  report.log(tmp_path)
  written = json.loads((tmp_path / rundir.INIT_FROM_JSON).read_text())
  assert written["change"] == "clip -> classifier"
  assert written["dropped"]["text.pos_embed"] == (
    "the classifier has no text tower"
  )


def test_a_directory_without_a_vidjax_checkpoint_is_named(tmp_path):
  (tmp_path / "model.safetensors").write_bytes(b"")
  with pytest.raises(
    FileNotFoundError,
    match=r"neither a complete vidjax "
    r"checkpoint.*name it: \['model.safetensors'\]",
  ):
    resume.read_init_from(str(tmp_path))


def test_weights_of_another_architecture_are_named_so_in_two_lines():
  # The demo's tiny CLIP into a wider, deeper recipe: both towers misfit.
  # Said as another architecture, side by side, with a hint that can work
  # (not config.init_keep), before anything compiles (startup.build fits
  # the weights to the abstract state first).
  source = conversion.convert(random_clip_state_dict(layers=1), "tiny.pt")
  wide = small_clip(
    16, width=128, depth=3, text=dict(small_clip_text(), width=96)
  )
  with pytest.raises(init_from.InitFromError) as error:
    init_from.fill(shapes(wide), source, "clip")
  lines = str(error.value).splitlines()
  assert lines[0].startswith(
    "tiny.pt (OpenAI/OpenCLIP CLIP) holds another architecture than the "
    "configured clip model ("
  ), lines
  assert lines[1] == (
    "  the weights: text 1 layers, visual 1 layers; the model: text 1 "
    "layers, visual 3 layers"
  )
  assert lines[2].startswith("  e.g. ") and len(lines) == 3
  assert "init_keep" not in error.value.hint
  assert "the recipe it trained with" in error.value.hint
