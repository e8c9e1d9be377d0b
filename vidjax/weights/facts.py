"""What weights were trained with, and the run's model that follows from it.

A checkpoint fixes more than its tensors: the activation, each tower's
LayerNorm eps, the pooling, whether there is a class token (the backbone)
and, for a video-text model, its temperature. The same tensors under other
values compute another function (AVION's CLIP under QuickGELU: embeddings
1-2% off; under LayerNorm eps 1e-5 instead of its vision tower's 1e-6, up
to 0.5%). Every source (`sources`, `vidjax.checkpoints.resume.read_start`)
records its facts as {key of `config.model`: (value, why)}; `settle` sets
the run's `config.model` from them before the model is built:

* a key not given on the command line (`config.overrides`) takes the
  source's value; each change is logged at start-up and written to
  WORKDIR/init_from.json;
* a key given on the command line with another value stops the run,
  naming both, unless `config.init_allow_mismatch=True` (then a warning:
  the loaded model computes another function than the one trained).

What each source fixes, read from each codebase's model code:

  source                      act         ln_eps (vision / text)  pool
  OpenAI CLIP (the .pt)       quick_gelu  1e-5 / 1e-5             token
  OpenCLIP (OpenAI's names)   unknown     1e-5 / 1e-5             token
  Hugging Face CLIP           its config.json (a save_pretrained  token
                              directory; a file alone: unknown)
  AVION CLIP, classifier      gelu        1e-6 / 1e-5             token
  VideoMAE (original, AVION)  gelu        1e-6                    fc_norm: mean,
                                                                  else token
  Hugging Face VideoMAE       config.json (VideoMAEConfig's   use_mean_pooling:
                              defaults: gelu, 1e-12); fc_norm mean, else token
                              and the decoder's last
                              LayerNorm: eps 1e-5 (PyTorch's)
  a vidjax run                its saved config

A video-text CLIP (AVION's, a vidjax run's) also fixes the temperature
(`logit_scale_init`); an image CLIP's is not carried over (AVION starts
video-text training at 1/0.07). Projection sizes are not facts: a
projection of another size than `model.embed_dim` starts fresh
(`init_from.fill`).
"""

from __future__ import annotations

import json
import math

from absl import logging

from vidjax.base import errors
from vidjax.models import transformer
from vidjax.models.videomae import BACKBONE_STYLES

# In the order they are settled: the backbone decides the others' defaults.
FACT_KEYS = (
  "backbone",
  "pool",
  "act",
  "ln_eps",
  "head_ln_eps",
  "decoder.ln_eps",
  "text.ln_eps",
  "logit_scale_init",
)

Facts = dict  # {key of config.model: (value, why)}

# Where `python -m vidjax.export` records a model's facts in what it writes
# (a safetensors header's metadata, AVION's `args`, a Hugging Face
# config.json), and the run's config (its own safetensors format): the
# export's facts win over its format's usual ones.
RECORDED = "vidjax_facts"
RUN_CONFIG = "vidjax_config"

_CLIP = {
  "backbone": ("clip", "a CLIP: class token, learned positions"),
  "pool": ("token", "CLIP normalises its class token"),
}
_LN_1E5 = "PyTorch's LayerNorm default"


def clip_facts(
  origin: str,
  *,
  temperature: float | None = None,
  hf_config: dict | None = None,
  where: str = "config.json",
) -> Facts:
  """The facts of a CLIP (or AVION's CLIP classifier).

  Args:
    origin: 'openai' (the TorchScript release), 'openclip' (OpenAI's names
      otherwise), 'hugging_face' or 'avion'.
    temperature: the source's log-space logit scale, for a video CLIP.
    hf_config: a Hugging Face directory's config.json.
    where: its path, for messages.
  """
  facts = dict(_CLIP)
  if origin in ("openai", "openclip"):
    facts.update({"ln_eps": (1e-5, _LN_1E5), "text.ln_eps": (1e-5, _LN_1E5)})
    if origin == "openai":
      facts["act"] = ("quick_gelu", "OpenAI's CLIP computes QuickGELU")
  elif origin == "avion":
    facts.update(
      {
        "act": (
          "gelu",
          "AVION's towers compute exact GELU (nn.GELU; its "
          "use_quick_gelu flag is ignored)",
        ),
        "ln_eps": (1e-6, "AVION's vision tower: LayerNorm(eps=1e-6)"),
        "text.ln_eps": (1e-5, "AVION's text tower: " + _LN_1E5),
      }
    )
    if temperature is not None:
      facts["logit_scale_init"] = (temperature, "the video CLIP's temperature")
  elif origin == "hugging_face" and hf_config:
    towers = {k: hf_config.get(f"{k}_config") or {} for k in ("vision", "text")}
    acts = {k: c.get("hidden_act", "quick_gelu") for k, c in towers.items()}
    if len(set(acts.values())) > 1:
      raise errors.InitFromError(
        f"{where}: hidden_act {acts['vision']!r} (vision) and "
        f"{acts['text']!r} (text): vidjax's CLIP has one activation"
      )
    why = "config.json"
    facts.update(
      {
        "act": (_activation(acts["vision"], where), why),
        "ln_eps": (towers["vision"].get("layer_norm_eps", 1e-5), why),
        "text.ln_eps": (towers["text"].get("layer_norm_eps", 1e-5), why),
      }
    )
  return facts


