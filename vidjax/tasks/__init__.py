"""Training objectives: one module per task, each a `Task`.

`get_task(config.task)` returns the task's module (`contrastive`,
`retrieval`, `mae`, `classification`, `distill`); a module is a `Task`
by having the functions below (a `typing.Protocol`, checked by type
checkers and by
`isinstance`). Contrastive tasks are also `EmbeddingTask`s (their loss
couples the batch: `vidjax.steps` accumulates it by GradCache). Retrieval
tasks are also `RetrievalTask`s, which
`vidjax.evaluation.eval_sets` asks for the captions and the embeddings. Whether a
task's batches carry text is `vidjax.config.defaults.needs_text(task)`.
"""

from __future__ import annotations

from collections.abc import Mapping
import importlib
from typing import Any, Protocol, runtime_checkable

import jax
import ml_collections
import numpy as np

from vidjax.config import defaults

Batch = Mapping[str, jax.Array]


@runtime_checkable
class Task(Protocol):
  """What the train and eval steps call (`vidjax.steps`, `vidjax.evaluation.eval_sets`)."""

  def augment_config(
    self, config: ml_collections.ConfigDict, *, train: bool
  ) -> dict[str, Any]:
    """`vidjax.augment.make_augment` keys for training, or for evaluation
    (the normalisation, and what the model needs, e.g. VideoMAE's mask)."""

  def loss(
    self,
    model: Any,
    batch: Batch,
    key: jax.Array,
    config: ml_collections.ConfigDict,
  ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(loss, metrics) on an augmented global batch; `key` feeds drop path.
    Elements with `batch['valid']` False change neither."""

  def eval_outputs(self, model: Any, batch: Batch) -> dict[str, jax.Array]:
    """Per-example outputs [B, ...] of an evaluation batch, and the
    batch's labels the metrics need."""

  def eval_metrics(
    self, outputs: dict[str, np.ndarray], config: ml_collections.ConfigDict
  ) -> dict[str, float]:
    """Metrics from the outputs of the whole evaluation set, concatenated on
    the host together with the batches' `index`, `view` and `valid`."""


@runtime_checkable
class EmbeddingTask(Task, Protocol):
  """A task whose loss couples the batch's examples (contrastive, MIR): it
  is a loss over the whole batch's embeddings, which `vidjax.steps`
  computes in microbatches under `accum_steps` > 1 (GradCache). Its `loss`
  is `embedded_loss(model, embed(model, batch, key, config), batch, config)`.
  """

  def embed(
    self,
    model: Any,
    batch: Batch,
    key: jax.Array,
    config: ml_collections.ConfigDict,
  ) -> dict[str, jax.Array]:
    """Training embeddings {name: [b, D]} of an augmented (micro)batch;
    each row depends on its own example only."""

  def embedded_loss(
    self,
    model: Any,
    embeddings: dict[str, jax.Array],
    batch: Batch,
    config: ml_collections.ConfigDict,
  ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(loss, metrics) of the whole batch's embeddings [B, D]; the model
    for the parameters the loss itself learns (CLIP's temperature)."""


@runtime_checkable
class RetrievalTask(Task, Protocol):
  """A video-text task: texts embedded apart, and embeddings to save."""

  def eval_captions(
    self, config: ml_collections.ConfigDict
  ) -> list[tuple[str, str]] | None:
    """(id, text) of the texts embedded once each, apart from the clips
    (EK-100's captions), or None; their embeddings reach `eval_metrics` as
    `outputs['caption_emb']` [M, D]."""

  def embeddings(
    self, outputs: dict[str, np.ndarray], config: ml_collections.ConfigDict
  ) -> dict[str, np.ndarray]:
    """The vectors behind the metrics, for `eval.save_embeddings`."""


def get_task(name: str) -> Task:
  """The task module of `config.task` (one of `defaults.TASKS`)."""
  if name not in defaults.TASKS:
    raise ValueError(f"config.task={name!r} is not one of {defaults.TASKS}")
  return importlib.import_module(f"vidjax.tasks.{name}")
