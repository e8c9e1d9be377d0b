"""Evaluation sets: what a run evaluates, under which metric names, and how.

A run evaluates its main set, `data.eval_annotations` with the `eval` keys
(`relevancy`, `sentences`, `save_embeddings`, `batch_size`), under `eval/`
(`eval/t2v_r1`, `eval/mAP_avg`, `eval/top1`, `eval/skipped`, ...), and each
named set of `eval.sets` under `eval/<name>/` (e.g. `eval/ek100_mir/mAP_avg`,
zero-shot EK-100 multi-instance retrieval during Ego4D pretraining; a set
with `eval.kind` is one of the field's benchmarks, `vidjax.evaluation.scoreboard`). A named
set is a ConfigDict of `data` (the `config.data` keys it changes: format,
root, eval_annotations, ...; an empty value keeps the run's) and `eval`
keys; the rest is the run's:

    c.eval.sets.ek100_mir = defaults.eval_set("ek100_mir")  # vidjax.config.defaults

A named set whose `data.eval_annotations` is unset is skipped (said at
start-up); the main set is skipped when `data.eval_annotations` is unset and
named sets exist. `eval.save_embeddings=True` writes, at each evaluation,
`WORKDIR/embeddings/step_<N>.npz` (named sets:
`WORKDIR/embeddings/<name>/step_<N>.npz`) with `video` float32[clips, D] and
`text` float32[texts, D], L2-normalised (the vectors the similarities come
from), and `video_ids` / `text_ids` (narration ids, or the rows' video ids
where the format has none) in the order of the annotation and sentence
files; for a benchmark set (`eval.kind`), `text` is its class embeddings (or
EgoMCQ's queries) and `text_ids` the class ids (or question numbers).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from absl import logging
import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np

from vidjax import config as config_lib, sharding, tasks
from vidjax.base import errors, rundir, stopping, whole_files
from vidjax.data import pipeline
from vidjax.data.annotations import annotation_files, ek100
from vidjax.evaluation import scoreboard

# `eval` keys that a named set may not change: they belong to the run.
_RUN_KEYS = ("sets", "every_steps")


@dataclasses.dataclass(frozen=True)
class EvalSet:
  """One evaluation set: its name ('' for the main set), metric prefix and
  the run config with the set's keys applied."""

  name: str
  prefix: str
  config: ml_collections.ConfigDict


def _resolve(config, name: str, spec) -> ml_collections.ConfigDict:
  resolved, spec = config_lib.copy(config), config_lib.copy(spec)
  with resolved.unlocked():
    resolved.eval.sets = ml_collections.ConfigDict()
    for key, value in spec.items():
      if key == "data":
        unknown = sorted(set(value.keys()) - set(config.data.keys()))
        if unknown:
          raise errors.ConfigError(
            f"eval.sets.{name}.data: unknown data keys "
            f"{unknown}; see config.data"
          )
        # '' keeps the run's value (e.g. a set in the run's own chunks).
        resolved.data.update({k: v for k, v in value.items() if v != ""})
      elif key in _RUN_KEYS:
        raise errors.ConfigError(
          f"eval.sets.{name}.{key}: set it in eval, for the run"
        )
      else:
        resolved.eval[key] = value
  return resolved


def eval_sets(config: ml_collections.ConfigDict) -> list[EvalSet]:
  """The run's evaluation sets, main set first (see the module docstring)."""
  named = dict(config.eval.sets)
  sets = []
  if config.data.eval_annotations or not named:
    sets.append(EvalSet("", "eval/", config))
  for name, spec in named.items():
    if spec.data.eval_annotations:
      sets.append(EvalSet(name, f"eval/{name}/", _resolve(config, name, spec)))
  return sets


