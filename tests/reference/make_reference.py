"""Reference outputs of the implementations vidjax is checked against.

    python tests/reference/make_reference.py [NAME ...]   # -> tests/reference/

Each function below runs a reference implementation (OpenCLIP, torch,
torchvision: the `[parity]` extra, at constraints.txt's versions) on small,
seeded, non-trivial weights and inputs, and returns what the parity tests
compare with: {name: numpy array}, written to `NAME.npz` (and, for
OpenCLIP, the TorchScript archive `openclip_vit.pt`, as OpenAI releases
them). The default test suite reads the committed files; with the
reference implementations installed, the same tests also call these
functions again and check that the committed outputs still match
(`check_live`).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
import sys

import numpy as np

HERE = Path(__file__).resolve().parent
# A small OpenAI-architecture CLIP (QuickGELU): 2 layers per tower, a 32x32
# image of 2x2 patches, a 256-token vocabulary.
OPENCLIP = dict(
  embed_dim=24,
  image_size=32,
  patch=16,
  width=32,
  layers=2,
  heads=2,
  text_width=32,
  text_heads=2,
  vocab_size=256,
)


def _perturbed(model, seed: int) -> None:
  """Seeded noise on every parameter: biases non-zero, LayerNorms not 1/0,
  as in trained weights (OpenCLIP initialises many of them to 0 or 1)."""
  import torch  # pylint: disable=import-outside-toplevel

  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for param in model.parameters():
      param += 0.05 * torch.randn(param.shape, generator=generator)


def openclip(archive: Path | None = None) -> dict[str, np.ndarray]:
  """OpenCLIP's image and text embeddings of a small CLIP, its weights
  rounded to fp16 as released; with `archive`, the model is also saved
  there as OpenAI's TorchScript `.pt` (fp16, with `input_resolution`,
  `context_length` and `vocab_size` entries).

  Returns:
    `sd/NAME`: the archive's tensors as torch.jit.load reads them (fp16;
    the 3 entries int64); `images` float32[2, 3, 32, 32]; `tokens`
    int64[2, 77]; `image` / `text`: float32[2, 24] embeddings.
  """
  import open_clip  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel

  c = OPENCLIP
  torch.manual_seed(0)
  model = open_clip.CLIP(
    c["embed_dim"],
    open_clip.CLIPVisionCfg(
      layers=c["layers"],
      width=c["width"],
      head_width=c["width"] // c["heads"],
      patch_size=c["patch"],
      image_size=c["image_size"],
    ),
    open_clip.CLIPTextCfg(
      context_length=77,
      vocab_size=c["vocab_size"],
      width=c["text_width"],
      heads=c["text_heads"],
      layers=c["layers"],
    ),
    quick_gelu=True,
  )
  _perturbed(model, seed=1)
  model = model.half().float().eval()  # The released weights are fp16.
  rng = np.random.default_rng(0)
  size = c["image_size"]
  images = rng.standard_normal((2, 3, size, size)).astype(np.float32)
  tokens = np.zeros((2, 77), np.int64)
  eot = c["vocab_size"] - 1  # The end token has the largest id, as CLIP's.
  tokens[0, :5] = [eot - 1, 20, 112, 7, eot]  # start, 3 words, end
  tokens[1, :3] = [eot - 1, 43, eot]
  with torch.no_grad():
    image = model.encode_image(torch.from_numpy(images)).numpy()
    text = model.encode_text(torch.from_numpy(tokens)).numpy()
  layout = _openai_layout(model).half()
  if archive is None:
    state = layout.state_dict()
  else:
    traced = torch.jit.trace(
      layout, torch.zeros(1, 3, 16, 16).half(), check_trace=False
    )
    traced.save(str(archive))
    state = torch.jit.load(str(archive)).state_dict()
  out = {f"sd/{k}": v.numpy() for k, v in state.items()}
  return dict(out, images=images, tokens=tokens, image=image, text=text)


def _openai_layout(clip):
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
        ("input_resolution", OPENCLIP["image_size"]),
        ("context_length", 77),
        ("vocab_size", OPENCLIP["vocab_size"]),
      ):
        self.register_buffer(name, torch.tensor(value))

    def forward(self, image):
      return self.visual.conv1(image)

  return OpenAILayout()


# name -> (the function, the modules it needs, the extra files it writes).
REFERENCES = {
  "openclip": (openclip, ("torch", "open_clip"), ("openclip_vit.pt",)),
}


def committed(name: str) -> dict[str, np.ndarray]:
  """The committed outputs of reference `name` (tests/reference/NAME.npz)."""
  with np.load(HERE / f"{name}.npz") as f:
    return dict(f)


def can_run(name: str) -> bool:
  """Whether reference `name`'s implementation is importable here."""
  return all(importlib.util.find_spec(m) for m in REFERENCES[name][1])


def check_live(name: str, **tolerance) -> None:
  """Runs reference `name` again and asserts that its outputs equal the
  committed ones (same names, shapes and dtypes; values to `tolerance`,
  numpy's assert_allclose arguments, exact by default). Skips where the
  implementation is not installed, unless VIDJAX_PARITY=live (CI's parity
  step) makes that a failure."""
  import pytest  # pylint: disable=import-outside-toplevel

  if not can_run(name):
    needs = ", ".join(REFERENCES[name][1])
    if os.environ.get("VIDJAX_PARITY") == "live":
      pytest.fail(f"VIDJAX_PARITY=live, but {needs} cannot be imported")
    pytest.skip(f"the live reference needs {needs} (the [parity] extra)")
  want, got = committed(name), REFERENCES[name][0]()
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
    np.testing.assert_allclose(got[key], value, err_msg=key, **tolerance)


def main(names: list[str]) -> int:
  for name in names or REFERENCES:
    function, _, files = REFERENCES[name]
    kwargs = {"archive": HERE / files[0]} if files else {}
    arrays = function(**kwargs)
    np.savez_compressed(HERE / f"{name}.npz", **arrays)
    size = sum((HERE / f).stat().st_size for f in (f"{name}.npz", *files))
    print(f"{name}: {len(arrays)} arrays, {size / 1024:.0f} KiB")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
