"""Loading a config: "file.py[:arg]" with `--config.KEY=VALUE` overrides.

Mistakes raise `vidjax.base.errors.ConfigError`s that name the key (with the
known ones and close matches) or the value, and the line of the user's config
file that raised.
"""

from __future__ import annotations

from collections.abc import Sequence
import contextlib
import difflib
import importlib.util
import os
import re
import traceback

from absl import flags
import ml_collections
from ml_collections import config_flags

from vidjax.base import errors, internals
from vidjax.config.keys import OVERRIDES_KEY, lookup


def _unknown_key(config, dotted: str) -> tuple[str, str] | None:
  """(message, hint) for the first missing part of `dotted`; None if it exists."""
  node, walked = config, []
  for part in dotted.split("."):
    if not isinstance(node, (ml_collections.ConfigDict, dict)):
      return (
        f"'{'.'.join(walked)}' is a {type(node).__name__}, not a config "
        f"section, so '{dotted}' does not exist",
        "",
      )
    if part not in node:
      prefix = "".join(f"{w}." for w in walked)
      keys = sorted(node.keys())
      close = [prefix + k for k in difflib.get_close_matches(part, keys, n=3)]
      where = f"'{prefix[:-1]}'" if walked else "the top level"
      hint = f"did you mean {' or '.join(close)}? " if close else ""
      return (
        f"unknown config key '{prefix}{part}'",
        f"{hint}{where} has: {', '.join(keys)}",
      )
    node = node[part]
    walked.append(part)
  return None


def _parse_bool(value: str) -> bool:
  if value.lower() not in ("true", "false", "t", "f", "1", "0"):
    raise ValueError(value)
  return value.lower() in ("true", "t", "1")


def _parse_numbers(value: str) -> list[float]:
  return [float(v) for v in value.strip("()[] ").split(",") if v.strip()]


def _expected(current):
  """(the type in words, an example, a parser raising ValueError) for a
  key's current value; None when any string will do."""
  if isinstance(current, bool):
    return "true or false", "true", _parse_bool
  if isinstance(current, int):
    return "an integer", str(current), int
  if isinstance(current, float):
    return "a number", f"{current:g}", float
  if (
    isinstance(current, tuple)
    and current
    and all(isinstance(v, (int, float)) for v in current)
  ):
    return (
      "numbers separated by commas",
      ",".join(map(str, current)),
      _parse_numbers,
    )
  return None


def _wrong_type(config, args: Sequence[str]) -> str | None:
  """'--config.batch_size=eight: batch_size takes an integer, e.g.
  --config.batch_size=64' for the first override its key's type refuses."""
  for arg in args:
    key, equals, value = arg.removeprefix("--config.").partition("=")
    expected = _expected(lookup(config, key, None)) if equals else None
    if expected:
      words, example, parse = expected
      try:
        parse(value)
      except ValueError:
        return f"{arg}: {key} takes {words}, e.g. --config.{key}={example}"
  return None


@contextlib.contextmanager
def _user_code(path: str, spec: str):
  """What the user's config file raises: a ConfigError at its line."""
  try:
    yield
  except errors.UserError:
    raise
  except ValueError as e:  # The config's own message, e.g. an unknown variant.
    raise errors.ConfigError(
      str(e) if path in str(e) else f"{spec}: {e}"
    ) from e
  except SyntaxError as e:
    raise errors.ConfigError(f"{e.filename}:{e.lineno}: {e.msg}") from e
  except Exception as e:  # Any, in user code.
    lines = [
      f.lineno
      for f in traceback.extract_tb(e.__traceback__)
      if os.path.abspath(f.filename) == os.path.abspath(path)
    ]
    where = f"{path}:{lines[-1]}" if lines else spec
    raise errors.ConfigError(f"{where}: {type(e).__name__}: {e}") from e


def _load_module(path: str, spec: str):
  """Imports the config file `path` as a fresh module."""
  name = "vidjax_config_" + re.sub(r"\W", "_", os.path.basename(path)[:-3])
  module_spec = importlib.util.spec_from_file_location(name, path)
  if module_spec is None:
    raise errors.ConfigError(
      f"{spec}: not a Python file",
      hint="configs are .py files with get_config()",
    )
  module = importlib.util.module_from_spec(module_spec)
  with _user_code(path, spec):
    module_spec.loader.exec_module(module)
  if not callable(getattr(module, "get_config", None)):
    raise errors.ConfigError(f"{path} has no get_config() function")
  return module


