"""Parity with OpenCLIP: released CLIP layouts load and embed like OpenCLIP.

One small random OpenCLIP CLIP of OpenAI's architecture (QuickGELU), its
weights perturbed (no zero bias, no unit LayerNorm) and rounded to fp16 as
released, in the layouts users download:

* OpenAI's `.pt`: a TorchScript archive saved with torch.jit, fp16, with
  the `input_resolution`, `context_length` and `vocab_size` entries (read
  as data: the archive's code never runs);
* AVION's `checkpoint_best.pt`: a pickle of {'state_dict', 'args', ...}
  with DDP 'module.' names, flash-attention `attn.Wqkv` / `mlp.fc1/fc2` in
  the vision tower, `visual.image_projection`, `textual.*`, the
  `--use-fast-conv1` Linear patch embedding and a 4-frame temporal table.

(OpenCLIP's own files use OpenAI's names, so the first case covers them.)

Each goes through `sources.read_source` and `init_from` into a vidjax CLIP
and gives OpenCLIP's image and text embeddings to 1e-4 (relative). The
archive and OpenCLIP's outputs are committed (tests/reference/, made by
`make_reference.openclip`), so the first case needs no torch; the AVION
pickle is written (and read) with torch. With OpenCLIP installed,
`test_the_committed_openclip_outputs_are_openclips` also reruns OpenCLIP.
"""

import argparse
import importlib.util

from flax import nnx
import jax
import numpy as np
import pytest

from reference import make_reference
from vidjax import models
from vidjax.config import defaults
from vidjax.weights import init_from, sources, torchscript

ARCHIVE = make_reference.HERE / "openclip_vit.pt"


def _needs_torch():
  if importlib.util.find_spec("torch") is None:
    pytest.skip("writing and reading a torch pickle needs torch")
  import torch

  return torch


@pytest.fixture(scope="module")
def reference():
  """The committed OpenCLIP run: fp16-rounded weights (`sd/NAME`), inputs
  and its float32 embeddings."""
  return make_reference.committed("openclip")


def avion_checkpoint(state_dict: dict, num_frames: int = 4) -> dict:
  """OpenCLIP names -> AVION's CLIP_VITB16 (flash attention, fast conv1),
  wrapped as its training script saves `checkpoint_best.pt`."""
  torch = _needs_torch()

  out = {}
  for name, value in state_dict.items():
    if name.startswith("visual.transformer."):
      for old, new in (
        ("attn.in_proj_weight", "attn.Wqkv.weight"),
        ("attn.in_proj_bias", "attn.Wqkv.bias"),
        ("mlp.c_fc.", "mlp.fc1."),
        ("mlp.c_proj.", "mlp.fc2."),
      ):
        name = name.replace(old, new)
    elif name == "visual.conv1.weight":
      value = value.flatten(1)  # Linear over (channel, row, column)
    elif name == "visual.proj":
      name = "visual.image_projection"
    elif not name.startswith("visual.") and name != "logit_scale":
      name = f"textual.{name}"
    out[f"module.{name}"] = value
  width = make_reference.OPENCLIP["width"]
  out["module.visual.temporal_embedding"] = torch.zeros(num_frames, width)
  args = argparse.Namespace(
    model="CLIP_VITB16",
    clip_length=num_frames,
    use_flash_attn=True,
    use_fast_conv1=True,
    project_embed_dim=make_reference.OPENCLIP["embed_dim"],
    lr=3e-5,
    output_dir="/x",
  )
  return {
    "epoch": 5,
    "state_dict": out,
    "best_acc1": 0.27,
    "args": args,
    "optimizer": {"state": {}, "param_groups": [{"lr": 3e-5}]},
  }


@pytest.fixture(scope="module")
def embed(reference):
  """source -> (image, text) embeddings of a vidjax CLIP loaded from it."""
  images, tokens = reference["images"], reference["tokens"]
  c = make_reference.OPENCLIP
  config = defaults.model_config("clip")
  config.update(
    num_frames=1,
    dtype="float32",
    attention="xla",
    scan=True,
    drop_path=0.0,
    width=c["width"],
    depth=c["layers"],
    heads=c["heads"],
    image_size=c["image_size"],
    embed_dim=c["embed_dim"],
  )
  config.text.update(
    width=c["text_width"],
    heads=c["text_heads"],
    layers=c["layers"],
    vocab_size=c["vocab_size"],
  )
  video = images.transpose(0, 2, 3, 1)[:, None]  # one frame
  compiled = {}

  def run(source):
    model = init_from.build(
      lambda: models.build_model(config, rngs=nnx.Rngs(0)),
      source,
      "clip",
      tubelet=1,
    )
    graphdef, state = nnx.split(model)
    if "forward" not in compiled:  # One compile for every source.
      compiled["forward"] = jax.jit(
        lambda state, video, tokens: (
          nnx.merge(graphdef, state).encode_video(video),
          nnx.merge(graphdef, state).encode_text(tokens),
        )
      )
    return compiled["forward"](state, video, tokens.astype(np.int32))

  return run


def assert_matches(embeddings, reference):
  for ours, name in zip(embeddings, ("image", "text")):
    theirs = reference[name]
    relative = np.abs(np.asarray(ours) - theirs).max() / np.abs(theirs).max()
    assert relative <= 1e-4, (name, relative)


def _state_dict(reference) -> dict[str, np.ndarray]:
  return {k[3:]: v for k, v in reference.items() if k.startswith("sd/")}


def test_openai_torchscript_archive_matches_openclip(reference, embed):
  # Read as data, without running the archive's code: exactly the tensors
  # torch.jit.load gave (the parameters and the 3 extra entries).
  expected = _state_dict(reference)
  read = torchscript.read(str(ARCHIVE))
  assert list(read) == list(expected)
  for name, value in expected.items():
    assert read[name].dtype == value.dtype, name
    np.testing.assert_array_equal(read[name], value)
  source = sources.read_source(str(ARCHIVE))
  assert source.kind == "clip" and "OpenAI" in source.description
  assert_matches(embed(source), reference)


@pytest.mark.parity
def test_torch_itself_refuses_the_archive_as_a_pickle():
  torch = _needs_torch()
  with pytest.raises(RuntimeError, match="TorchScript"):  # What used to fail.
    torch.load(ARCHIVE, weights_only=True)


@pytest.mark.parity
def test_avion_checkpoint_matches_openclip(reference, embed, tmp_path):
  torch = _needs_torch()
  state_dict = {
    k: torch.from_numpy(v).float()
    for k, v in _state_dict(reference).items()
    if k not in ("input_resolution", "context_length", "vocab_size")
  }
  path = tmp_path / "checkpoint_best.pt"
  torch.save(avion_checkpoint(state_dict), path)
  source = sources.read_source(str(path))
  assert "AVION CLIP" in source.description
  width = make_reference.OPENCLIP["width"]
  assert source.tensors["visual.temporal_pos"].shape == (4, width)
  assert_matches(embed(source), reference)


@pytest.mark.parity
def test_the_committed_openclip_outputs_are_openclips():
  make_reference.check_live("openclip", rtol=1e-5, atol=1e-6)
