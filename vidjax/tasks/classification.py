"""Action classification fine-tuning (Kinetics, EPIC-Kitchens-100).

Loss: softmax cross-entropy on mixup/cutmix soft targets with label smoothing
(from `augment`), or on hard labels, averaged over the valid examples. A
probe (`model.probe`) trains on its frozen encoder's features, cached once
(`vidjax.evaluation.feature_cache`), without augmentation.
Eval: top-1 (and top-5 with more than 5 classes) and mean class accuracy
(AVION's) with multi-view averaging of softmax scores, and the chance level
`chance_top1` (1 / classes); for EK-100 actions also verb and noun
accuracies, from the action scores marginalised as AVION does, each with its
own chance level.
"""

from __future__ import annotations

import numpy as np

from vidjax.data.annotations import annotation_files
from vidjax.tasks import common, losses, metrics as metrics_lib

# The labels an evaluation keeps: EK-100 actions also score verb and noun.
LABELS = ("label", "verb", "noun")


def augment_config(config, *, train: bool) -> dict:
  augment = dict(config.augment)
  if not train or config.model.get("probe"):  # A probe: cached features.
    return common.eval_augment(augment)
  return {
    **augment,
    **common.repeat_keys(config),
    "num_classes": {"label": config.model.num_classes},
  }


def loss(model, batch, key, config):
  del config
  if "features" in batch:  # A probe's cached features of the frozen encoder.
    logits = model.classify(batch["features"], deterministic=False, rngs=key)
  else:
    logits = model(batch["video"], deterministic=False, rngs=key)
  valid = batch.get("valid")
  # Soft targets (mixup/cutmix, label smoothing) when augment made them.
  value = losses.softmax_cross_entropy(
    logits, batch.get("label_target", batch["label"]), valid=valid
  )
  return value, {
    "accuracy": losses.masked_mean(logits.argmax(-1) == batch["label"], valid)
  }


def eval_outputs(model, batch):
  return {
    "logits": model(batch["video"]),
    **{k: batch[k] for k in LABELS if k in batch},
  }


def eval_metrics(outputs, config) -> dict[str, float]:
  out = common.valid_outputs(outputs)
  # Views averaged as probabilities, as AVION and VideoMAE do.
  ids, probs = metrics_lib.average_views(
    metrics_lib.softmax(out["logits"]), out["index"]
  )
  first = {int(i): k for k, i in reversed(list(enumerate(out["index"])))}
  labels = np.array([out["label"][first[int(i)]] for i in ids])
  metrics = _accuracy(probs, labels)
  if (
    "verb" in out
    and "noun" in out
    and config.data.format == "ek100_cls"
    and config.data.label == "action"
  ):
    action_map = annotation_files.ek100_actions(config.data)
    pairs = np.zeros((len(action_map), 2), np.int64)  # action -> (verb, noun)
    for pair, action in action_map.items():
      pairs[action] = pair
    verb_p, noun_p = metrics_lib.marginalize_action_scores(
      probs[:, : len(pairs)], pairs
    )  # Heads may be wider than the map.
    for name, p in (("verb", verb_p), ("noun", noun_p)):
      truth = np.array([out[name][first[int(i)]] for i in ids])
      if p.shape[1] > truth.max():
        metrics.update(_accuracy(p, truth, prefix=f"{name}_"))
  return metrics


def _accuracy(probs, labels, prefix: str = "") -> dict[str, float]:
  """Top-1, top-5 where there are more than 5 classes (else it is 1 or
  nearly), mean class accuracy (AVION's), and the chance level of top-1
  (guessing: 1 / classes)."""
  classes = probs.shape[1]
  metrics = metrics_lib.topk_accuracy(
    probs, labels, ks=(1, 5) if classes > 5 else (1,), prefix=prefix
  )
  metrics[f"{prefix}mean_class_acc"] = metrics_lib.mean_class_accuracy(
    probs, labels
  )
  metrics[f"chance_{prefix}top1"] = 1.0 / classes
  return metrics