def required_paths(
  config: ml_collections.ConfigDict, needs_text: bool
) -> list[str]:
  """Config keys of the files a run reads: training data and every set's
  (with no set to evaluate, the one the run's best checkpoint is kept by)."""
  keys = ["data.root", "data.train_annotations"]
  keys += ["data.vocab"] if needs_text else []
  keys += [
    f"data.{k}"
    for k in ("train_sentences", "train_relevancy")
    if config.data[k]
  ]
  for es in eval_sets(config):
    base = f"eval.sets.{es.name}." if es.name else ""
    spec = config.eval.sets[es.name] if es.name else config.eval
    if es.name and spec.data.root:
      keys.append(f"{base}data.root")
    keys.append(
      f"{base}data.eval_annotations" if es.name else "data.eval_annotations"
    )
    keys += [
      base + k if es.name else f"eval.{k}"
      for k in ("relevancy", "sentences")
      if spec[k]
    ]
    keys += [  # A benchmark's class names, and a set's own action CSVs.
      f"{base}data.{k}"
      for k in ("classes", "train_annotations")
      if (spec.data.get(k) if es.name else k == "classes" and config.data[k])
    ]
  if config.eval.sets and not eval_sets(config):
    # Every named set skipped and no main one: nothing would evaluate. The
    # set the run keeps its best checkpoint by is named (else the first).
    best = config.checkpoint.get("best_metric") or ""
    name = next(
      (n for n in config.eval.sets if best.startswith(f"eval/{n}/")),
      next(iter(config.eval.sets)),
    )
    keys.append(f"eval.sets.{name}.data.eval_annotations")
  return keys


def check_files(config: ml_collections.ConfigDict) -> None:
  """Start-up checks beyond existence: relevancy shapes against the clips
  and captions they go with; says which named sets are skipped."""
  skipped = [
    name
    for name, spec in config.eval.sets.items()
    if not spec.data.eval_annotations
  ]
  if skipped:  # One line, however many.
    logging.warning(
      "evaluation set%s %s skipped: set eval.sets.NAME.data."
      "eval_annotations (and its other files) to run one",
      "s" if len(skipped) > 1 else "",
      ", ".join(skipped),
    )
  for es in eval_sets(config):
    c = es.config
    if c.eval.kind:
      scoreboard.check_set(c, es.name, config.eval.sets.get(es.name))
    if not c.eval.relevancy:
      continue
    matrix = ek100.load_relevancy(
      c.eval.relevancy, allow_pickle=c.data.allow_pickle, mmap=True
    )
    clips = len(
      annotation_files.load_annotations(c.data, c.data.eval_annotations)
    )
    sentences = c.eval.sentences or None
    captions = (
      len(ek100.load_ek100_mir_sentences(sentences)) if sentences else clips
    )
    ek100.check_relevancy_shape(
      matrix,
      c.eval.relevancy,
      clips,
      c.data.eval_annotations,
      captions,
      sentences,
    )


def encode_tokens(run, tokens: np.ndarray) -> np.ndarray:
  """float32[B, D] text embeddings of one global batch of tokens
  int32[B, L] (the same on every process)."""
  local = len(tokens) // jax.process_count()
  first = jax.process_index() * local
  batch = tokens[first : first + local]
  glob = sharding.host_to_global_batch({"tokens": batch}, run.mesh)
  emb = run.steps.text(run.state["params"], run.rest, glob["tokens"])
  return np.asarray(
    multihost_utils.process_allgather(emb, tiled=True), np.float32
  )


def embed_texts(run, texts: list[str], batch_size: int) -> np.ndarray:
  """float32[len(texts), D] text embeddings, `batch_size` texts per step."""
  tokens = run.tokenizer(texts)
  pad = -len(tokens) % batch_size
  tokens = np.concatenate(
    [tokens, np.zeros((pad, tokens.shape[1]), tokens.dtype)]
  )
  out = [
    encode_tokens(run, tokens[start : start + batch_size])
    for start in range(0, len(tokens), batch_size)
  ]
  return np.concatenate(out)[: len(texts)]


