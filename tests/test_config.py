"""Tests for vidjax.config and vidjax.config.recipe with a small recipe written in
tmp_path."""

import json
import re
import textwrap

import ml_collections
import pytest

from vidjax import config as vconfig
from vidjax.base import errors, rundir
from vidjax.config import defaults, recipe

CONFIG_PY = textwrap.dedent("""
    from vidjax.config import defaults, recipe

    def get_config(arg=None):
      variants = recipe.variants(arg, ("debug", "small"))
      c = defaults.base_config("mae")
      c.total_steps = 100
      c.batch_size = 32
      c.checkpoint.every_steps = 50
      c.optim.lr = 1e-3
      if "debug" in variants:
        c.total_steps = 4
        c.batch_size = 8
      return c
""")


@pytest.fixture
def config_file(tmp_path):
  path = tmp_path / "demo.py"
  path.write_text(CONFIG_PY)
  return str(path)


def test_load_with_arg_and_overrides(config_file):
  config = vconfig.load_config(
    f"{config_file}:debug",
    ["optim.lr=0.5", "--config.model.variant=S/16", "checkpoint.keep=5"],
  )
  assert config.total_steps == 4 and config.batch_size == 8
  assert config.optim.lr == 0.5 and config.model.variant == "S/16"
  assert config.checkpoint.keep == 5
  assert vconfig.load_config(config_file).total_steps == 100
  with pytest.raises(AttributeError):
    config.new_key = 1  # locked


def test_load_errors_say_what_is_wrong(config_file, tmp_path):
  with pytest.raises(KeyError) as e:
    vconfig.load_config(config_file, ["model.nmae=x"])
  assert str(e.value).startswith("unknown config key 'model.nmae' (--config.")
  assert e.value.hint.startswith("did you mean model.name? 'model' has: act, ")
  with pytest.raises(
    errors.UnknownKeyError, match=r"unknown config key 'btach_size'"
  ) as e:
    vconfig.load_config(config_file, ["btach_size=4"])
  assert e.value.hint.startswith("did you mean batch_size? the top level has: ")
  with pytest.raises(KeyError, match=r"'seed' is a int, not a config section"):
    vconfig.load_config(config_file, ["seed.x=1"])
  # A value of the wrong type: the key, its type and an example.
  for override, expected in (
    (
      "total_steps=1.5",
      "total_steps takes an integer, e.g. --config.total_steps=100",
    ),
    (
      "data.hflip=yes",
      "data.hflip takes a number, e.g. --config.data.hflip=0.5",
    ),
    (
      "data.allow_pickle=yes",
      "data.allow_pickle takes true or false, e.g. "
      "--config.data.allow_pickle=true",
    ),
    (
      "data.crop_scale=big",
      "data.crop_scale takes numbers separated by "
      "commas, e.g. --config.data.crop_scale=0.5,1.0",
    ),
  ):
    with pytest.raises(errors.ConfigError) as e:
      vconfig.load_config(config_file, [override])
    assert str(e.value) == f"{config_file}: --config.{override}: {expected}"
    assert e.value.exit_code == errors.EXIT_USAGE
  assert vconfig.load_config(
    config_file, ["data.crop_scale=(0.3,1)"]
  ).data.crop_scale == (0.3, 1.0)
  with pytest.raises(FileNotFoundError, match="nope.py"):
    vconfig.load_config("nope.py:debug")
  with pytest.raises(errors.ConfigError, match="unknown variant 'large'") as e:
    vconfig.load_config(f"{config_file}:large")
  assert e.value.exit_code == errors.EXIT_USAGE
  # Mistakes in the file itself: the file and line, no traceback.
  broken = tmp_path / "broken.py"
  where = re.escape(str(broken))
  broken.write_text(CONFIG_PY.replace("arg=None):", "arg=None)"))
  with pytest.raises(errors.ConfigError, match=rf"^{where}:4: expected ':'$"):
    vconfig.load_config(str(broken))
  broken.write_text(CONFIG_PY.replace("= 1e-3", "= c.optim.lr_max"))
  with pytest.raises(
    errors.ConfigError, match=rf"^{where}:10: AttributeError: .*lr_max"
  ):
    vconfig.load_config(str(broken))


