"""`python -m vidjax.export`: the :debug runs out, in the layouts PyTorch
code loads, computing what they computed here.

The test run's :debug runs (`debug_runs`: the video CLIP, a CLIP classifier,
VideoMAE's pretraining and its fine-tune) are exported once each
(`make_reference.EXPORTS`). By default (no torch):

* `init_from` of each export gives the run's parameters bit for bit (the
  formats' two exceptions checked exactly: a one-frame CLIP's temporal row
  folded into its positions, Hugging Face's missing key bias);
* vidjax, loading each export, gives the outputs the format's own code gave
  on the same inputs (committed by `make_reference.exports`: AVION's model as
  plain torch, OpenCLIP, transformers), to 1e-4 relative;
* the model card holds the run's figures at the exported step;
* the refusals: no checkpoint, a format that cannot hold the model, an
  existing OUT, a write stopped half way (OUT never appears).

With the `[parity]` extra (VIDJAX_PARITY=live in CI) the formats' own code
runs live on this test run's exports: each model card's snippet, AVION's
model definition loading the state dict with no missing or unexpected key,
transformers' `from_pretrained` offline.
"""

import argparse
import importlib.util
import os

from flax import nnx
import jax
import numpy as np
import pytest
import safetensors.numpy

import debug_runs
from reference import make_reference
from vidjax import export, models
from vidjax.base import errors
from vidjax.checkpoints import checkpoint_reader, resume
from vidjax.export import __main__ as command, card, formats
from vidjax.weights import facts, init_from

pytestmark = pytest.mark.xdist_group("debug_runs")
EXPORTS = make_reference.EXPORTS
# And vidjax's own format, which no other code reads.
MADE = {**EXPORTS, "safetensors": ("clip_vitb16_ego4d", "safetensors", None)}
ONE_FRAME = ("--config.model.num_frames=1", "--config.data.num_frames=1")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """name -> (the run's workdir, OUT), each export made once."""
  made = {}

  def get(name):
    if name not in made:
      run, fmt, frames = MADE[name]
      workdir, _ = debug_runs.run(tmp_path_factory, run)
      out = tmp_path_factory.mktemp("exports") / name
      export.export(workdir, out, fmt, frames=frames)
      made[name] = workdir, out
    return made[name]

  return get


def _file(out):
  """The file of an export that init_from names (a directory for hf)."""
  names = (
    "checkpoint_best.safetensors",
    "open_clip_model.safetensors",
    "params.safetensors",
  )
  return next((out / n for n in names if (out / n).exists()), out)


def _load(run: str, init, *overrides):
  """The :debug recipe's model from `init` (an export or a run)."""
  config = debug_runs.load(run, f"--config.init_from={init}", *overrides)
  source = resume.read_init_from(os.fspath(init))
  facts.settle(config, source)
  return init_from.build(
    lambda: models.build_model(config.model, rngs=nnx.Rngs(0)),
    source,
    config.model.name,
    tubelet=config.model.tubelet,
  )


def _run(model, fn, *args):
  """`fn(model, *args)` jitted (one compilation: eager ops compile one by one)."""
  graphdef, state = nnx.split(model)
  jitted = jax.jit(lambda state, *a: fn(nnx.merge(graphdef, state), *a))
  return np.asarray(jitted(state, *args))


def vidjax_outputs(name: str, init, inputs: dict) -> dict:
  """What vidjax computes from `init` on `inputs`, named as
  `make_reference.export_outputs` names the references' outputs."""
  run = EXPORTS[name][0]
  video, tokens = inputs["video"], inputs["tokens"].astype(np.int32)
  if name in ("avion_clip", "open_clip"):
    model = _load(run, init, *(ONE_FRAME if name == "open_clip" else ()))
    clip = video[:, :1] if name == "open_clip" else video
    return {
      "image" if name == "open_clip" else "video": _run(
        model, lambda m, v: m.encode_video(v), clip
      ),
      "text": _run(model, lambda m, t: m.encode_text(t), tokens),
    }
  model = _load(run, init)
  if name == "hf_pretrain":
    predict = lambda m, v, mask: m(v, mask, return_predictions=True)[1]  # noqa: E731
    return {"logits": _run(model, predict, video, inputs["mask"])}
  return {"logits": _run(model, lambda m, v: m(v), video)}


