"""EPIC-Kitchens-100 multi-instance retrieval fine-tuning.

Loss (`config.loss.name`, `LOSSES`) over the global batch's cosine
similarities, over the valid elements, the whole batch's under
`accum_steps` > 1 too (as contrastive: GradCache):
  max_margin            AVION's max-margin ranking loss
                        (`losses.max_margin_ranking_loss`, margin 0.2)
  relevancy_max_margin  the same, each margin scaled by the positive pair's
                        relevancy (`losses.relevancy_max_margin_loss`)
  sms                   SMS (`losses.sms_loss`, `loss.margin`,
                        `loss.threshold`)
The last two read the relevancy of every in-batch pair (video i, the caption
of item j), computed from the classes the batch carries
(`batch_relevancy`): EPIC's training matrix exactly, as checked at start-up
(`vidjax.data.annotations.ek100_classes`), unquantised.
Each training clip's caption is drawn among those of relevancy > 0.1 to it
when `data.train_relevancy` is set (`vidjax.data.annotations.ek100`).
Eval: as contrastive (recall@K, and mAP / nDCG against the captions of
`eval.sentences` with the clips x captions `eval.relevancy`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vidjax.data.annotations import ek100_classes
from vidjax.tasks import contrastive, losses

augment_config = contrastive.augment_config
eval_outputs = contrastive.eval_outputs
eval_captions = contrastive.eval_captions
embeddings = contrastive.embeddings
eval_metrics = contrastive.eval_metrics


embed = contrastive.embed


def batch_relevancy(batch) -> jax.Array:
  """float32[B, B]: the relevancy of video i to the caption of item j, from
  the batch's classes (`verb`, `nouns`, `caption_verb`, `caption_nouns`)."""
  return ek100_classes.class_relevancy(
    batch["verb"],
    batch["nouns"],
    batch["caption_verb"],
    batch["caption_nouns"],
    xp=jnp,
  )


def _max_margin(similarity, batch, loss):
  return losses.max_margin_ranking_loss(
    similarity, margin=loss.margin, valid=batch.get("valid")
  )


def _relevancy_max_margin(similarity, batch, loss):
  return losses.relevancy_max_margin_loss(
    similarity, batch_relevancy(batch), loss.margin, valid=batch.get("valid")
  )


def _sms(similarity, batch, loss):
  return losses.sms_loss(
    similarity,
    batch_relevancy(batch),
    margin=loss.margin,
    threshold=loss.threshold,
    valid=batch.get("valid"),
  )


# `config.loss.name` -> f(similarity, batch, config.loss).
LOSSES = {
  "max_margin": _max_margin,
  "relevancy_max_margin": _relevancy_max_margin,
  "sms": _sms,
}


def embedded_loss(model, embeddings, batch, config):
  del model
  video = losses.l2_normalize(embeddings["video"])
  text = losses.l2_normalize(embeddings["text"])
  return LOSSES[config.loss.name](video @ text.T, batch, config.loss), {}


def loss(model, batch, key, config):
  return embedded_loss(model, embed(model, batch, key, config), batch, config)