def test_variants_are_named_once_for_every_recipe():
  assert recipe.variants(None, ("debug",)) == set()
  assert recipe.variants(
    "labels,cpu",
    ("captions", "labels", "cpu"),
    exclusive=("captions", "labels"),
  ) == {"labels", "cpu"}
  with pytest.raises(
    ValueError,
    match=r"^unknown variant 'dbug'; known "
    r"variants: :debug, :lavila \(join several with commas, "
    r"e.g. :debug,lavila\)$",
  ):
    recipe.variants("dbug", ("debug", "lavila"))
  with pytest.raises(
    ValueError,
    match="variants captions and labels exclude "
    "each other; known variants: :captions, :labels, :cpu",
  ):
    recipe.variants(
      "captions,labels",
      ("captions", "labels", "cpu"),
      exclusive=("captions", "labels"),
    )


def test_load_boolean_override(config_file):
  assert (
    vconfig.load_config(
      config_file, ["--noconfig.eval.save_embeddings"]
    ).eval.save_embeddings
    is False
  )
  assert (
    vconfig.load_config(
      config_file, ["--config.init_allow_pickle=true"]
    ).init_allow_pickle
    is True
  )
  assert vconfig.load_config(config_file).init_allow_pickle is False


def test_the_model_frames_and_size_are_the_data_keys(config_file, tmp_path):
  config = vconfig.load_config(
    config_file, ["data.num_frames=8", "data.size=32"]
  )
  assert (config.model.num_frames, config.model.image_size) == (8, 32)
  config = vconfig.load_config(config_file, ["model.num_frames=4"])
  assert config.data.num_frames == config.model.num_frames == 4
  vconfig.validate(config, num_devices=8)
  # The saved config holds the values (config.json, checkpoint metadata).
  assert config.to_dict()["model"]["num_frames"] == 4
  saved = json.loads(open(rundir.write_config(config, tmp_path)).read())
  assert (saved["model"]["num_frames"], saved["model"]["image_size"]) == (
    4,
    224,
  )


def test_validate_accepts_good_config(config_file):
  vconfig.validate(vconfig.load_config(config_file), num_devices=8)


@pytest.mark.parametrize(
  "overrides, message",
  [
    (
      ["batch_size=20"],
      r"'batch_size' = 20 is not divisible by the 8 devices; use a multiple of 8",
    ),
    (
      ["accum_steps=3"],
      r"'batch_size' = 32 is not divisible by 'accum_steps' = 3",
    ),
    (
      ["accum_steps=8"],
      r"'batch_size' = 32 / 'accum_steps' = 8 = 4 is not divisible "
      r"by the 8 devices; use a multiple of 64",
    ),
    (
      ["data.num_frames=15"],
      r"'data.num_frames' = 15 is not divisible by 'model.tubelet' = 2",
    ),
    (
      ["data.size=200"],
      r"'data.size' = 200 is not divisible by the patch "
      r"size 16 of 'model.variant' = 'B/16'",
    ),
    (
      ["model.name=clip"],
      r"'model.name' = 'clip' but 'task' = 'mae' trains "
      r"a 'videomae' model",
    ),
    (["total_steps=0"], r"'total_steps' = 0 must be a positive integer"),
    (
      ["data.num_frames=1000000000000", "batch_size=0"],
      r"'data.num_frames' = 1000000000000 is out of range: integer settings "
      r"are at most 2147483647 \(2\*\*31 - 1\)\n.*'batch_size' = 0 must be "
      r"at least 1",
    ),
    (
      ["data.num_frames=8192"],
      r"one clip of 'data.num_frames' = 8192 frames at 'data.size' = 224 is "
      r"1.1 GiB of frames \(8192 x 224 x 224 x 3 bytes\); a clip is at most "
      r"1 GiB",
    ),
    (
      ["model.mask_ratio=1.0", "unmask_fraction=1.5"],
      r"'unmask_fraction' = 1.5 must be a fraction in \[0, 1\]\n.*"
      r"'model.mask_ratio' = 1.0 must be in \[0, 1\)",
    ),
    (
      ["task=contrastiv"],
      r"'task' = 'contrastiv' is not one of \[.*\]; did you "
      r"mean 'contrastive'\?",
    ),
    (
      ["model.remat=ful"],
      r"'model.remat' = 'ful' is not one of \['none', "
      r"'full', .*\]; did you mean 'full'\?",
    ),
  ],
)
def test_validate_reports_what_to_change(config_file, overrides, message):
  config = vconfig.load_config(config_file, overrides)
  with pytest.raises(ValueError, match=message):
    vconfig.validate(config, num_devices=8)


