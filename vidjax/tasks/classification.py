"""Action classification fine-tuning (Kinetics, EPIC-Kitchens-100).

Loss: softmax cross-entropy on mixup/cutmix soft targets with label smoothing
(from `augment`), or on hard labels. Eval: top-1 / top-5 with multi-view
averaging of softmax scores; for EK-100 actions also verb and noun accuracy,
marginalised from the action scores.
"""
from __future__ import annotations

import numpy as np

from vidjax import evaluate as eval_lib
from vidjax.tasks import common, losses

NEEDS_TEXT = False


def augment_config(config) -> dict:
  return {**dict(config.get("augment", {})),
          "num_classes": {"label": config.model.num_classes}}


def loss(model, batch, key, config):
  del config
  logits = model(batch["video"], deterministic=False, rngs=key)
  # Soft targets (mixup/cutmix, label smoothing) when augment made them.
  value = losses.softmax_cross_entropy(
      logits, batch.get("label_target", batch["label"]))
  return value, {"accuracy": (logits.argmax(-1) == batch["label"]).mean()}


def eval_outputs(model, batch):
  return {"logits": model(batch["video"])}


def evaluate(outputs, config) -> dict[str, float]:
  out = common.valid_outputs(outputs)
  ids, probs = eval_lib.average_views_by_id(out["logits"], out["index"])
  first = {int(i): k for k, i in reversed(list(enumerate(out["index"])))}
  labels = np.array([out["label"][first[int(i)]] for i in ids])
  metrics = eval_lib.topk_accuracy(probs, labels, ks=(1, 5))
  if "verb" in out and "noun" in out and config.get("eval", {}).get(
      "action_map", None):
    verbs = np.array([out["verb"][first[int(i)]] for i in ids])
    nouns = np.array([out["noun"][first[int(i)]] for i in ids])
    pairs = config.eval.action_map  # action id -> (verb, noun)
    verb_p, noun_p = eval_lib.marginalize_action_scores(
        probs, pairs, int(verbs.max()) + 1, int(nouns.max()) + 1)
    metrics.update(eval_lib.topk_accuracy(verb_p, verbs, ks=(1, 5),
                                          prefix="verb_"))
    metrics.update(eval_lib.topk_accuracy(noun_p, nouns, ks=(1, 5),
                                          prefix="noun_"))
  return metrics
