"""Video-text contrastive pretraining (CLIP-style, as LaViLa/AVION on Ego4D).

Loss: symmetric InfoNCE over the GLOBAL batch (`losses.contrastive_loss`):
under `jax.jit` with batch-sharded inputs the similarity matrix spans every
device's embeddings, so each clip sees all B - 1 negatives; invalid elements
(`valid=False`: no clip could be read) are neither anchors nor negatives.

Eval: video<->text recall@K of the clips and their own narrations (views
averaged), with the chance level: `t2v_r1`, `v2t_r1`, `chance_r1`, ...
With `config.eval.relevancy`, EK-100 multi-instance retrieval `mAP_*` and
`nDCG_*` too: against the captions of `config.eval.sentences` (EK-100's
sentence CSV; the released relevancy is clips x captions), each embedded
once from its text, or, without a sentence file, against the clips' own
narrations (a square clips x clips relevancy).
"""

from __future__ import annotations

from absl import logging
import numpy as np

from vidjax.base import errors
from vidjax.data.annotations import ek100
from vidjax.tasks import common, losses, metrics as metrics_lib

RECALL_KS = (1, 5, 10)  # `metrics.retrieval_recall`'s.
_SAID_FEW: set[int] = set()  # Evaluation sizes whose R@K gap was said.


def augment_config(config, *, train: bool) -> dict:
  augment = dict(config.augment)
  return augment if train else common.eval_augment(augment)


def embed(model, batch, key, config):
  del config
  return {
    "video": model.encode_video(batch["video"], deterministic=False, rngs=key),
    "text": model.encode_text(batch["tokens"]),
  }


def embedded_loss(model, embeddings, batch, config):
  del config
  return losses.contrastive_loss(
    embeddings["video"],
    embeddings["text"],
    model.logit_scale[...],
    valid=batch.get("valid"),
  )


def loss(model, batch, key, config):
  return embedded_loss(model, embed(model, batch, key, config), batch, config)


def eval_outputs(model, batch):
  return {
    "video_emb": model.encode_video(batch["video"]),
    "text_emb": model.encode_text(batch["tokens"]),
  }


def eval_captions(config) -> list[tuple[str, str]] | None:
  """`(narration_id, text)` of `config.eval.sentences`, to embed apart."""
  sentences = config.eval.sentences
  return ek100.load_ek100_mir_sentences(sentences) if sentences else None


def embeddings(outputs, config) -> dict[str, np.ndarray]:
  """The L2-normalised vectors the retrieval metrics compare.

  Args:
    outputs: the evaluation outputs (per view: `video_emb`, `text_emb`,
      `index`, `valid`), plus `caption_emb` float[M, D] when
      `eval_captions(config)` gave captions.
    config: the run (or evaluation set) config.

  Returns:
    `video` float32[N, D]: each clip with a readable view, views averaged,
    in record order (`index` int[N] names the records); `text`
    float32[M, D]: the captions, or the clips' own narrations (row i goes
    with video i) without a sentence file; `own_text` float32[N, D]: the
    clips' own narrations.
  """
  del config
  captions = outputs.get("caption_emb")
  out = common.valid_outputs(
    {k: v for k, v in outputs.items() if k != "caption_emb"}
  )
  unit = losses.l2_normalize
  ids, video = metrics_lib.average_views(
    unit(out["video_emb"].astype(np.float64)), out["index"]
  )
  _, own_text = metrics_lib.average_views(out["text_emb"], out["index"])
  own_text = unit(own_text).astype(np.float32)
  text = (
    own_text
    if captions is None
    else unit(np.asarray(captions, np.float64)).astype(np.float32)
  )
  return {
    "video": unit(video).astype(np.float32),
    "text": text,
    "own_text": own_text,
    "index": ids,
  }


def similarity(video: np.ndarray, text: np.ndarray) -> np.ndarray:
  """float64[N, M] cosine similarity of normalised float32 embeddings."""
  return video.astype(np.float64) @ text.astype(np.float64).T


def _relevancy(config, ids: np.ndarray, num_texts: int) -> np.ndarray:
  """Relevancy of the evaluated clips (rows `ids`) to the texts (columns)."""
  path, sentences = config.eval.relevancy, config.eval.sentences
  matrix = ek100.load_relevancy(path, allow_pickle=config.data.allow_pickle)
  columns = np.arange(num_texts) if sentences else ids
  # The shapes were checked against the files at start-up (`eval_sets`);
  # this guards against files changed since.
  if (
    matrix.shape[0] <= ids.max()
    or matrix.shape[1] <= columns.max()
    or (sentences and matrix.shape[1] != num_texts)
  ):
    what = f"its {num_texts} captions" if sentences else "clips x clips"
    raise errors.DataFileError(
      f"{path} is {matrix.shape[0]} x {matrix.shape[1]}, which "
      f"does not fit {config.data.eval_annotations} and {what}"
    )
  return matrix[np.ix_(ids, columns)]


def eval_metrics(outputs, config) -> dict[str, float]:
  emb = embeddings(outputs, config)
  metrics = metrics_lib.retrieval_recall(
    similarity(emb["video"], emb["own_text"])
  )
  clips = len(emb["video"])
  if clips <= max(RECALL_KS) and clips not in _SAID_FEW:
    _SAID_FEW.add(clips)  # Once per size, not at every evaluation.
    left_out = [f"R@{k}" for k in RECALL_KS if 1 < k and k >= clips]
    logging.info(
      "eval: %d clips, so %s left out (every clip is among the top %d: "
      "1.0 for any model); more evaluation clips give them",
      clips,
      " and ".join(left_out),
      clips,
    )
  if config.eval.relevancy:
    relevancy = _relevancy(config, emb["index"], len(emb["text"]))
    metrics.update(
      metrics_lib.ek100_mir_metrics(
        similarity(emb["video"], emb["text"]), relevancy
      )
    )
  return metrics