def test_validate_names_both_keys_of_a_pair_that_disagrees():
  config = defaults.base_config("contrastive")
  config.total_steps = 10
  config.data.num_frames = 8
  # A model section built on its own holds its own frames and size.
  config.model = defaults.model_config("clip")
  config.eval.sets.short = defaults.eval_set("jsonl", num_frames=4)
  with pytest.raises(ValueError) as e:
    vconfig.validate(config, num_devices=1)
  problems = str(e.value).splitlines()[1:]
  assert problems == [
    "  - 'model.num_frames' = 16 but 'data.num_frames' = 8: the model's is "
    "the data's; set 'data.num_frames' alone",
    "  - 'eval.sets.short.data.num_frames' = 4 but 'data.num_frames' = 8: "
    "the model is the run's",
  ]


def test_validate_lists_all_missing_required_keys():
  config = ml_collections.ConfigDict({"seed": 1, "checkpoint": {}})
  with pytest.raises(ValueError) as e:
    vconfig.validate(config, num_devices=1)
  text = str(e.value)
  for key in (
    "'total_steps' is missing",
    "'checkpoint.every_steps' is missing",
    "'log.every_steps' is missing",
  ):
    assert key in text
  assert "'seed'" not in text


def test_validate_names_the_keys_a_config_lacks():
  config = defaults.base_config("classification")
  config.total_steps = 10
  del config.augment["mixup_alpha"]
  del config.model["num_classes"]
  config.eval.sets.other = ml_collections.ConfigDict({"data": {"root": ""}})
  with pytest.raises(
    ValueError,
    match=r"missing keys: augment.mixup_alpha, "
    r"model.num_classes, eval.sets.other.data.eval_annotations, "
    r"eval.sets.other.data.format, eval.sets.other.relevancy, "
    r"eval.sets.other.sentences; build the config on "
    r"vidjax.config.defaults.base_config\('classification'\)",
  ):
    vconfig.validate(config, num_devices=1)


def test_epochs_become_steps_of_the_training_records():
  config = defaults.base_config("contrastive")
  config.batch_size = 16
  config.total_steps = 5  # Replaced: total_epochs is set.
  config.total_epochs = 2.5
  config.eval.every_epochs = 1.0
  vconfig.validate(config, num_devices=8)
  vconfig.epochs_to_steps(config, train_clips=100)  # 6 steps per epoch.
  assert (
    config.total_steps,
    config.eval.every_steps,
    config.checkpoint.every_steps,
  ) == (15, 6, 1000)


def test_config_json_is_written_whole(config_file, tmp_path):
  config = ml_collections.ConfigDict({"a": 1, "fn": len})
  path = rundir.write_config(vconfig.load_config(config_file), tmp_path / "run")
  saved = json.loads(open(path).read())
  assert saved["checkpoint"]["every_steps"] == 50
  assert saved["model"]["name"] == "videomae"
  assert (
    "len"
    in json.loads(open(rundir.write_config(config, tmp_path)).read())["fn"]
  )


def test_changes():
  old = {
    "model": {"width": 64, "text": {"vocab_size": 0}},
    "crop": [0.5, 1.0],
    "lr": 1.0,
  }
  new = {
    "model": {"width": 96, "text": {"vocab_size": 0}},
    "crop": (0.5, 1.0),
    "seed": 1,
    "lr": 1.0,
  }
  assert vconfig.changes(old, new) == [
    ("model.width", 64, 96),
    ("seed", None, 1),
  ]
