"""Evaluation metrics: EK-100 retrieval mAP/nDCG, recall@K, top-k, views,
EgoMCQ accuracy, Charades-Ego mAP.

All metrics are fractions in [0, 1] (AVION and LaViLa print them x100).
They take numpy (or jax) arrays of a whole evaluation set, gathered on the
host with its padding rows dropped, and use vectorised numpy; `topk_correct`
also runs inside `jit`.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
  "EGOMCQ_TYPES",
  "average_views",
  "charades_map",
  "egomcq_accuracy",
  "egomcq_scores",
  "ek100_mir_metrics",
  "marginalize_action_scores",
  "mean_class_accuracy",
  "retrieval_recall",
  "softmax",
  "topk_accuracy",
  "topk_correct",
]

# Bounds the [rows, columns] temporaries of the retrieval metrics.
_MIR_ROWS_PER_CHUNK = 1024


def _mir_per_query(
  similarity: np.ndarray, relevancy: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
  """Average precision and nDCG of each row (query) against all columns.

  Follows the EPIC-Kitchens-100 MIR evaluation code (JPoSE's mAP.py/NDCG.py):
    AP: items with relevancy == 1 are relevant; precision at rank k is the sum
      of the *graded* relevancy of the top k divided by k (the official code
      takes a cumulative sum of the relevancy values, not of the 0/1 hits);
      AP = sum of precision at the ranks of relevant items / their number.
    nDCG: with K = number of items with relevancy > 0, DCG sums
      rel_i / log2(i + 1) over the first K retrieved items (i from 1), and
      IDCG is the same sum over the relevancies sorted in decreasing order.
  Items are ranked by decreasing similarity; ties go to the lower index.

  Returns:
    (ap, ndcg): float64[rows]; NaN for queries without any relevant item.
  """
  rows, cols = similarity.shape
  discount = 1.0 / np.log2(np.arange(cols) + 2.0)
  ap = np.empty(rows)
  ndcg = np.empty(rows)
  for start in range(0, rows, _MIR_ROWS_PER_CHUNK):
    sim = similarity[start : start + _MIR_ROWS_PER_CHUNK]
    rel = relevancy[start : start + _MIR_ROWS_PER_CHUNK].astype(np.float64)
    order = np.argsort(-sim, axis=1, kind="stable")
    ranked = np.take_along_axis(rel, order, axis=1)
    hits = ranked == 1
    precision = np.cumsum(ranked, axis=1) / np.arange(1, cols + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
      ap[start : start + len(sim)] = (precision * hits).sum(1) / hits.sum(1)
      num_graded = (rel > 0).sum(1, keepdims=True)
      first_k = np.arange(cols) < num_graded
      dcg = (ranked * first_k * discount).sum(1)
      ideal = -np.sort(-rel, axis=1)
      idcg = (ideal * first_k * discount).sum(1)
      ndcg[start : start + len(sim)] = dcg / idcg
  return ap, ndcg


def ek100_mir_metrics(similarity, relevancy) -> dict[str, float]:
  """EPIC-Kitchens-100 multi-instance retrieval mAP and nDCG.

  Definitions as in the official evaluation (see `_mir_per_query`), computed
  for videos as queries (v2t, rows) and texts as queries (t2v, columns).
  Queries with no relevant item are left out of the mean (the official code
  would return NaN; EK-100's test set has none).

  Args:
    similarity: float[num_videos, num_texts], higher = more similar.
    relevancy: float[num_videos, num_texts] in [0, 1] (EK-100's graded
      verb/noun relevancy).

  Returns:
    {'mAP_v2t', 'mAP_t2v', 'mAP_avg', 'nDCG_v2t', 'nDCG_t2v', 'nDCG_avg'}:
    Python floats, fractions in [0, 1].
  """
  similarity = np.asarray(similarity, np.float64)
  relevancy = np.asarray(relevancy, np.float64)
  if similarity.ndim != 2 or similarity.shape != relevancy.shape:
    raise ValueError(
      f"ek100_mir_metrics: similarity {similarity.shape} and relevancy "
      f"{relevancy.shape} must be matrices of the same shape"
    )
  ap_v, ndcg_v = _mir_per_query(similarity, relevancy)
  ap_t, ndcg_t = _mir_per_query(similarity.T, relevancy.T)
  out = {}
  for name, v2t, t2v in (("mAP", ap_v, ap_t), ("nDCG", ndcg_v, ndcg_t)):
    out[f"{name}_v2t"] = (
      float(np.nanmean(v2t)) if np.isfinite(v2t).any() else float("nan")
    )
    out[f"{name}_t2v"] = (
      float(np.nanmean(t2v)) if np.isfinite(t2v).any() else float("nan")
    )
    out[f"{name}_avg"] = (out[f"{name}_v2t"] + out[f"{name}_t2v"]) / 2
  return out


def softmax(x) -> np.ndarray:
  """Softmax over the last axis, float64."""
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def average_views(values, example_ids) -> tuple[np.ndarray, np.ndarray]:
  """Averages the test views (multi-clip x multi-crop) of each example.

  Args:
    values: float[M, ...], one row per view (e.g. class probabilities from
      `softmax`, as AVION and VideoMAE average, or embeddings).
    example_ids: int[M], the example each view belongs to; views may come
      in any order.

  Returns:
    (ids, means): int[U] sorted unique ids and float64[U, ...].
  """
  values = np.asarray(values, np.float64)
  ids, group = np.unique(np.asarray(example_ids), return_inverse=True)
  group = group.reshape(-1)
  sums = np.zeros((len(ids),) + values.shape[1:])
  np.add.at(sums, group, values)
  counts = np.bincount(group).reshape((-1,) + (1,) * (values.ndim - 1))
  return ids, sums / counts


def topk_correct(scores: jax.Array, labels: jax.Array, k: int) -> jax.Array:
  """Whether each label is among the top k scores (numpy or jax, jit-friendly).

  Ties count against the label (a constant predictor scores 0), so a
  collapsed model cannot look good. A label outside [0, C) (a class the
  model does not have) is never among them: it counts as wrong.

  Args:
    scores: float[N, C].
    labels: int[N].
    k: how many top classes count.

  Returns:
    bool[N] (a numpy array for numpy inputs).
  """
  # numpy for host arrays (float64 stays float64), jnp for device arrays/tracers.
  xp = (
    jnp
    if isinstance(scores, jax.Array) or isinstance(labels, jax.Array)
    else np
  )
  scores, labels = xp.asarray(scores), xp.asarray(labels)
  known = (labels >= 0) & (labels < scores.shape[1])
  label_score = xp.take_along_axis(
    scores, xp.where(known, labels, 0)[:, None], axis=1
  )
  rank = (scores >= label_score).sum(1) - 1
  return (rank < k) & known


def topk_accuracy(
  scores, labels, ks: Sequence[int] = (1, 5), prefix: str = ""
) -> dict[str, float]:
  """Top-k accuracies, e.g. {'top1': 0.7, 'top5': 0.9} (keys get `prefix`)."""
  scores, labels = np.asarray(scores), np.asarray(labels)
  return {
    f"{prefix}top{k}": float(
      np.mean(np.asarray(topk_correct(scores, labels, k)))
    )
    for k in ks
  }


def mean_class_accuracy(scores, labels) -> float:
  """Mean class accuracy as AVION computes it (EK-100's `Mean Acc.`).

  The prediction is the highest score (the first on ties). Each class that
  occurs as a label or as a prediction (the rows of scikit-learn's
  confusion matrix) scores the fraction of its examples predicted right, or
  0 if it is never the label; the result is their mean. (A class predicted
  but never the label counts as 0: lower than the mean over labelled
  classes alone.)

  Args:
    scores: float[N, C].
    labels: int[N].

  Returns:
    A fraction in [0, 1].
  """
  labels = np.asarray(labels)
  predictions = np.asarray(scores).argmax(-1)
  classes, label_index = np.unique(
    np.concatenate([labels, predictions]), return_inverse=True
  )
  label_index = label_index[: len(labels)]
  examples = np.bincount(label_index, minlength=len(classes))
  right = np.bincount(
    label_index[predictions == labels], minlength=len(classes)
  )
  return float(np.mean(right / np.maximum(examples, 1)))


def marginalize_action_scores(
  action_probs,
  action_to_verb_noun,
  num_verbs: int | None = None,
  num_nouns: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """Verb and noun probabilities from action probabilities (EK-100).

  P(verb v) is the sum of P(action a) over the actions a whose verb is v;
  likewise for nouns. A verb (noun) in no action takes P(action 0), as
  AVION's `marginalize` does. Pass probabilities (e.g. averaged `softmax`
  scores), not logits.

  Args:
    action_probs: float[N, A].
    action_to_verb_noun: int[A, 2], the (verb, noun) of each action class.
    num_verbs, num_nouns: sizes of the verb and noun vocabularies (EK-100:
      97 and 300); None takes 1 + the largest id in the mapping.

  Returns:
    (verb_probs, noun_probs): float64[N, num_verbs], float64[N, num_nouns].
  """
  probs = np.asarray(action_probs, np.float64)
  mapping = np.asarray(action_to_verb_noun, np.int64)
  if mapping.shape != (probs.shape[1], 2):
    raise ValueError(
      f"marginalize_action_scores: action_to_verb_noun has shape "
      f"{mapping.shape}, expected ({probs.shape[1]}, 2)"
    )
  sizes = []
  for column, (size, what) in enumerate(
    ((num_verbs, "num_verbs"), (num_nouns, "num_nouns"))
  ):
    needed = int(mapping[:, column].max()) + 1
    if size is not None and size < needed:
      raise ValueError(
        f"marginalize_action_scores: {what}={size} but the action map uses "
        f"id {needed - 1}"
      )
    sizes.append(needed if size is None else size)
  marginals = []
  for column, size in enumerate(sizes):
    member = np.eye(size)[mapping[:, column]]  # [A, V]: action a has verb v
    member[0, member.sum(0) == 0] = 1  # In no action: action 0's, as AVION.
    marginals.append(probs @ member)
  return marginals[0], marginals[1]


def retrieval_recall(
  similarity, ks: Sequence[int] = (1, 5, 10)
) -> dict[str, float]:
  """Recall@K for paired video-text data: video i goes with text i.

  Ties count against the true pair, as in `topk_correct`.

  Args:
    similarity: float[N, N], videos x texts.
    ks: the K values.

  Returns:
    {'v2t_r1', ..., 't2v_r1', ..., 'chance_r1'}: fractions; chance_r1 = 1/N
    is what a random model scores on R@1. A K of N or more is left out
    (every pair is among the top N: it would say 1.0 of any model), but 1
  """
  sim = np.asarray(similarity, np.float64)
  if sim.ndim != 2 or sim.shape[0] != sim.shape[1]:
    raise ValueError(
      f"retrieval_recall: need a square similarity matrix, got {sim.shape}"
    )
  n = sim.shape[0]
  true = np.diag(sim)
  ranks = {
    "v2t": (sim >= true[:, None]).sum(1) - 1,
    "t2v": (sim >= true[None, :]).sum(0) - 1,
  }
  out = {
    f"{d}_r{k}": float(np.mean(r < k))
    for d, r in ranks.items()
    for k in ks
    if k < n or k == 1
  }
  out["chance_r1"] = 1.0 / n
  return out


# EgoMCQ's `types` values (as in egomcq.json): 1 = the 5 candidates come from
# 5 different videos, 2 = from the query's own video. (The reference metric
# prints them the other way round; inter-video is the easier, higher one.)
EGOMCQ_TYPES = {1: "inter_video", 2: "intra_video"}


def egomcq_scores(query_emb, choice_emb, cosine: bool = True) -> np.ndarray:
  """How well each of an EgoMCQ question's candidate clips fits its text.

  Args:
    query_emb: float[N, D], the narration of each question.
    choice_emb: float[N, K, D], its K (5) candidate clips.
    cosine: cosine similarity (both sides L2-normalised, vidjax's default);
      False takes the dot product of the unnormalised embeddings, as
      LaViLa's `validate_mcq` scores.

  Returns:
    float64[N, K].
  """
  q = np.asarray(query_emb, np.float64)
  v = np.asarray(choice_emb, np.float64)
  if q.ndim != 2 or v.ndim != 3 or v.shape[::2] != q.shape:
    raise ValueError(
      f"egomcq_scores: query {q.shape} and choices {v.shape} must be "
      "[N, D] and [N, K, D]"
    )
  if cosine:
    q = q / np.maximum(np.linalg.norm(q, axis=-1, keepdims=True), 1e-30)
    v = v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-30)
  return np.einsum("nd,nkd->nk", q, v)


def egomcq_accuracy(scores, answers, types) -> dict[str, float]:
  """EgoMCQ accuracy per question type, labelled by the `types` value.

  A question is right when its highest-scored candidate is the answer (the
  first of equal scores, as the reference's `argmax`).

  Args:
    scores: float[N, K], K candidates per question (5 in EgoMCQ).
    answers: int[N] in [0, K).
    types: int[N], 1 (inter-video) or 2 (intra-video), see `EGOMCQ_TYPES`.

  Returns:
    {'inter_video': ..., 'intra_video': ...} fractions, each over the
    questions of its type; a type with no question has no key.
  """
  scores = np.asarray(scores)
  answers, types = np.asarray(answers).reshape(-1), np.asarray(types)
  if scores.ndim != 2 or not len(answers) == len(scores) == types.size:
    raise ValueError(
      f"egomcq_accuracy: scores {scores.shape}, answers {answers.shape} and "
      f"types {types.shape} must be [N, K], [N], [N]"
    )
  types = types.reshape(-1)
  unknown = sorted(set(types.tolist()) - set(EGOMCQ_TYPES))
  if unknown:
    raise ValueError(
      f"egomcq_accuracy: types {unknown} are not EgoMCQ's (1 inter-video, "
      "2 intra-video)"
    )
  right = scores.argmax(1) == answers
  return {
    name: float(right[types == t].mean())
    for t, name in EGOMCQ_TYPES.items()
    if (types == t).any()
  }


def charades_map(scores, labels) -> dict[str, float]:
  """Charades(-Ego) mean average precision over classes, never NaN.

  Each class ranks the videos by decreasing score (ties: the lower index
  first) and scores the mean of the precision at each positive's rank; the
  mAP is the mean over classes. Videos with no label at all do not count
  (the reference ranks them last, which is the same). Equal to the
  reference's `charades_map` where every class has a positive; where some
  have none (the reference returns NaN), the mean is over the classes that
  have one, and `classes_left_out` says how many did not.

  Args:
    scores: float[N, C].
    labels: {0, 1}[N, C].

  Returns:
    {'mAP': fraction, 'classes_left_out': int count}.

  Raises:
    ValueError: mismatched shapes, or no class with a positive.
  """
  scores = np.asarray(scores, np.float64)
  positive = np.asarray(labels) == 1
  if scores.ndim != 2 or scores.shape != positive.shape:
    raise ValueError(
      f"charades_map: scores {scores.shape} and labels {positive.shape} "
      "must be [N, C] matrices of the same shape"
    )
  keep = positive.any(1)
  scores, positive = scores[keep], positive[keep]
  scored = positive.any(0)
  if not scored.any():
    raise ValueError("charades_map: no class has a positive; nothing to score")
  order = np.argsort(-scores[:, scored], axis=0, kind="stable")
  hits = np.take_along_axis(positive[:, scored], order, axis=0)
  precision = np.cumsum(hits, 0) / np.arange(1, len(hits) + 1)[:, None]
  ap = (precision * hits).sum(0) / hits.sum(0)
  return {"mAP": float(ap.mean()), "classes_left_out": int((~scored).sum())}
