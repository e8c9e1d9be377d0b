"""Parity with OpenCLIP: released CLIP layouts load and embed like OpenCLIP.

One random OpenCLIP ViT-B-16-quickgelu (OpenAI's architecture), its weights
rounded to fp16 as released, is written in the layouts users download:

* OpenAI's `.pt`: a TorchScript archive saved with torch.jit, fp16, with
  the `input_resolution`, `context_length` and `vocab_size` entries (read
  as data: the archive's code never runs);
* AVION's `checkpoint_best.pt`: a pickle of {'state_dict', 'args', ...}
  with DDP 'module.' names, flash-attention `attn.Wqkv` / `mlp.fc1/fc2` in
  the vision tower, `visual.image_projection`, `textual.*`, the
  `--use-fast-conv1` Linear patch embedding and a 4-frame temporal table.

(OpenCLIP's own files use OpenAI's names, so the first case covers them.)

Each goes through `sources.read_source` and `init_from` into a vidjax CLIP
and gives OpenCLIP's image and text embeddings to 1e-4 (relative).
Needs open_clip_torch (skipped otherwise); no weights are downloaded.
torch and open_clip are imported by the tests, not at collection: they take
seconds to import, in every test process.
"""

import argparse
import importlib.util

from flax import nnx
import jax
import numpy as np
import pytest

from vidjax import defaults, models
from vidjax.models import init_from, sources, torchscript

if not all(importlib.util.find_spec(m) for m in ("open_clip", "torch")):
  pytest.skip("needs open_clip_torch", allow_module_level=True)


@pytest.fixture(scope="module")
def reference():
  """OpenCLIP with fp16-rounded weights, inputs and its float32 embeddings."""
  import open_clip  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel

  torch.manual_seed(0)
  model = open_clip.create_model("ViT-B-16-quickgelu", pretrained=None)
  model = model.half().float().eval()  # The released weights are fp16.
  rng = np.random.default_rng(0)
  images = rng.standard_normal((2, 3, 224, 224)).astype(np.float32)
  tokens = np.zeros((2, 77), np.int64)
  tokens[0, :5] = [49406, 320, 1125, 539, 49407]  # start, 3 words, end
  tokens[1, :3] = [49406, 2368, 49407]
  with torch.no_grad():
    image = model.encode_image(torch.from_numpy(images)).numpy()
    text = model.encode_text(torch.from_numpy(tokens)).numpy()
  return model, images, tokens, image, text


def openai_layout(clip):
  """OpenCLIP's modules under OpenAI's names, plus the archive's extras."""
  import torch  # pylint: disable=import-outside-toplevel

  class OpenAILayout(torch.nn.Module):
    def __init__(self):
      super().__init__()
      for name, module in clip.named_children():
        self.add_module(name, module)
      for name, param in clip.named_parameters(recurse=False):
        self.register_parameter(name, param)
      for name, value in (
        ("input_resolution", 224),
        ("context_length", 77),
        ("vocab_size", 49408),
      ):
        self.register_buffer(name, torch.tensor(value))

    def forward(self, image):
      return self.visual.conv1(image)

  return OpenAILayout()


def avion_checkpoint(state_dict: dict, num_frames: int = 4) -> dict:
  """OpenCLIP names -> AVION's CLIP_VITB16 (flash attention, fast conv1),
  wrapped as its training script saves `checkpoint_best.pt`."""
  import torch  # pylint: disable=import-outside-toplevel

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
  out["module.visual.temporal_embedding"] = torch.zeros(num_frames, 768)
  args = argparse.Namespace(
    model="CLIP_VITB16",
    clip_length=num_frames,
    use_flash_attn=True,
    use_fast_conv1=True,
    project_embed_dim=512,
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
  _, images, tokens, _, _ = reference
  config = defaults.model_config("clip")
  config.update(
    num_frames=1, dtype="float32", attention="xla", scan=True, drop_path=0.0
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
  for ours, theirs in zip(embeddings, reference[3:]):
    relative = np.abs(np.asarray(ours) - theirs).max() / np.abs(theirs).max()
    assert relative <= 1e-4, relative


def test_openai_torchscript_archive_matches_openclip(
  reference, embed, tmp_path
):
  import torch  # pylint: disable=import-outside-toplevel

  layout = openai_layout(reference[0]).half()
  archive = torch.jit.trace(
    layout, torch.zeros(1, 3, 16, 16).half(), check_trace=False
  )
  path = str(tmp_path / "ViT-B-16.pt")
  archive.save(path)
  with pytest.raises(RuntimeError, match="TorchScript"):  # What used to fail.
    torch.load(path, weights_only=True)
  # Read as data, without running the archive's code: exactly the tensors
  # torch.jit.load gives (302 parameters and the 3 extra entries).
  expected = torch.jit.load(path).state_dict()
  read = torchscript.read(path)
  assert list(read) == list(expected) and len(read) == 305
  for name, value in expected.items():
    assert read[name].dtype == value.numpy().dtype
    np.testing.assert_array_equal(read[name], value.numpy())
  source = sources.read_source(path)
  assert source.kind == "clip" and "OpenAI" in source.description
  assert_matches(embed(source), reference)


def test_avion_checkpoint_matches_openclip(reference, embed, tmp_path):
  import torch  # pylint: disable=import-outside-toplevel

  path = tmp_path / "checkpoint_best.pt"
  torch.save(avion_checkpoint(reference[0].state_dict()), path)
  source = sources.read_source(str(path))
  assert "AVION CLIP" in source.description
  assert source.tensors["visual.temporal_pos"].shape == (4, 768)
  assert_matches(embed(source), reference)