def relative_error(got, want) -> float:
  return float(np.abs(np.asarray(got) - want).max() / np.abs(want).max())


# ------------------------------------------------------- default suite


@pytest.mark.parametrize("name", MADE)
def test_export_then_init_from_gives_the_same_parameters(name, exported):
  workdir, out = exported(name)
  init = _file(out)
  directory, step = resume.find_checkpoint(workdir, prefer_best=True)
  params, config = checkpoint_reader.read_params(directory, step)
  source = resume.read_init_from(os.fspath(init))
  values, report = init_from.fill(
    {path: value.shape for path, value in params.items()},
    source,
    config["model"]["name"],
    tubelet=config["model"]["tubelet"],
  )
  expected = dict(params)
  if name == "open_clip":  # One frame: the temporal row in the positions.
    temporal = expected.pop("visual.temporal_pos")
    spatial = expected["visual.spatial_pos"].copy()
    spatial[1:] += temporal[0]
    expected["visual.spatial_pos"] = spatial
    assert set(report.fresh) == {"visual.temporal_pos"}
  else:
    assert not report.fresh and not report.resized
  for path, value in expected.items():
    if name.startswith("hf") and path.endswith("attn.qkv.bias"):
      # transformers' VideoMAE has no key bias (softmax ignores it).
      third = len(value) // 3
      value = value.copy()
      value[third : 2 * third] = 0
    assert values[path].dtype == value.dtype, path
    np.testing.assert_array_equal(values[path], value, err_msg=path)
  # What the model computed with comes back too.
  run_facts = {
    k: v for k, (v, _) in export.read_model(workdir)[0].facts.items()
  }
  assert {k: source.facts[k][0] for k in run_facts} == run_facts


@pytest.mark.parametrize("name", EXPORTS)
def test_exports_compute_what_their_formats_code_computed(name, exported):
  want = make_reference.committed("exports")
  _, out = exported(name)
  fingerprint = make_reference.export_fingerprint(out)
  if not np.array_equal(fingerprint, want[f"{name}/fingerprint"]):
    # A :debug classifier's two steps move its encoder by Adam's normalised
    # steps on near-zero gradients: float math of another machine can train
    # other weights. The live test compares this test run's own export.
    pytest.skip(
      f"this test run's {EXPORTS[name][0]} run trained other weights "
      "than the reference's (made by make_reference.exports)"
    )
  got = vidjax_outputs(name, _file(out), want)
  for output, value in got.items():
    reference = want[f"{name}/{output}"]
    assert value.shape == reference.shape
    assert relative_error(value, reference) < 1e-4, output


def test_the_model_card_holds_the_runs_figures(exported):
  workdir, out = exported("avion_clip")
  text = (out / "README.md").read_text()
  figures = card.metrics_at(workdir, 2)
  assert "eval/ek100_mir/mAP_avg" in figures and "train/loss" in figures
  for name, value in figures.items():
    shown = f"{value:.6g}" if isinstance(value, float) else value
    assert f"| `{name}` | {shown} |" in text
  assert "## Evaluation at step 2" in text and "- step 2 of 2" in text
  compile(card.snippet_of(text), "snippet", "exec")
  if importlib.util.find_spec("torch") is None:
    assert not (out / "checkpoint_best.pt").exists()
    assert "PyTorch is not installed" in text
  else:
    assert (out / "checkpoint_best.pt").exists()


def _command(capsys, *argv) -> tuple[int, str]:
  code = command.main([str(a) for a in argv])
  err = capsys.readouterr().err
  assert "Traceback" not in err
  return code, err


