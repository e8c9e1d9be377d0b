"""EPIC-Kitchens-100 multi-instance retrieval fine-tuning (AVION's recipe).

Loss: max-margin ranking over the global batch's cosine similarities
(`losses.max_margin_ranking_loss`, margin `config.loss.margin`, 0.2), over
the valid elements, the whole batch's under `accum_steps` > 1 too (as
contrastive: GradCache). Each training clip's caption is drawn among those of
relevancy > 0.1 to it when `data.train_relevancy` is set (`vidjax.data.annotations.ek100`).
Eval: as contrastive (recall@K, and mAP / nDCG against the captions of
`eval.sentences` with the clips x captions `eval.relevancy`).
"""

from __future__ import annotations

from vidjax.tasks import contrastive, losses

augment_config = contrastive.augment_config
eval_outputs = contrastive.eval_outputs
eval_captions = contrastive.eval_captions
embeddings = contrastive.embeddings
eval_metrics = contrastive.eval_metrics


embed = contrastive.embed


def embedded_loss(model, embeddings, batch, config):
  del model
  video = losses.l2_normalize(embeddings["video"])
  text = losses.l2_normalize(embeddings["text"])
  value = losses.max_margin_ranking_loss(
    video @ text.T, margin=config.loss.margin, valid=batch.get("valid")
  )
  return value, {}


def loss(model, batch, key, config):
  return embedded_loss(model, embed(model, batch, key, config), batch, config)
