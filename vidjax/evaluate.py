"""Evaluation metrics: EK-100 retrieval mAP/nDCG, top-k, multi-view, zero-shot, recall@K.

All metrics are fractions in [0, 1] (AVION and LaViLa print them x100).
Host-side metrics take numpy (or jax) arrays and use vectorised numpy;
`topk_correct` and `masked_sum_count` are jax functions meant for the jitted
eval step. Padded eval batches stay exact by accumulating `(sum, count)` pairs
with a validity mask (`MetricSums`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

# Bounds the [rows, columns] temporaries of the retrieval metrics.
_MIR_ROWS_PER_CHUNK = 1024


def _mir_per_query(similarity: np.ndarray, relevancy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    sim = similarity[start:start + _MIR_ROWS_PER_CHUNK]
    rel = relevancy[start:start + _MIR_ROWS_PER_CHUNK].astype(np.float64)
    order = np.argsort(-sim, axis=1, kind='stable')
    ranked = np.take_along_axis(rel, order, axis=1)
    hits = ranked == 1
    precision = np.cumsum(ranked, axis=1) / np.arange(1, cols + 1)
    with np.errstate(invalid='ignore', divide='ignore'):
      ap[start:start + len(sim)] = (precision * hits).sum(1) / hits.sum(1)
      num_graded = (rel > 0).sum(1, keepdims=True)
      first_k = np.arange(cols) < num_graded
      dcg = (ranked * first_k * discount).sum(1)
      ideal = -np.sort(-rel, axis=1)
      idcg = (ideal * first_k * discount).sum(1)
      ndcg[start:start + len(sim)] = dcg / idcg
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
    raise ValueError(f'ek100_mir_metrics: similarity {similarity.shape} and relevancy '
                     f'{relevancy.shape} must be matrices of the same shape')
  ap_v, ndcg_v = _mir_per_query(similarity, relevancy)
  ap_t, ndcg_t = _mir_per_query(similarity.T, relevancy.T)
  out = {}
  for name, v2t, t2v in (('mAP', ap_v, ap_t), ('nDCG', ndcg_v, ndcg_t)):
    out[f'{name}_v2t'] = float(np.nanmean(v2t)) if np.isfinite(v2t).any() else float('nan')
    out[f'{name}_t2v'] = float(np.nanmean(t2v)) if np.isfinite(t2v).any() else float('nan')
    out[f'{name}_avg'] = (out[f'{name}_v2t'] + out[f'{name}_t2v']) / 2
  return out


def _softmax(x: np.ndarray) -> np.ndarray:
  x = x - x.max(-1, keepdims=True)
  e = np.exp(x)
  return e / e.sum(-1, keepdims=True)


def average_views(scores, mode: str = 'softmax') -> np.ndarray:
  """Averages multi-clip x multi-crop test views of each example.

  Args:
    scores: float[num_views, N, C] logits.
    mode: 'softmax' averages probabilities (then scores are probabilities);
      'logits' averages the raw logits.

  Returns:
    float64[N, C].
  """
  scores = np.asarray(scores, np.float64)
  if mode == 'softmax':
    scores = _softmax(scores)
  elif mode != 'logits':
    raise ValueError(f"average_views: mode must be 'softmax' or 'logits', got {mode!r}")
  return scores.mean(0)


def average_views_by_id(scores, example_ids, mode: str = 'softmax'
                        ) -> tuple[np.ndarray, np.ndarray]:
  """Averages views grouped by example id (views may arrive in any order).

  Args:
    scores: float[M, C] logits, one row per view.
    example_ids: int[M], the example each view belongs to.
    mode: 'softmax' or 'logits', as in `average_views`.

  Returns:
    (ids, averaged): int[U] sorted unique ids and float64[U, C].
  """
  scores = np.asarray(scores, np.float64)
  ids, group = np.unique(np.asarray(example_ids), return_inverse=True)
  if mode == 'softmax':
    scores = _softmax(scores)
  elif mode != 'logits':
    raise ValueError(f"average_views_by_id: mode must be 'softmax' or 'logits', got {mode!r}")
  sums = np.zeros((len(ids), scores.shape[1]))
  np.add.at(sums, group.reshape(-1), scores)
  return ids, sums / np.bincount(group.reshape(-1))[:, None]


def topk_correct(scores: jax.Array, labels: jax.Array, k: int) -> jax.Array:
  """Whether each label is among the top k scores (numpy or jax, jit-friendly).

  Ties count against the label (a constant predictor scores 0), so a
  collapsed model cannot look good.

  Args:
    scores: float[N, C].
    labels: int[N].
    k: how many top classes count.

  Returns:
    bool[N] (a numpy array for numpy inputs).
  """
  # numpy for host arrays (float64 stays float64), jnp for device arrays/tracers.
  xp = jnp if isinstance(scores, jax.Array) or isinstance(labels, jax.Array) else np
  scores, labels = xp.asarray(scores), xp.asarray(labels)
  label_score = xp.take_along_axis(scores, labels[:, None], axis=1)
  rank = (scores >= label_score).sum(1) - 1
  return rank < k


def topk_accuracy(scores, labels, ks: Sequence[int] = (1, 5), prefix: str = '') -> dict[str, float]:
  """Top-k accuracies, e.g. {'top1': 0.7, 'top5': 0.9} (keys get `prefix`)."""
  scores, labels = np.asarray(scores), np.asarray(labels)
  return {f'{prefix}top{k}': float(np.mean(np.asarray(topk_correct(scores, labels, k))))
          for k in ks}


def marginalize_action_scores(action_probs, action_to_verb_noun, num_verbs: int | None = None,
                              num_nouns: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Verb and noun probabilities from action probabilities (EK-100).

  P(verb v) is the sum of P(action a) over the actions a whose verb is v;
  likewise for nouns. Pass probabilities (e.g. `average_views` in 'softmax'
  mode), not logits.

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
    raise ValueError(f'marginalize_action_scores: action_to_verb_noun has shape '
                     f'{mapping.shape}, expected ({probs.shape[1]}, 2)')
  sizes = []
  for column, (size, what) in enumerate(((num_verbs, 'num_verbs'), (num_nouns, 'num_nouns'))):
    needed = int(mapping[:, column].max()) + 1
    if size is not None and size < needed:
      raise ValueError(f'marginalize_action_scores: {what}={size} but the action map uses '
                       f'id {needed - 1}')
    sizes.append(needed if size is None else size)
  verb_of = np.eye(sizes[0])[mapping[:, 0]]  # [A, V]
  noun_of = np.eye(sizes[1])[mapping[:, 1]]  # [A, Nn]
  return probs @ verb_of, probs @ noun_of


def _l2_normalize(x: np.ndarray) -> np.ndarray:
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def zero_shot_scores(video_embeddings, class_embeddings) -> np.ndarray:
  """Cosine similarity between videos and class-name prompt embeddings.

  With several prompts per class, each prompt embedding is normalised, the
  prompts are averaged and the mean is normalised again (CLIP's recipe).

  Args:
    video_embeddings: float[N, D].
    class_embeddings: float[C, D], or float[C, P, D] for P prompts per class.

  Returns:
    float64[N, C]; take `topk_accuracy` of it against the labels.
  """
  classes = _l2_normalize(np.asarray(class_embeddings, np.float64))
  if classes.ndim == 3:
    classes = _l2_normalize(classes.mean(1))
  videos = _l2_normalize(np.asarray(video_embeddings, np.float64))
  return videos @ classes.T


def retrieval_recall(similarity, ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
  """Recall@K for paired video-text data: video i goes with text i.

  Ties count against the true pair, as in `topk_correct`.

  Args:
    similarity: float[N, N], videos x texts.
    ks: the K values.

  Returns:
    {'v2t_r1', ..., 't2v_r1', ..., 'chance_r1'}: fractions; chance_r1 = 1/N
    is what a random model scores on R@1.
  """
  sim = np.asarray(similarity, np.float64)
  if sim.ndim != 2 or sim.shape[0] != sim.shape[1]:
    raise ValueError(f'retrieval_recall: need a square similarity matrix, got {sim.shape}')
  n = sim.shape[0]
  true = np.diag(sim)
  ranks = {'v2t': (sim >= true[:, None]).sum(1) - 1, 't2v': (sim >= true[None, :]).sum(0) - 1}
  out = {f'{d}_r{k}': float(np.mean(r < k)) for d, r in ranks.items() for k in ks}
  out['chance_r1'] = 1.0 / n
  return out


def masked_sum_count(values: jax.Array, valid: jax.Array | None = None
                     ) -> tuple[jax.Array, jax.Array]:
  """(sum of valid values, number of valid values) of a batch, jit-friendly.

  Args:
    values: float[B] per-example values (NaN in padded rows is ignored).
    valid: bool[B], False for padding; None means all valid.

  Returns:
    (float32[], float32[]).
  """
  values = jnp.asarray(values, jnp.float32)
  if valid is None:
    valid = jnp.ones(values.shape, bool)
  valid = jnp.asarray(valid, bool)
  return jnp.where(valid, values, 0.0).sum(), valid.sum().astype(jnp.float32)


class MetricSums:
  """Named (sum, count) pairs so means over padded batches stay exact.

  Example:
    sums = MetricSums()
    for batch in eval_batches:
      sums.add('top1', topk_correct(scores, labels, 1), valid=batch['valid'])
    sums.compute()  # {'top1': ...}
  """

  def __init__(self, sums: Mapping[str, tuple[float, float]] | None = None):
    self.sums: dict[str, tuple[float, float]] = dict(sums or {})

  def add_sums(self, name: str, total, count) -> MetricSums:
    """Adds a precomputed (sum, count), e.g. from `masked_sum_count`."""
    old_total, old_count = self.sums.get(name, (0.0, 0.0))
    self.sums[name] = (old_total + float(total), old_count + float(count))
    return self

  def add(self, name: str, values, valid=None) -> MetricSums:
    """Adds per-example values float[B], keeping those where valid bool[B]."""
    values = np.asarray(values, np.float64).reshape(-1)
    valid = np.ones(values.shape, bool) if valid is None else np.asarray(valid, bool).reshape(-1)
    if valid.shape != values.shape:
      raise ValueError(f'MetricSums.add({name!r}): {values.shape[0]} values but '
                       f'{valid.shape[0]} validity flags')
    return self.add_sums(name, np.where(valid, values, 0.0).sum(), valid.sum())

  def merge(self, other: MetricSums) -> MetricSums:
    """A new MetricSums with both sets of sums (e.g. from several hosts)."""
    merged = MetricSums(self.sums)
    for name, (total, count) in other.sums.items():
      merged.add_sums(name, total, count)
    return merged

  def compute(self) -> dict[str, float]:
    """Means; NaN for a metric that never saw a valid example."""
    return {name: total / count if count else float('nan')
            for name, (total, count) in self.sums.items()}
