"""Released weights compute what they computed, through the recipes.

Each source is saved as its own code saves it: AVION's `checkpoint_best.pt`
(a pickle of {'state_dict' with DDP 'module.' names, 'args': an
argparse.Namespace, ...}, flash-attention `attn.Wqkv` / `mlp.fc1` blocks,
the `--use-fast-conv1` Linear patch embedding, a 4-frame temporal table)
and Hugging Face `save_pretrained` directories (config.json and
model.safetensors). Its outputs are compared, to 1e-4 relative, with a
reference forward written from the released model code's semantics
(AVION's `transformer.py` here, transformers' `modeling_videomae.py` in
tests/reference/make_reference.py), run by torch on the file's own tensors:
AVION's live (its pickles need torch), VideoMAE's as committed (rerun live
where torch is installed). The recipes load them as `train.setup`
does, with no flag but smaller sizes; the class token is small, as trained
ones are, so a wrong LayerNorm eps shows.
"""

import argparse
import json
import math
from pathlib import Path

from flax import nnx
import jax
import numpy as np
import pytest

from reference import make_reference
from reference.make_reference import attention, layer_norm, random_tensors
from test_models_weights import write_safetensors
from vidjax import config as config_lib, models, train
from vidjax.base import errors
from vidjax.checkpoints import resume
from vidjax.weights import conversion, facts, init_from, sources

try:  # AVION's checkpoints are torch pickles: written (and read) with torch.
  import torch

  F = torch.nn.functional
except ImportError:  # The Hugging Face directories need no torch.
  torch = F = None
needs_torch = pytest.mark.skipif(
  torch is None, reason="writes and reads AVION's torch pickles: needs torch"
)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
WIDTH, HEADS, PATCH, SIZE = (
  make_reference.VIDEOMAE[k] for k in ("width", "heads", "patch", "size")
)
EMBED = 256
SMALL = (
  "--config.model.variant=Ti/16",
  f"--config.model.width={WIDTH}",
  "--config.model.depth=2",
  f"--config.model.heads={HEADS}",
  f"--config.data.size={SIZE}",
)
SMALL_TEXT = (
  "--config.model.text.width=64",
  "--config.model.text.heads=2",
  "--config.model.text.layers=2",
)


# ---------------------------------------------------- AVION's CLIP, in torch


def avion_block_shapes(prefix: str, width: int, flash: bool) -> dict:
  names = (
    ("attn.Wqkv", "attn.out_proj", "mlp.fc1", "mlp.fc2")
    if flash
    else ("attn.in_proj_", "attn.out_proj", "mlp.c_fc", "mlp.c_proj")
  )
  shapes = {
    f"{prefix}ln_{i}.{p}": (width,) for i in (1, 2) for p in ("weight", "bias")
  }
  for name, (out, inp) in zip(
    names,
    (
      (3 * width, width),
      (width, width),
      (4 * width, width),
      (width, 4 * width),
    ),
  ):
    sep = "" if name.endswith("_") else "."
    shapes[f"{prefix}{name}{sep}weight"] = (out, inp)
    shapes[f"{prefix}{name}{sep}bias"] = (out,)
  return shapes


