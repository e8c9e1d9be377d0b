"""EPIC-Kitchens-100 multi-instance retrieval fine-tuning (AVION's recipe).

Loss: max-margin ranking over the global batch's cosine similarities
(`losses.max_margin_ranking_loss`, margin `config.loss.margin`, 0.2).
Eval: as contrastive (recall@K, and mAP / nDCG with a relevancy matrix).
"""
from __future__ import annotations

from vidjax.tasks import contrastive, losses

NEEDS_TEXT = True
augment_config = contrastive.augment_config
eval_outputs = contrastive.eval_outputs
evaluate = contrastive.evaluate


def loss(model, batch, key, config):
  video = losses.l2_normalize(
      model.encode_video(batch["video"], deterministic=False, rngs=key))
  text = losses.l2_normalize(model.encode_text(batch["tokens"]))
  margin = config.get("loss", {}).get("margin", 0.2)
  value = losses.max_margin_ranking_loss(video @ text.T, margin=margin)
  return value, {}
