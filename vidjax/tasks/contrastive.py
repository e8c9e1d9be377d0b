"""Video-text contrastive pretraining (CLIP-style, as LaViLa/AVION on Ego4D).

Loss: symmetric InfoNCE over the GLOBAL batch (`losses.contrastive_loss`):
under `jax.jit` with batch-sharded inputs the similarity matrix spans every
device's embeddings, so each clip sees all B - 1 negatives.
Eval: video<->text recall@K on the evaluation clips (views averaged), with
the chance level; EK-100 MIR mAP / nDCG when `config.eval.relevancy` names a
relevancy matrix.
"""
from __future__ import annotations

import numpy as np

from vidjax import evaluate as eval_lib
from vidjax.data import annotations
from vidjax.tasks import common, losses

NEEDS_TEXT = True


def augment_config(config) -> dict:
  return dict(config.get("augment", {}))


def loss(model, batch, key, config):
  del config
  video = model.encode_video(batch["video"], deterministic=False, rngs=key)
  text = model.encode_text(batch["tokens"])
  value, metrics = losses.contrastive_loss(video, text, model.logit_scale[...])
  return value, metrics


def eval_outputs(model, batch):
  return {"video_emb": model.encode_video(batch["video"]),
          "text_emb": model.encode_text(batch["tokens"])}


def similarity(outputs) -> np.ndarray:
  """Cosine similarity float[N, N] of clips (views averaged) and their texts."""
  out = common.valid_outputs(outputs)
  ids, video = common.mean_by_index(common.l2_normalize(out["video_emb"]),
                                    out["index"])
  _, text = common.mean_by_index(out["text_emb"], out["index"])
  return common.l2_normalize(video) @ common.l2_normalize(text).T, ids


def evaluate(outputs, config) -> dict[str, float]:
  sim, ids = similarity(outputs)
  metrics = eval_lib.retrieval_recall(sim)
  relevancy = config.get("eval", {}).get("relevancy", "")
  if relevancy:
    matrix = annotations.load_relevancy(
        relevancy, allow_pickle=config.data.allow_pickle)
    metrics.update(eval_lib.ek100_mir_metrics(sim, matrix[np.ix_(ids, ids)]))
  return metrics