def videomae_facts(
  origin: str,
  *,
  finetuned: bool,
  mean_pooling: bool,
  hf_config: dict | None = None,
  where: str = "config.json",
  decoder: bool = False,
) -> Facts:
  """The facts of a VideoMAE.

  Args:
    origin: 'original' (also AVION's), or 'hugging_face'.
    finetuned: a classifier (its pooling is fixed; an original pretraining's
      is not: fine-tuning starts its pooled norm fresh; a Hugging Face
      encoder's is its config's, as VideoMAEForVideoClassification's from it).
    mean_pooling: VideoMAE's use_mean_pooling=True: a classifier's fc_norm,
      or a Hugging Face encoder without its last LayerNorm.
    hf_config: a Hugging Face directory's config.json (None: a file alone,
      VideoMAEConfig's defaults, which the hub's models keep).
    where: its path, for messages.
    decoder: a pretraining with its decoder (its last LayerNorm's eps).
  """
  facts = {
    "backbone": ("videomae", "a VideoMAE: no class token, sinusoid positions")
  }
  if finetuned or origin == "hugging_face":
    facts["pool"] = (
      ("mean", "fc_norm: VideoMAE use_mean_pooling=True")
      if mean_pooling
      else (
        "token",
        "no fc_norm: use_mean_pooling=False normalises "
        "every token and classifies the first",
      )
    )
  if origin != "hugging_face":
    facts.update(
      act=("gelu", "VideoMAE's nn.GELU"),
      ln_eps=(1e-6, "VideoMAE's LayerNorm(eps=1e-6)"),
    )
    if decoder:
      facts["decoder.ln_eps"] = (1e-6, "VideoMAE's LayerNorm(eps=1e-6)")
    return facts
  why = (
    "config.json"
    if hf_config is not None
    else "VideoMAEConfig's default (no config.json: give the save_pretrained "
    "directory to read it)"
  )
  hf_config = hf_config or {}
  act = _activation(hf_config.get("hidden_act", "gelu"), where)
  facts.update(
    {"act": (act, why), "ln_eps": (hf_config.get("layer_norm_eps", 1e-12), why)}
  )
  if mean_pooling:
    facts["head_ln_eps"] = (1e-5, "Hugging Face's fc_norm: " + _LN_1E5)
  if decoder:
    facts["decoder.ln_eps"] = (1e-5, "Hugging Face's decoder norm: " + _LN_1E5)
  return facts


def run_facts(saved: dict, temperature: float | None = None) -> Facts:
  """The facts of a vidjax run, from the config saved with its checkpoint.

  Args:
    saved: the run's config as a dict ({} if none was saved: no facts).
    temperature: its trained logit scale, if it learned one.
  """
  model = saved.get("model") or {}
  name = model.get("name")
  backbone = (
    model.get("backbone")
    if name == "classifier"
    else ({"clip": "clip", "videomae": "videomae", "umt": "videomae"}.get(name))
  )
  if backbone not in BACKBONE_STYLES:
    return {}
  style = BACKBONE_STYLES[backbone]
  why = "the run's config"
  # Runs saved before a key existed had the style's value built in.
  facts = {
    "backbone": (backbone, why),
    "act": (model.get("act") or style["act"], why),
    "ln_eps": (model.get("ln_eps") or style["ln_eps"], why),
  }
  if name == "clip":
    facts.update(
      {
        "pool": ("token", why),
        "text.ln_eps": ((model.get("text") or {}).get("ln_eps", 1e-5), why),
        "logit_scale_init": (
          model.get("logit_scale_init") if temperature is None else temperature,
          why,
        ),
      }
    )
  elif name == "classifier":
    facts["pool"] = (
      model.get("pool") or ("token" if style["class_token"] else "mean"),
      why,
    )
    if model.get("head_ln_eps") is not None:
      facts["head_ln_eps"] = (model["head_ln_eps"], why)
  elif name == "videomae":
    eps = (model.get("decoder") or {}).get("ln_eps")
    facts["decoder.ln_eps"] = (facts["ln_eps"][0] if eps is None else eps, why)
  return {k: v for k, v in facts.items() if v[0] is not None}


