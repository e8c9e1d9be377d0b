"""Action classification fine-tuning (Kinetics, EPIC-Kitchens-100).

Loss: softmax cross-entropy on mixup/cutmix soft targets with label smoothing
(from `augment`), or on hard labels, averaged over the valid examples.
Eval: top-1 / top-5 with multi-view averaging of softmax scores; for EK-100
actions also verb and noun accuracy, marginalised from the action scores.
"""
from __future__ import annotations

import numpy as np

from vidjax import evaluate as eval_lib
from vidjax.data import annotations
from vidjax.tasks import common, losses

NEEDS_TEXT = False


def augment_config(config) -> dict:
  return {**dict(config.augment),
          "num_classes": {"label": config.model.num_classes}}


def loss(model, batch, key, config):
  del config
  logits = model(batch["video"], deterministic=False, rngs=key)
  valid = batch.get("valid")
  # Soft targets (mixup/cutmix, label smoothing) when augment made them.
  value = losses.softmax_cross_entropy(
      logits, batch.get("label_target", batch["label"]), valid=valid)
  return value, {"accuracy": losses.masked_mean(
      logits.argmax(-1) == batch["label"], valid)}


def eval_outputs(model, batch):
  return {"logits": model(batch["video"])}


def evaluate(outputs, config) -> dict[str, float]:
  out = common.valid_outputs(outputs)
  ids, probs = eval_lib.average_views_by_id(out["logits"], out["index"])
  first = {int(i): k for k, i in reversed(list(enumerate(out["index"])))}
  labels = np.array([out["label"][first[int(i)]] for i in ids])
  metrics = eval_lib.topk_accuracy(probs, labels, ks=(1, 5))
  if "verb" in out and "noun" in out and config.data.format == "ek100_cls" \
      and config.data.label == "action":
    action_map = annotations.ek100_action_map(
        [p for p in (config.data.train_annotations,
                     config.data.eval_annotations) if p])
    pairs = np.zeros((len(action_map), 2), np.int64)  # action -> (verb, noun)
    for pair, action in action_map.items():
      pairs[action] = pair
    verb_p, noun_p = eval_lib.marginalize_action_scores(
        probs[:, :len(pairs)], pairs)  # Heads may be wider than the map.
    for name, p in (("verb", verb_p), ("noun", noun_p)):
      truth = np.array([out[name][first[int(i)]] for i in ids])
      if p.shape[1] > truth.max():
        metrics.update(eval_lib.topk_accuracy(p, truth, ks=(1, 5),
                                              prefix=f"{name}_"))
  return metrics
