"""Tests for vidjax.config with a small config file written in tmp_path."""

import json
import textwrap

import pytest

from vidjax import config as vconfig, errors

CONFIG_PY = textwrap.dedent('''
    import ml_collections

    def get_config(arg=None):
      c = ml_collections.ConfigDict()
      c.seed = 0
      c.total_steps = 100
      c.batch_size = 32
      c.accum_steps = 1
      c.lr = 1e-3
      c.checkpoint = dict(every_steps=50, keep=2)
      c.log = dict(every_steps=10)
      c.data = dict(num_frames=16)
      c.model = dict(tubelet=2, name="vit_b16")
      c.task = "contrastive"
      c.flag = True
      if arg == "debug":
        c.total_steps = 4
        c.batch_size = 8
      elif arg:
        raise ValueError(f"unknown variant {arg!r}")
      return c
''')


@pytest.fixture
def config_file(tmp_path):
  path = tmp_path / "demo.py"
  path.write_text(CONFIG_PY)
  return str(path)


def test_load_with_arg_and_overrides(config_file):
  config = vconfig.load_config(f"{config_file}:debug",
                               ["lr=0.5", "--config.model.name=vit_l14",
                                "checkpoint.keep=5"])
  assert config.total_steps == 4 and config.batch_size == 8
  assert config.lr == 0.5 and config.model.name == "vit_l14"
  assert config.checkpoint.keep == 5
  assert vconfig.load_config(config_file).total_steps == 100
  with pytest.raises(AttributeError):
    config.new_key = 1  # locked


def test_load_errors_say_what_is_wrong(config_file):
  with pytest.raises(KeyError) as e:
    vconfig.load_config(config_file, ["model.nmae=x"])
  assert str(e.value).startswith("unknown config key 'model.nmae' (--config.")
  assert e.value.hint == "did you mean model.name? 'model' has: name, tubelet"
  with pytest.raises(errors.UnknownKeyError, match=r"unknown config key 'btach_size'") as e:
    vconfig.load_config(config_file, ["btach_size=4"])
  assert e.value.hint.startswith("did you mean batch_size? the top level has: ")
  with pytest.raises(KeyError, match=r"'lr' is a float, not a config section"):
    vconfig.load_config(config_file, ["lr.x=1"])
  with pytest.raises(ValueError, match="total_steps=1.5: invalid literal for int"):
    vconfig.load_config(config_file, ["total_steps=1.5"])
  with pytest.raises(FileNotFoundError, match="nope.py"):
    vconfig.load_config("nope.py:debug")
  with pytest.raises(errors.ConfigError, match="unknown variant 'large'") as e:
    vconfig.load_config(f"{config_file}:large")
  assert e.value.exit_code == errors.EXIT_USAGE


def test_load_boolean_override(config_file):
  assert vconfig.load_config(config_file, ["--noconfig.flag"]).flag is False
  assert vconfig.load_config(config_file, ["--config.flag=false"]).flag is False
  assert vconfig.load_config(config_file).flag is True


def test_validate_accepts_good_config(config_file):
  vconfig.validate(vconfig.load_config(config_file), num_devices=8)


@pytest.mark.parametrize("overrides, message", [
    (["batch_size=20"],
     r"'batch_size' = 20 is not divisible by the 8 devices; use a multiple of 8"),
    (["accum_steps=3"], r"'batch_size' = 32 is not divisible by 'accum_steps' = 3"),
    (["accum_steps=8"], r"'batch_size' = 32 / 'accum_steps' = 8 = 4 is not divisible "
                        r"by the 8 devices; use a multiple of 64"),
    (["data.num_frames=15"],
     r"'data.num_frames' = 15 is not divisible by 'model.tubelet' = 2"),
    (["total_steps=0"], r"'total_steps' = 0 must be a positive integer"),
    (["task=contrastiv"], r"'task' = 'contrastiv' is not one of \[.*\]; did you "
                          r"mean 'contrastive'\?"),
])
def test_validate_reports_what_to_change(config_file, overrides, message):
  config = vconfig.load_config(config_file, overrides)
  with pytest.raises(ValueError, match=message):
    vconfig.validate(config, num_devices=8)


def test_validate_lists_all_missing_required_keys():
  import ml_collections
  config = ml_collections.ConfigDict({"seed": 1, "checkpoint": {}})
  with pytest.raises(ValueError) as e:
    vconfig.validate(config, num_devices=1)
  text = str(e.value)
  for key in ("'total_steps' is missing", "'checkpoint.every_steps' is missing",
              "'log.every_steps' is missing"):
    assert key in text
  assert "'seed'" not in text


def test_lock_and_save_config_json(config_file, tmp_path):
  import ml_collections
  config = ml_collections.ConfigDict({"a": 1, "fn": len})
  assert vconfig.lock(config) is config
  with pytest.raises(AttributeError):
    config.b = 2
  path = vconfig.save_config_json(vconfig.load_config(config_file), tmp_path / "run")
  saved = json.loads(open(path).read())
  assert saved["checkpoint"] == {"every_steps": 50, "keep": 2}
  assert saved["model"]["name"] == "vit_b16"
  assert "len" in json.loads(open(vconfig.save_config_json(config, tmp_path)).read())["fn"]


def test_changes():
  old = {"model": {"width": 64, "text": {"vocab_size": 0}}, "crop": [0.5, 1.0],
         "lr": 1.0}
  new = {"model": {"width": 96, "text": {"vocab_size": 0}}, "crop": (0.5, 1.0),
         "seed": 1, "lr": 1.0}
  assert vconfig.changes(old, new) == [("model.width", 64, 96), ("seed", None, 1)]