def recorded(extras: dict) -> Facts:
  """The facts `vidjax.export` recorded in a file, from what it holds besides
  tensors (`tensor_io.load_state_dict`'s `extras`, a config.json): {} if
  none."""
  blob = extras.get(RECORDED) or (extras.get("args") or {}).get(RECORDED)
  if isinstance(blob, str):
    blob = json.loads(blob)
  why = "recorded by vidjax.export from the run's config"
  return {key: (value, why) for key, value in (blob or {}).items()}


def _activation(name: str, where: str) -> str:
  if name not in transformer.ACTIVATIONS:
    raise errors.InitFromError(
      f"{where}: hidden_act {name!r} is not one vidjax computes "
      f"({sorted(transformer.ACTIVATIONS)})"
    )
  return name


def _has(model, key: str) -> bool:
  section, _, name = key.rpartition(".")
  return (not section or section in model) and name in (
    model[section] if section else model
  )


def _get(model, key: str):
  section, _, name = key.rpartition(".")
  return (model[section] if section else model)[name]


def effective(model, key: str):
  """What `config.model`'s `key` means: '' and None resolved (the
  classifier's backbone defaults)."""
  value = _get(model, key)
  if key == "decoder.ln_eps":
    return effective(model, "ln_eps") if value is None else value
  if model.name == "clip" or key not in (
    "act",
    "ln_eps",
    "head_ln_eps",
    "pool",
  ):
    return value
  style = BACKBONE_STYLES[model.get("backbone") or "videomae"]
  if key == "head_ln_eps":
    return effective(model, "ln_eps") if value is None else value
  if key == "pool":
    return value or ("token" if style["class_token"] else "mean")
  default = style[key if key == "ln_eps" else "act"]
  return default if value in (None, "") else value


def _show(value) -> str:
  return f"{value:.6g}" if isinstance(value, float) else repr(value)


def _same(a, b) -> bool:
  if isinstance(a, float) and isinstance(b, float):
    return math.isclose(a, b, rel_tol=1e-6)
  return a == b


def settle(config, source) -> list[str]:
  """Sets `config.model` from what `source` was trained with.

  Args:
    config: the run's config (changed in place); `overrides` names the keys
      given on the command line, `init_allow_mismatch` keeps them.
    source: an `init_from.Source` (or None: nothing to settle).

  Returns:
    One line per key changed: 'model.act: 'quick_gelu' -> 'gelu' (why)'.

  Raises:
    errors.InitFromError: keys given on the command line that disagree with
      the source, each with both values (unless init_allow_mismatch).
  """
  if source is None:
    return []
  model, given = config.model, set(config.get("overrides", ()))
  changes, conflicts = [], []
  for key in FACT_KEYS:
    if key not in source.facts or not _has(model, key):
      continue
    value, why = source.facts[key]
    current = effective(model, key)
    if _same(current, value):
      continue
    if f"model.{key}" in given:
      conflicts.append(
        f"model.{key}={_show(current)} but the weights "
        f"computed {_show(value)} ({why})"
      )
    else:
      changes.append(
        (key, value, f"model.{key}: {_show(current)} -> {_show(value)} ({why})")
      )
  if conflicts:
    message = (
      f"{source.description} was trained with another model than "
      "the command line sets:\n  " + "\n  ".join(conflicts)
    )
    if not config.get("init_allow_mismatch", False):
      raise errors.InitFromError(
        message,
        hint="leave these keys unset to take the weights' values, "
        "or add --config.init_allow_mismatch=True to keep yours (the model "
        "then computes another function than the one trained)",
      )
    logging.warning("%s\n  (kept: config.init_allow_mismatch=True)", message)
  for key, value, _ in changes:
    section, _, name = key.rpartition(".")
    (model[section] if section else model)[name] = value
  return [line for _, _, line in changes]
