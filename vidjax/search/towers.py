"""The model an INDEX is embedded and searched with: a CLIP's two towers,
parameters only, over all local devices.

`load_encoder(config)` loads `config.init_from`'s weights (a vidjax run,
AVION's or OpenAI's CLIP); `make_encoder` wraps parameters already in memory
(a run in a notebook).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from absl import logging
import numpy as np

from vidjax import config as config_lib
from vidjax.base import errors, rundir

TEXT_BATCH = 64  # Texts per text-tower call (a multiple of the devices).


@dataclasses.dataclass
class Encoder:
  """A CLIP's two towers with loaded weights.

  `video(uint8[B, T, H, W, 3] global array)` -> float32[B, D] and
  `encode_tokens(int32[B, L])` -> float32[B, D] give L2-normalised
  embeddings (texts: through `vidjax.evaluation.zeroshot` with `tokenizer`).
  """

  config: object
  mesh: object
  params: object
  rest: object
  tokenizer: object
  video_fn: object
  text_fn: object
  description: str

  def video(self, video):
    return self.video_fn(self.params, self.rest, video)

  @property
  def text_batch(self) -> int:
    """Texts per text-tower call: a multiple of the local devices."""
    devices = len(self.mesh.local_devices)
    return devices * max(1, TEXT_BATCH // devices)

  def encode_tokens(self, tokens: np.ndarray) -> np.ndarray:
    """int32[B, L] tokens (B a multiple of the local devices) ->
    float32[B, D], L2-normalised."""
    from vidjax import sharding

    glob = sharding.host_to_global_batch({"tokens": tokens}, self.mesh)
    return np.asarray(self.text_fn(self.params, self.rest, glob["tokens"]))


def _run_vocab(init_from: str) -> str:
  """The vocabulary a vidjax run trained with (its config.json), or '' (CLIP's,
  which vidjax ships).

  A run moved or copied elsewhere names a path that may be gone: a file of
  the run itself (the synthetic corpus's vocabulary) is found in the run
  where it is now, CLIP's file by its name is vidjax's own copy.
  """
  from vidjax.data import tokenizer

  here = Path(init_from)
  for directory in (here, *list(here.parents)[:3]):
    try:
      saved = json.loads((directory / rundir.CONFIG_JSON).read_text())
    except (OSError, ValueError):
      continue
    vocab = (saved.get("data") or {}).get("vocab") or ""
    if not vocab or os.path.exists(vocab):
      return vocab
    parts = Path(vocab).parts
    for i in range(1, len(parts)):  # Its path inside the run, longest first.
      moved = directory.joinpath(*parts[i:])
      if moved.is_file():
        return os.fspath(moved)
    return "" if Path(vocab).name == tokenizer.CLIP_VOCAB_FILE else vocab
  return ""


def load_encoder(config) -> Encoder:
  """The recipe's CLIP with `config.init_from`'s weights (refusing what
  cannot embed: not a CLIP, no weights, weights that do not fit).

  `data.vocab` unset with a vidjax run as weights: the run's vocabulary.
  The config is completed in place (absolute paths, the weights' facts).
  """
  from flax import nnx
  import jax

  from vidjax import models, sharding
  from vidjax.checkpoints import resume
  from vidjax.data import checks
  from vidjax.weights import facts, init_from

  if config.model.name != "clip":
    raise errors.ConfigError(
      f"model.name={config.model.name!r}: embedding for search needs a "
      "video-text model",
      hint="use a CLIP recipe (configs/demo.py, clip_vitb16_ego4d.py, "
      "ek100_mir_ft.py, own_videos.py)",
    )
  if not config.init_from:
    raise errors.ConfigError(
      "config.init_from is unset: there are no weights to embed with",
      hint="pass --config.init_from=WEIGHTS (a vidjax workdir, AVION's or "
      "OpenAI's CLIP)",
    )
  config_lib.make_paths_absolute(config)
  if not config.data.vocab:
    config.data.vocab = _run_vocab(config.init_from)
  if jax.process_count() > 1:
    raise errors.ConfigError("vidjax.embed runs in one process")
  config_lib.validate(config, jax.device_count())
  source = resume.read_init_from(
    config.init_from, allow_pickle=config.init_allow_pickle
  )
  facts.settle(config, source)
  tokenizer = checks.load_tokenizer(config)
  mesh = sharding.make_mesh(fsdp=config.fsdp)

  def build():
    return models.build_model(config.model, rngs=nnx.Rngs(config.seed))

  _, params, rest = nnx.split(nnx.eval_shape(build), nnx.Param, ...)
  (params, rest), _ = sharding.create_sharded_state(
    lambda: tuple(nnx.split(build(), nnx.Param, ...)[1:]),
    mesh,
    shardings=sharding.param_shardings((params, rest), mesh),
  )
  params, report = init_from.load_params(
    params, config.model, source, keep_init=tuple(config.init_keep)
  )
  logging.info("weights: %s", report.summary())
  untrained = [
    n for n in report.fresh if not n.endswith(("temporal_pos", "logit_scale"))
  ]
  if untrained:  # E.g. OpenAI's 512-d projections under a 256-d recipe.
    logging.warning(
      "%d parameters are not in the weights and keep their random initial "
      "values (%s): the embeddings mean little. Set the config to the "
      "weights' model (e.g. --config.model.embed_dim=512 for OpenAI's CLIP)",
      len(untrained),
      ", ".join(untrained[:3]),
    )
  return make_encoder(config, mesh, params, rest, tokenizer, source.description)


def make_encoder(
  config, mesh, params, rest, tokenizer, description: str = ""
) -> Encoder:
  """An `Encoder` of `config.model` with these parameters and buffers (as
  a run's state holds them, on their shardings): the towers jitted."""
  from flax import nnx
  import jax
  import jax.numpy as jnp

  from vidjax import augment, models, sharding, tasks
  from vidjax.tasks import losses

  graphdef = nnx.graphdef(
    nnx.eval_shape(
      lambda: models.build_model(config.model, rngs=nnx.Rngs(config.seed))
    )
  )
  task = tasks.get_task(config.task)
  dtype = jnp.dtype(models.resolve_dtype(config.model.dtype)).name
  normalise = augment.make_augment(
    {"dtype": dtype, **task.augment_config(config, train=False)}
  )

  def video_fn(params, rest, video):
    video = normalise({"video": video}, jax.random.key(0))["video"]
    emb = nnx.merge(graphdef, params, rest).encode_video(video)
    return losses.l2_normalize(emb.astype(jnp.float32))

  def text_fn(params, rest, tokens):
    emb = nnx.merge(graphdef, params, rest).encode_text(tokens)
    return losses.l2_normalize(emb.astype(jnp.float32))

  shardings = jax.tree.map(lambda x: x.sharding, (params, rest))
  batch = sharding.batch_sharding(mesh)
  return Encoder(
    config,
    mesh,
    params,
    rest,
    tokenizer,
    jax.jit(video_fn, in_shardings=(*shardings, batch), out_shardings=batch),
    jax.jit(text_fn, in_shardings=(*shardings, batch), out_shardings=batch),
    description,
  )