def test_refusals_in_the_users_words(exported, tmp_path, capsys):
  workdir, out = exported("avion_clip")
  pretrain, _ = exported("hf_pretrain")
  (tmp_path / "empty").mkdir()
  code, err = _command(
    capsys, tmp_path / "empty", tmp_path / "o", "--format=hf"
  )
  assert code == 2 and "no checkpoint to export" in err and "hint:" in err
  for run, fmt, what in (
    (workdir, "open_clip", "cannot hold a 4-frame video CLIP"),
    (workdir, "hf", "cannot hold a clip model"),
    (pretrain, "avion", "cannot hold a videomae model"),
    (pretrain, "open_clip", "cannot hold a videomae model"),
  ):
    code, err = _command(capsys, run, tmp_path / "o", f"--format={fmt}")
    assert code == 2 and what in err, err
  student = formats.Model("umt", None, {}, {}, {}, {})
  for fmt in ("avion", "open_clip", "hf"):
    with pytest.raises(errors.ConfigError, match="a distilled student"):
      formats.FORMATS[fmt](student)
  before = sorted(os.listdir(out))
  code, err = _command(capsys, workdir, out, "--format=avion")
  assert code == 2 and "never overwrites" in err
  assert sorted(os.listdir(out)) == before
  assert not (tmp_path / "o").exists()


def test_an_export_stopped_half_way_leaves_no_out(
  exported, tmp_path, monkeypatch
):
  workdir, _ = exported("avion_clip")
  out, written = tmp_path / "out", []

  def save_file(arrays, path, metadata=None):
    assert not out.exists()  # Written beside OUT, renamed at the end.
    written.append(path)
    safetensors.numpy.save_file.__wrapped__(arrays, path, metadata=metadata)
    raise KeyboardInterrupt  # Stopped after the first file.

  save_file.__wrapped__ = safetensors.numpy.save_file
  monkeypatch.setattr(safetensors.numpy, "save_file", save_file)
  with pytest.raises(KeyboardInterrupt):
    export.export(workdir, out, "avion")
  assert written and not out.exists() and os.listdir(tmp_path) == []


# -------------------------------------- live: the formats' own code


def _needs(*modules):
  missing = [m for m in modules if importlib.util.find_spec(m) is None]
  if missing:
    if os.environ.get("VIDJAX_PARITY") == "live":
      pytest.fail(f"VIDJAX_PARITY=live, but {missing} cannot be imported")
    pytest.skip(f"needs {', '.join(missing)} (the [parity] extra)")


@pytest.mark.parity
@pytest.mark.parametrize("name", EXPORTS)
def test_live_formats_code_computes_what_vidjax_computes(name, exported):
  _needs("torch", "open_clip", "transformers")
  _, out = exported(name)
  inputs = make_reference.export_inputs()
  theirs = make_reference.export_outputs({name: out}, inputs)
  ours = vidjax_outputs(name, _file(out), inputs)
  for output, value in ours.items():
    assert relative_error(value, theirs[f"{name}/{output}"]) < 1e-4, output


@pytest.mark.parity
@pytest.mark.parametrize("name", ["avion_clip", "avion_cls"])
def test_live_avion_loads_with_no_missing_or_unexpected_keys(name, exported):
  _needs("torch")
  import torch

  from reference import avion_model

  _, out = exported(name)
  namespace = {}
  avion_model.install()
  exec(card.snippet_of((out / "README.md").read_text()), namespace)
  with torch.serialization.safe_globals([argparse.Namespace]):
    saved = torch.load(out / "checkpoint_best.pt", weights_only=True)
  assert saved["args"].use_flash_attn and saved["args"].use_fast_conv1
  state_dict = {
    k.removeprefix("module."): v for k, v in saved["state_dict"].items()
  }
  keys = namespace["model"].load_state_dict(state_dict, strict=False)
  assert keys.missing_keys == [] and keys.unexpected_keys == []


@pytest.mark.parity
def test_live_hugging_face_loads_offline(exported, monkeypatch):
  _needs("transformers")
  import transformers

  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  for name, cls in (
    ("hf_cls", transformers.VideoMAEForVideoClassification),
    ("hf_pretrain", transformers.VideoMAEForPreTraining),
  ):
    _, out = exported(name)
    _, info = cls.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