def avion_checkpoint(path, *, num_classes=0, frames=4, seed=0):
  """AVION's CLIP_VITB16 (or its VideoClassifier when num_classes > 0) with
  --use-flash-attn --use-fast-conv1, saved as its scripts save it."""
  shapes = {
    "visual.conv1.weight": (WIDTH, 3 * PATCH * PATCH),
    "visual.class_embedding": (WIDTH,),
    "visual.positional_embedding": (1 + (SIZE // PATCH) ** 2, WIDTH),
    "visual.temporal_embedding": (frames, WIDTH),
  }
  for norm in ("ln_pre", "ln_post"):
    shapes.update(
      {f"visual.{norm}.weight": (WIDTH,), f"visual.{norm}.bias": (WIDTH,)}
    )
  for i in range(2):
    shapes.update(
      avion_block_shapes(
        f"visual.transformer.resblocks.{i}.", WIDTH, flash=True
      )
    )
  if num_classes:
    shapes.update(
      {"fc_cls.weight": (num_classes, WIDTH), "fc_cls.bias": (num_classes,)}
    )
  else:
    shapes.update(
      {
        "visual.image_projection": (WIDTH, EMBED),
        "textual.token_embedding.weight": (49408, 64),
        "textual.positional_embedding": (77, 64),
        "textual.ln_final.weight": (64,),
        "textual.ln_final.bias": (64,),
        "textual.text_projection": (64, EMBED),
        "logit_scale": (),
      }
    )
    for i in range(2):
      shapes.update(
        avion_block_shapes(
          f"textual.transformer.resblocks.{i}.", 64, flash=False
        )
      )
  sd = random_tensors(shapes, seed)
  # Trained class tokens are small: the first LayerNorm sees little variance.
  sd["visual.class_embedding"] *= 0.01
  sd["visual.positional_embedding"][0] *= 0.01
  sd = {k: torch.from_numpy(v) for k, v in sd.items()}
  if "logit_scale" in sd:
    sd["logit_scale"] = torch.tensor(3.1)  # Not the 1/0.07 the recipes start at
  args = argparse.Namespace(
    model="CLIP_VITB16",
    clip_length=frames,
    use_flash_attn=True,
    use_fast_conv1=True,
    project_embed_dim=EMBED,
    num_classes=num_classes,
    output_dir="/runs/avion",
  )
  torch.save(
    {
      "epoch": 5,
      "args": args,
      "best_acc1": 0.3,
      "state_dict": {f"module.{k}": v for k, v in sd.items()},
    },
    path,
  )
  return sd


def avion_blocks(x, sd, tower, heads, eps, flash, causal=False):
  """AVION's ResidualAttentionBlocks: pre-LN, exact GELU (nn.GELU)."""
  for i in range(2):
    p = f"{tower}.transformer.resblocks.{i}."
    qkv, fc1, fc2 = (
      ("attn.Wqkv.", "mlp.fc1.", "mlp.fc2.")
      if flash
      else ("attn.in_proj_", "mlp.c_fc.", "mlp.c_proj.")
    )
    h = layer_norm(x, sd, p + "ln_1", eps)
    x = x + attention(
      h,
      sd[p + qkv + "weight"],
      sd[p + qkv + "bias"],
      sd[p + "attn.out_proj.weight"],
      sd[p + "attn.out_proj.bias"],
      heads,
      causal,
    )
    h = F.gelu(
      F.linear(
        layer_norm(x, sd, p + "ln_2", eps),
        sd[p + fc1 + "weight"],
        sd[p + fc1 + "bias"],
      )
    )
    x = x + F.linear(h, sd[p + fc2 + "weight"], sd[p + fc2 + "bias"])
  return x


def avion_video(sd, video):
  """AVION's VisionTransformer.forward, fast conv1: video [B, C, T, H, W]."""
  batch, _, frames, height, width = video.shape
  grid = (height // PATCH) * (width // PATCH)
  x = video.unflatten(3, (-1, PATCH)).unflatten(5, (-1, PATCH))
  x = x.permute(0, 2, 3, 5, 1, 4, 6).reshape(batch, frames * grid, -1)
  x = F.linear(x, sd["visual.conv1.weight"])
  cls = sd["visual.class_embedding"].expand(batch, 1, -1)
  x = torch.cat([cls, x], 1)
  temporal = sd["visual.temporal_embedding"]
  if len(temporal) != frames:  # inflate_positional_embeds, 'bilinear'
    temporal = F.interpolate(
      temporal[None, None], (frames, WIDTH), mode="bilinear"
    )[0, 0]
  pos = sd["visual.positional_embedding"]
  x = x + torch.cat(
    [pos[:1], pos[1:].repeat(frames, 1) + temporal.repeat_interleave(grid, 0)]
  )
  x = layer_norm(x, sd, "visual.ln_pre", 1e-6)
  x = avion_blocks(x, sd, "visual", HEADS, 1e-6, flash=True)
  x = layer_norm(x[:, 0], sd, "visual.ln_post", 1e-6)
  if "visual.image_projection" in sd:
    return x @ sd["visual.image_projection"]
  return F.linear(x, sd["fc_cls.weight"], sd["fc_cls.bias"])


def avion_text(sd, tokens):
  """AVION's TextTransformer.forward (causal, LayerNorm eps 1e-5)."""
  x = sd["textual.token_embedding.weight"][tokens]
  x = x + sd["textual.positional_embedding"]
  x = avion_blocks(x, sd, "textual", 2, 1e-5, flash=False, causal=True)
  x = layer_norm(x, sd, "textual.ln_final", 1e-5)
  return (
    x[torch.arange(len(x)), tokens.argmax(-1)] @ sd["textual.text_projection"]
  )


# ----------------------------------------------------- through the recipes


def load_through(recipe, path, *sizes, fresh=False):
  """configs/RECIPE.py with init_from=PATH, as `train.setup` loads it (the
  facts settled, the parameters filled by `load_params`), without the
  optimizer state; `fresh`: parameters the source lacks initialised first.
  -> (model, config, init_from report)."""
  config = config_lib.load_config(
    f"{CONFIGS / recipe}.py", [f"--config.init_from={path}", *sizes]
  )
  source = resume.read_start(resume.StartPoint("init_from", str(path)))
  settled = facts.settle(config, source)
  make = lambda: models.build_model(config.model, rngs=nnx.Rngs(0))
  graphdef, params, _ = nnx.split(nnx.eval_shape(make), nnx.Param, ...)
  if fresh:  # What the source does not give keeps its initial value.
    params = jax.jit(lambda: nnx.split(make(), nnx.Param, ...)[1])()
  params, report = init_from.load_params(
    params, config.model, source, keep_init=tuple(config.init_keep)
  )
  report.settled = settled
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(params))
  rest = jax.jit(lambda: nnx.split(make(), nnx.Param, ...)[2])()  # buffers
  return nnx.merge(graphdef, params, rest), config, report


def forward(model, *inputs):
  return nnx.jit(lambda model, *inputs: model(*inputs))(model, *inputs)


def video_input(frames, seed=1):
  """Normalised video in our layout [B, T, H, W, 3] and AVION's [B, C, T, H, W]."""
  video = (
    np.random.default_rng(seed)
    .standard_normal((2, frames, SIZE, SIZE, 3))
    .astype(np.float32)
  )
  return video, torch.from_numpy(video.transpose(0, 4, 1, 2, 3).copy())


def assert_close(ours, theirs):
  theirs = np.asarray(
    theirs.detach() if torch and torch.is_tensor(theirs) else theirs
  )
  relative = np.abs(np.asarray(ours) - theirs).max() / np.abs(theirs).max()
  assert relative <= 1e-4, relative


TOKENS = np.zeros((2, 77), np.int32)
TOKENS[0, :5] = [49406, 320, 1125, 539, 49407]  # start, 3 words, end
TOKENS[1, :3] = [49406, 2368, 49407]


@pytest.fixture(scope="module")
def avion_clip(tmp_path_factory):
  """(path, state dict) of an AVION CLIP pretraining's checkpoint_best.pt."""
  path = tmp_path_factory.mktemp("avion") / "checkpoint_best.pt"
  return path, avion_checkpoint(path)


@needs_torch
@pytest.mark.parity
@pytest.mark.parametrize(
  "recipe, frames", [("clip_vitb16_ego4d", 4), ("ek100_mir_ft", 16)]
)
def test_avion_clip_through_the_recipes(recipe, frames, avion_clip):
  path, sd = avion_clip
  model, config, report = load_through(recipe, path, *SMALL, *SMALL_TEXT)
  assert (config.model.act, config.model.logit_scale_init) == (
    "gelu",
    pytest.approx(3.1),
  )
  assert (model.visual.norm.epsilon, model.text.norm.epsilon) == (1e-6, 1e-5)
  assert config.data.num_frames == frames  # The recipe's (4 -> 16: resized).
  video, theirs = video_input(frames)
  ours = forward(model, video, TOKENS)  # (video, text) embeddings
  assert_close(ours[0], avion_video(sd, theirs))
  assert_close(ours[1], avion_text(sd, torch.from_numpy(TOKENS).long()))
  assert not report.fresh and report.facts["model.act"] == "gelu"
  assert report.settled[0].startswith(
    "model.act: 'quick_gelu' -> 'gelu' (AVION's towers"
  )


@needs_torch
@pytest.mark.parity
def test_avion_clip_starts_the_egtea_fine_tuning(avion_clip):
  """EGTEA's recipe from AVION's pretraining layout: the vision tower
  loaded (its 4-frame temporal table to 16), a fresh 106-way head (left
  abstract here: nothing computes with it)."""
  path = avion_clip[0]
  config = config_lib.load_config(
    f"{CONFIGS}/egtea_ft.py", [f"--config.init_from={path}", *SMALL]
  )
  source = resume.read_start(resume.StartPoint("init_from", str(path)))
  facts.settle(config, source)
  make = lambda: models.build_model(config.model, rngs=nnx.Rngs(0))
  params = nnx.split(nnx.eval_shape(make), nnx.Param, ...)[1]
  _, report = init_from.load_params(params, config.model, source)
  assert set(report.fresh) == {"head.kernel", "head.bias"}
  assert any("temporal" in name for name in report.resized), report.resized
  # Dropped: the text tower, temperature and projection, no vision part.
  assert report.loaded and report.dropped
  assert [n for n in report.dropped if n.startswith("visual.")] == [
    "visual.proj"
  ]
  assert (config.model.act, config.model.ln_eps) == ("gelu", 1e-6)
  assert config.model.num_classes == 106


@needs_torch
@pytest.mark.parity
def test_avion_classifier_through_ek100_cls_ft(tmp_path):
  path = tmp_path / "avion_finetune_cls.pt"
  sd = avion_checkpoint(path, num_classes=3806, frames=16)
  model, _, report = load_through("ek100_cls_ft", path, *SMALL)
  assert not report.fresh
  video, theirs = video_input(16)
  assert_close(forward(model, video), avion_video(sd, theirs))


@needs_torch
@pytest.mark.parity
def test_a_model_key_that_disagrees_with_the_weights_is_refused(
  avion_clip, tmp_path
):
  path = avion_clip[0]
  config = config_lib.load_config(
    f"{CONFIGS}/clip_vitb16_ego4d.py",
    [
      f"--config.init_from={path}",
      "--config.model.act=quick_gelu",
      *SMALL,
      *SMALL_TEXT,
    ],
  )
  with pytest.raises(errors.InitFromError) as error:
    train.setup(config, tmp_path / "run")
  assert "model.act='quick_gelu' but the weights computed 'gelu'" in str(
    error.value
  )
  assert not (tmp_path / "run").exists()
  # Where the user insists: kept, with a warning.
  source = sources.read_source(str(path))
  config.init_allow_mismatch = True
  assert facts.settle(config, source) == [
    "model.ln_eps: 1e-05 -> 1e-06 (AVION's vision tower: LayerNorm(eps=1e-6))",
    "model.logit_scale_init: 2.65926 -> 3.1 (the video CLIP's temperature)",
  ]
  assert config.model.act == "quick_gelu"


# ------------------------- Hugging Face VideoMAE (its forward: make_reference)


def hf_videomae_dir(
  path, *, mean_pooling: bool, seed=2, architecture="classification"
):
  """A save_pretrained directory of transformers' VideoMAE ARCHITECTURE
  ('classification', 'model': a VideoMAEModel, or 'pretraining'), with
  make_reference.hf_videomae's weights and config.json."""
  sd, config = make_reference.hf_videomae(mean_pooling, seed, architecture)
  path.mkdir()
  (path / "config.json").write_text(json.dumps(config, indent=2))
  write_safetensors(path / "model.safetensors", sd, {"format": "pt"})
  return sd, config


@pytest.mark.parametrize("mean_pooling", [False, True])
def test_hugging_face_videomae_directory_through_k400_ft(
  mean_pooling, tmp_path
):
  """As transformers computes it (make_reference.hf_videomae_logits, whose
  logits are committed)."""
  hf_videomae_dir(tmp_path / "videomae-ft", mean_pooling=mean_pooling)
  model, _, _ = load_through("k400_ft", tmp_path / "videomae-ft", *SMALL)
  encoder = model.encoder
  assert (
    encoder.pool,
    encoder.blocks.layers[0].norm1.epsilon,
    encoder.norm.epsilon,
  ) == (("mean", 1e-3, 1e-5) if mean_pooling else ("token", 1e-3, 1e-3))
  logits = make_reference.committed("hf_videomae")
  assert_close(
    forward(model, make_reference.videomae_video()),
    logits["mean" if mean_pooling else "token"],
  )


@pytest.mark.parametrize("mean_pooling", [False, True])
def test_hugging_face_videomae_model_directory_through_k400_ft(
  mean_pooling, tmp_path
):
  """A VideoMAEModel's own directory (names without 'videomae.') fine-tunes
  as VideoMAEForVideoClassification.from_pretrained of it computes: its
  config's pooling, a fresh fc_norm (1, 0) and a fresh head (set here to
  the reference's, make_reference.hf_videomae_head)."""
  path = tmp_path / "videomae"
  hf_videomae_dir(path, mean_pooling=mean_pooling, architecture="model")
  model, _, report = load_through(
    "k400_ft", path, *SMALL, "--config.data.num_frames=4", fresh=True
  )
  encoder = model.encoder
  assert (
    encoder.pool,
    encoder.blocks.layers[0].norm1.epsilon,
    encoder.norm.epsilon,
  ) == (("mean", 1e-3, 1e-5) if mean_pooling else ("token", 1e-3, 1e-3))
  assert {"head.kernel", "head.bias"} <= set(report.fresh)
  assert ("encoder.norm.scale" in report.fresh) == mean_pooling
  head = make_reference.hf_videomae_head()
  model.head.kernel[...] = jax.numpy.asarray(head["classifier.weight"].T)
  model.head.bias[...] = jax.numpy.asarray(head["classifier.bias"])
  assert_close(
    forward(model, make_reference.videomae_video(frames=4)),
    make_reference.committed("hf_videomae")[f"model/{encoder.pool}"],
  )


def test_hugging_face_videomae_pretraining_directory_predicts_as_it(tmp_path):
  """VideoMAEForPreTraining's directory through the pretraining recipe: its
  decoder's last LayerNorm keeps PyTorch's eps (1e-5) beside its blocks'
  (1e-12 there: 1.5e-5 off); predictions to 1e-6 relative of
  make_reference.hf_videomae_predictions (committed)."""
  path = tmp_path / "videomae-pt"
  hf_videomae_dir(path, mean_pooling=False, architecture="pretraining")
  decoder = make_reference.VIDEOMAE["decoder"]
  model, config, _ = load_through(
    "videomae_vitb_k400_pretrain",
    path,
    *SMALL,
    "--config.data.num_frames=4",
    f"--config.model.decoder.width={decoder}",
    "--config.model.decoder.depth=1",
    "--config.model.decoder.heads=2",
  )
  assert (config.model.ln_eps, config.model.decoder.ln_eps) == (1e-3, 1e-5)
  assert model.decoder_norm.epsilon == 1e-5
  ours = nnx.jit(lambda m, v, k: m(v, k, return_predictions=True)[1])(
    model, make_reference.videomae_video(frames=4), make_reference.MASK
  )
  theirs = make_reference.committed("hf_videomae")["pretraining"]
  relative = np.abs(np.asarray(ours) - theirs).max() / np.abs(theirs).max()
  assert relative <= 1e-6, relative


@pytest.mark.parity
def test_the_committed_videomae_logits_are_the_reference_forwards():
  make_reference.check_live("hf_videomae", rtol=1e-5, atol=1e-6)


def test_openai_weights_start_the_pretraining_as_avion_does():
  """OpenAI's 512-d projections do not fit the recipe's 256-d ones: fresh.
  Its temperature (an image CLIP's) is not carried over: 1/0.07."""
  from test_models_weights import random_clip_state_dict

  sd = random_clip_state_dict()  # Width 64, patch 8, 16 px, 16-d projections.
  sd.update(
    input_resolution=np.array(16),
    context_length=np.array(12),
    vocab_size=np.array(50),
  )  # The TorchScript release's extras.
  source = conversion.convert(sd, "ViT-B-16.pt")
  assert source.description == "ViT-B-16.pt (OpenAI CLIP)"
  config = config_lib.load_config(
    f"{CONFIGS}/clip_vitb16_ego4d.py",
    [
      "--config.model.variant=Ti/8",
      "--config.model.width=64",
      "--config.model.heads=1",
      "--config.model.depth=2",
      "--config.data.size=16",
      "--config.model.text.vocab_size=50",
      "--config.model.text.context_length=12",
      "--config.model.text.heads=1",
      "--config.model.text.width=64",
      "--config.model.text.layers=2",
    ],
  )
  assert facts.settle(config, source) == []  # QuickGELU, eps 1e-5: as set.
  assert source.facts["act"][0] == "quick_gelu"
  params = nnx.state(
    nnx.eval_shape(lambda: models.build_model(config.model, rngs=nnx.Rngs(0))),
    nnx.Param,
  )
  _, report = init_from.load_params(params, config.model, source)
  assert report.fresh == {
    "text.proj.kernel": init_from._NEW_PROJECTION,
    "visual.proj.kernel": init_from._NEW_PROJECTION,
    "visual.temporal_pos": init_from._NO_TEMPORAL,
  }
  assert report.dropped == {
    "visual.proj": "(64, 16) does not fit (64, 256)",
    "text_projection": "(64, 16) does not fit (64, 256)",
    "logit_scale": init_from._TEMPERATURE[1],
  }
  assert config.model.logit_scale_init == pytest.approx(math.log(1 / 0.07))


def test_a_run_resumes_with_what_it_computed():
  """A run that took AVION's facts, resumed by the same command: its saved
  config's facts are settled again (the recipe's defaults would differ)."""
  config = config_lib.load_config(f"{CONFIGS}/ek100_cls_ft.py", [])
  saved = {"model": dict(config.model.to_dict(), act="gelu", ln_eps=1e-6)}
  source = init_from.Source(
    "classifier", {}, {}, "run/checkpoints/7", facts=facts.run_facts(saved)
  )
  assert facts.settle(config, source) == [
    "model.act: 'quick_gelu' -> 'gelu' (the run's config)",
    "model.ln_eps: 1e-05 -> 1e-06 (the run's config)",
  ]
  # A run saved before these keys existed computed its backbone's defaults.
  old = facts.run_facts({"model": {"name": "clip", "logit_scale_init": 2.0}})
  assert {k: v for k, (v, _) in old.items()} == {
    "backbone": "clip",
    "act": "quick_gelu",
    "ln_eps": 1e-5,
    "pool": "token",
    "text.ln_eps": 1e-5,
    "logit_scale_init": 2.0,
  }


def test_what_vidjax_cannot_compute_is_refused_in_one_line(tmp_path):
  for change, expected in (
    (
      {"hidden_act": "gelu_new"},
      "hidden_act 'gelu_new' is not one vidjax "
      "computes (['gelu', 'quick_gelu'])",
    ),
    (
      {"model_type": "vivit"},
      "model_type 'vivit'; vidjax reads Hugging "
      "Face's 'clip' and 'videomae' models",
    ),
  ):
    path = tmp_path / change.get("model_type", "act")
    _, config = hf_videomae_dir(path, mean_pooling=True)
    (path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(errors.InitFromError) as error:
      sources.read_source(str(path))
    assert str(error.value) == f"{path / 'config.json'}: {expected}"


def test_a_sharded_save_pretrained_directory_reads_as_one(tmp_path):
  sd, config = hf_videomae_dir(tmp_path / "one", mean_pooling=False)
  sharded = tmp_path / "sharded"
  sharded.mkdir()
  (sharded / "config.json").write_text(json.dumps(config))
  names = sorted(sd)
  shards = {
    "model-00001-of-00002.safetensors": names[::2],
    "model-00002-of-00002.safetensors": names[1::2],
  }
  for file, part in shards.items():
    write_safetensors(
      sharded / file, {k: sd[k] for k in part}, {"format": "pt"}
    )
  (sharded / "model.safetensors.index.json").write_text(
    json.dumps(
      {
        "metadata": {"total_size": 0},
        "weight_map": {k: f for f, part in shards.items() for k in part},
      }
    )
  )
  one, both = (sources.read_source(str(p)) for p in (tmp_path / "one", sharded))
  assert one.tensors.keys() == both.tensors.keys() and one.facts == both.facts
  for path, value in one.tensors.items():
    np.testing.assert_array_equal(both.tensors[path], value)