def _record_ids(records) -> np.ndarray:
  """Each clip's id in its annotation file: the narration id (EK-100),
  else its video's id (clips of one video share it)."""
  if records and "narration_id" in records[0].extra:
    return np.array([r.extra["narration_id"] for r in records])
  return np.array([r.video_id for r in records])


def save_embeddings(
  path: Path, emb: dict, video_ids: np.ndarray, text_ids: np.ndarray
) -> None:
  """Writes the npz of the module docstring (whole, process 0)."""
  if jax.process_index() != 0:
    return
  path.parent.mkdir(parents=True, exist_ok=True)
  with whole_files.replaced(path, "wb") as f:  # savez(name) appends '.npz'.
    np.savez(
      f,
      video=emb["video"],
      text=emb["text"],
      video_ids=video_ids,
      text_ids=text_ids,
    )


def evaluate_set(run, es: EvalSet, step: int) -> dict[str, float]:
  """Evaluates one set with the run's current parameters; prefixed metrics."""
  config = es.config
  records = annotation_files.load_annotations(
    config.data, config.data.eval_annotations
  )
  batches = pipeline.make_pipeline(
    config,
    run.mesh,
    train=False,
    batch_size=config.eval.batch_size,
    tokenizer=run.tokenizer,
    records=records,
  )
  outputs = []
  # After a signal, a wait longer than the stall warnings' period is on
  # stuck data: given up (one process; several wait for each other's batch).
  give_up = jax.process_count() == 1 and stopping.requested
  patience_s = config.data.stall_warn_s
  try:
    while True:
      try:
        batch = batches.next_batch(interrupt=give_up, patience_s=patience_s)
      except StopIteration:
        break
      if batch is None:
        raise stopping.EvaluationStopped(
          config.data.eval_annotations, patience_s, stopping.signal_name()
        )
      out = run.steps.eval(run.state["params"], run.rest, batch)
      outputs.append(
        jax.tree.map(
          np.asarray, multihost_utils.process_allgather(out, tiled=True)
        )
      )
    skipped = batches.skipped
  finally:  # The workers stop (killed, after a wait given up).
    batches.close()
  merged = {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}
  if config.eval.kind:  # The field's benchmarks, by their definitions.
    metrics, emb = scoreboard.evaluate(
      config,
      records,
      merged,
      encode_tokens=functools.partial(encode_tokens, run),
      tokenizer=run.tokenizer,
    )
    if config.eval.save_embeddings and run.workdir:
      save_embeddings(
        rundir.embeddings(run.workdir, es.name, step),
        emb,
        _record_ids(records)[emb["index"]],
        emb["text_ids"],
      )
    return {
      **{f"{es.prefix}{k}": v for k, v in metrics.items()},
      f"{es.prefix}skipped": skipped,
    }
  retrieval = isinstance(run.task, tasks.RetrievalTask)
  captions = run.task.eval_captions(config) if retrieval else None
  if captions:
    merged["caption_emb"] = embed_texts(
      run, [t for _, t in captions], config.eval.batch_size
    )
  metrics = run.task.eval_metrics(merged, config)
  if config.eval.save_embeddings and run.workdir and retrieval:
    emb = run.task.embeddings(merged, config)
    video_ids = _record_ids(records)[emb["index"]]
    text_ids = np.array([i for i, _ in captions]) if captions else video_ids
    save_embeddings(
      rundir.embeddings(run.workdir, es.name, step), emb, video_ids, text_ids
    )
  return {
    **{f"{es.prefix}{k}": v for k, v in metrics.items()},
    f"{es.prefix}skipped": skipped,
  }


def evaluate(run, config: ml_collections.ConfigDict) -> dict[str, float]:
  """Runs every evaluation set once with the run's current parameters.

  Args:
    run: a `startup.Run` (its state, steps, mesh, task, tokenizer, workdir).
    config: the run config.

  Returns:
    The `eval/...` metrics of every set (see the module docstring).
  """
  step, metrics = int(run.state["step"]), {}
  for es in eval_sets(config):
    metrics.update(evaluate_set(run, es, step))
  return metrics