def cpu_variant(spec: str) -> str | None:
  """The recipe's variant made for a CPU: `spec` with `cpu` added to its
  `:arg` (configs/own_videos.py) or else `debug`, the first its get_config
  takes; None if it takes neither or `spec` names one already."""
  path, _, arg = spec.partition(":")
  named = [v.strip() for v in arg.split(",") if v.strip()]
  if {"cpu", "debug"} & set(named):
    return None
  module = _load_module(path, spec)
  for extra in ("cpu", "debug"):
    candidate = ",".join(named + [extra])
    try:
      module.get_config(candidate)
    except Exception:
      continue  # Not one of its variants.
    return f"{path}:{candidate}"
  return None


def split_overrides(args: list[str]) -> tuple[list[str], list[str]]:
  """(`--config.KEY[=VALUE]` overrides, the other arguments).

  `--config.KEY VALUE` (a space instead of '=') is joined into one.
  """
  overrides, rest, i = [], [], 0
  while i < len(args):
    arg = args[i]
    if arg.startswith(("--config.", "--noconfig.")):
      if (
        "=" not in arg
        and i + 1 < len(args)
        and not args[i + 1].startswith("--")
      ):
        arg, i = f"{arg}={args[i + 1]}", i + 1
      overrides.append(arg)
    else:
      rest.append(arg)
    i += 1
  return overrides, rest


def _override_args(overrides: Sequence[str]) -> list[str]:
  """'a.b=v', '--config.a.b=v', '--noconfig.flag' -> ml_collections flags."""
  args = []
  for o in overrides:
    o = o.removeprefix("--")
    no = "no" if o.startswith("noconfig.") else ""
    args.append(
      f"--{no}config.{o.removeprefix('noconfig.').removeprefix('config.')}"
    )
  return args


def load_config(
  spec: str, overrides: Sequence[str] = ()
) -> ml_collections.ConfigDict:
  """Loads a config exactly as `--config=SPEC --config.KEY=VALUE ...` would.

  Args:
    spec: "path/to/config.py" or "path/to/config.py:arg" (passed to
      `get_config(arg)`).
    overrides: "key.sub=value" strings (a leading "--config." is allowed;
      "--noconfig.key" sets a boolean to False); values are parsed with the
      type of the existing field.

  Returns:
    The locked `ConfigDict`: assigning a new key raises. Its `overrides`
    (where the config has that key) lists the keys the overrides set.

  Raises:
    errors.PathError: the file does not exist (a FileNotFoundError).
    errors.UnknownKeyError: an override names a key the config does not
      have (a KeyError; the message lists the known keys and close matches).
    errors.ConfigError: the file or its `get_config` raised (e.g. refused
      `arg`; named with the line), or an override's value does not parse
      as the field's type (a ValueError).
  """
  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    raise errors.PathError(
      f"config file {path!r} not found",
      hint="the shipped configs are in configs/*.py",
    )
  module = _load_module(path, spec)
  with _user_code(path, spec):
    config = module.get_config(arg) if arg else module.get_config()
  if not isinstance(config, ml_collections.ConfigDict):
    config = ml_collections.ConfigDict(config)
  args = _override_args(overrides)
  wrong = _wrong_type(config, args)
  if wrong:  # Said in the key's terms, not the parser's.
    raise errors.ConfigError(f"{spec}: {wrong}")
  argv = ["load_config"] + args
  flag_values = flags.FlagValues()
  try:
    config_flags.DEFINE_config_dict(
      "config", config, flag_values=flag_values, sys_argv=argv, lock_config=True
    )
    flag_values(argv)
  except (AttributeError, KeyError):
    for a in args:
      key = a.split("=", 1)[0].removeprefix("--no").removeprefix("--config.")
      unknown = _unknown_key(config, key)
      if unknown:
        raise errors.UnknownKeyError(
          f"{unknown[0]} ({a}, {spec})", hint=unknown[1]
        ) from None
    raise
  except (flags.Error, TypeError, ValueError) as e:
    raise errors.ConfigError(
      f"{spec}: {internals.absl_flag_error(e)}"
    ) from None
  config = flag_values.config
  if OVERRIDES_KEY in config:  # Whose values they are: see models/facts.py.
    config[OVERRIDES_KEY] = tuple(
      a.split("=", 1)[0]
      .removeprefix("--")
      .removeprefix("no")
      .removeprefix("config.")
      for a in args
    )
  return config
