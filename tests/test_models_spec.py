"""The model spec: settled once from the config, frozen, variants by
`dataclasses.replace`; no model constructor takes more than a spec."""

import ast
import dataclasses
from pathlib import Path

import jax.numpy as jnp
import pytest

from vidjax.config import defaults
from vidjax.models import spec

MODELS = Path(__file__).resolve().parents[1] / "vidjax" / "models"


def test_no_model_constructor_takes_more_than_8_parameters():
  counts = {}
  for path in MODELS.glob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ClassDef):
        for f in node.body:
          if isinstance(f, ast.FunctionDef) and f.name == "__init__":
            a = f.args
            n = len(a.posonlyargs) + len(a.args) - 1 + len(a.kwonlyargs)
            counts[f"{path.name}:{node.name}"] = n
  assert counts["vit.py:VisionTransformer"] == 2  # (spec, *, rngs)
  assert max(counts.values()) <= 8, counts


def test_the_config_is_settled_into_a_frozen_spec():
  config = defaults.model_config("classifier")
  config.update(variant="S/16", backbone="clip", drop_path=0.3, dtype="auto")
  model = spec.from_config(config)
  vision = model.encoder
  # The backbone's style where the config leaves it empty; rates per block.
  assert (vision.class_token, vision.pool, vision.blocks.act) == (
    True,
    "token",
    "quick_gelu",
  )
  assert vision.blocks.ln_eps == 1e-5 and vision.blocks.width == 384
  assert len(vision.blocks.drop_path) == 12
  assert vision.blocks.drop_path[-1] == pytest.approx(0.3)
  assert vision.blocks.compute.dtype == jnp.float32  # 'auto' on a CPU.
  with pytest.raises(dataclasses.FrozenInstanceError):
    vision.pool = "mean"
  # A key named as a field reaches it without a line of its own.
  assert spec.of("clip", remat="full").text.blocks.compute.remat == "full"


def test_variants_are_new_specs():
  masked = spec.of("clip", mask_ratio=0.5, remat="none")
  unmasked = spec.unmasked(masked)
  assert unmasked.vision.mask_ratio == 0 and masked.vision.mask_ratio == 0.5
  assert dataclasses.replace(unmasked.vision, mask_ratio=0.5) == masked.vision
  assert spec.unmasked(unmasked) is unmasked
  full = spec.with_compute(masked, remat="full")
  assert {full.vision.blocks.compute.remat, full.text.blocks.compute.remat} == {
    "full"
  }
  assert masked.vision.blocks.compute.remat == "none"
  mae = spec.with_compute(spec.of("videomae"), scan=True)
  assert mae.encoder.blocks.compute.scan and mae.decoder.compute.scan
