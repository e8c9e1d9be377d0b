"""Training objectives: one module per task, all with the same small API.

A task module defines:
  NEEDS_TEXT: bool                      whether batches carry `tokens`
  augment_config(config, *, train) -> dict
      `vidjax.augment.make_augment` keys for training, or for evaluation
      (normalisation, and what the model needs, e.g. VideoMAE's mask)
  loss(model, batch, key, config) -> (loss, metrics)
      training loss on an augmented global batch; `key` feeds drop path;
      elements with `batch['valid']` False must change neither
  eval_outputs(model, batch) -> dict[str, Array]
      per-example outputs [B, ...] of an evaluation batch, and the batch's
      labels the metrics need
  eval_metrics(outputs, config) -> dict[str, float]
      metrics from the outputs of the whole evaluation set, concatenated on
      the host together with the batch's `index`, `view` and `valid`
and, for video-text retrieval (`vidjax.eval_sets` calls them when present):
  eval_captions(config) -> [(id, text)] | None
      texts embedded once each, apart from the clips (EK-100's captions);
      their embeddings reach `eval_metrics` as `outputs['caption_emb']`
      [M, D]
  embeddings(outputs, config) -> dict
      the vectors behind the metrics, for `eval.save_embeddings`
"""
from __future__ import annotations

import importlib
import types

TASKS = ("contrastive", "mae", "classification", "retrieval")


def get_task(name: str) -> types.ModuleType:
  if name not in TASKS:
    raise ValueError(f"config.task={name!r} is not one of {TASKS}")
  return importlib.import_module(f"vidjax.tasks.{name}")
