"""Loss functions, pure and written on global arrays.

Every function takes the whole (global) batch. Under `jax.jit` with inputs
sharded over the mesh, XLA gathers what it needs, so the contrastive loss
sees every device's embeddings as negatives, as AVION's `gather_with_grad`
all-gather does, with no per-device code to get wrong.

Each takes an optional `valid` bool[B]: an invalid element (one whose clip
could not be read; the pipeline ships zeros and `valid=False`) changes
neither the loss nor its gradient: it is no anchor, no negative, and not
counted in any mean.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

# Logit of an invalid column: finite, so no inf or NaN reaches a gradient.
_MASKED_LOGIT = -1e9


def _valid(valid: jax.Array | None, batch: int) -> jax.Array:
  return jnp.ones((batch,), bool) if valid is None else valid.astype(bool)


def masked_mean(values: jax.Array, valid: jax.Array | None) -> jax.Array:
  """Mean of float[B] `values` over the valid examples (0 if none)."""
  valid = _valid(valid, values.shape[0])
  total = jnp.sum(jnp.where(valid, values.astype(jnp.float32), 0.0))
  return total / jnp.maximum(jnp.sum(valid), 1)


def l2_normalize(x, eps: float = 1e-8):
  """x / max(||x||, eps) along the last axis, the norm in float32 or wider.

  A numpy array stays numpy (the host's evaluation embeddings, float64
  kept); anything else goes through jax (the losses, inside `jit`).
  """
  xp = np if isinstance(x, np.ndarray) else jnp
  norm = xp.linalg.norm(
    x.astype(xp.promote_types(x.dtype, xp.float32)), axis=-1, keepdims=True
  )
  return (x / xp.maximum(norm, eps)).astype(x.dtype)


def contrastive_loss(
  video_emb: jax.Array,
  text_emb: jax.Array,
  logit_scale: jax.Array,
  *,
  normalize: bool = True,
  valid: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Symmetric InfoNCE over the global batch (CLIP / LaViLa / AVION).

  Pair i (video i, text i) is the positive; every other item of the global
  batch is a negative. The loss is the mean of video->text and
  text->video cross-entropies, without label smoothing, as in AVION's
  `ClipLoss`.

  Args:
    video_emb: float[B, D] video embeddings (global batch).
    text_emb: float[B, D] text embeddings, row i paired with video i.
    logit_scale: float[] log-space scale (the model's learnable parameter,
      initialised to `defaults.INIT_LOGIT_SCALE`); logits are multiplied
      by its exp. AVION clamps it to [0, `models.clip.MAX_LOGIT_SCALE`]
      after each optimizer step; that is the train step's job, this
      function does not clip.
    normalize: L2-normalise the embeddings first (AVION's model does).
    valid: optional bool[B]; invalid pairs are neither anchors nor
      negatives, and the means run over the valid ones.

  Returns:
    (loss float32[], metrics) with 'v2t_acc' and 't2v_acc' (fraction of
    the valid pairs whose argmax is the positive) and 'logit_scale' (exp).
  """
  video = video_emb.astype(jnp.float32)
  text = text_emb.astype(jnp.float32)
  if normalize:
    video, text = l2_normalize(video), l2_normalize(text)
  scale = jnp.exp(jnp.asarray(logit_scale, jnp.float32))
  logits = scale * video @ text.T  # [B, B]: row = video, column = text
  labels = jnp.arange(logits.shape[0])
  valid = _valid(valid, logits.shape[0])
  pair = valid[:, None] & valid[None, :]
  logits = jnp.where(
    pair | jnp.eye(len(labels), dtype=bool), logits, _MASKED_LOGIT
  )
  v2t = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  t2v = optax.softmax_cross_entropy_with_integer_labels(logits.T, labels)
  loss = (masked_mean(v2t, valid) + masked_mean(t2v, valid)) / 2
  metrics = {
    "v2t_acc": masked_mean(jnp.argmax(logits, axis=1) == labels, valid),
    "t2v_acc": masked_mean(jnp.argmax(logits, axis=0) == labels, valid),
    "logit_scale": scale,
  }
  return loss, metrics


def reconstruction_error(
  predictions: jax.Array, targets: jax.Array
) -> jax.Array:
  """Per-example mean squared error of VideoMAE's masked-patch predictions.

  Args:
    predictions: float[B, M, K], the decoder's pixels for the M masked
      patches of each example.
    targets: float[B, M, K], those patches' (normalised) pixels.

  Returns:
    float32[B]. With M the same for every example, their mean is AVION's
    `MSELoss` over the gathered masked patches.
  """
  error = jnp.square(predictions.astype(jnp.float32) - targets)
  return jnp.mean(error, axis=(1, 2))


def softmax_cross_entropy(
  logits: jax.Array, targets: jax.Array, valid: jax.Array | None = None
) -> jax.Array:
  """Mean cross-entropy against hard labels or soft (mixup/cutmix) targets.

  Label smoothing is `vidjax.augment`'s: it makes soft targets.

  Args:
    logits: float[B, K].
    targets: int[B] class ids, or float[B, K] probabilities.
    valid: optional bool[B]; the mean runs over the valid examples.

  Returns:
    float32[] mean over the (valid) batch.
  """
  num_classes = logits.shape[-1]
  if jnp.issubdtype(targets.dtype, jnp.integer):
    targets = jax.nn.one_hot(targets, num_classes, dtype=jnp.float32)
  targets = targets.astype(jnp.float32)
  return masked_mean(
    optax.softmax_cross_entropy(logits.astype(jnp.float32), targets), valid
  )


# SMS's reference holds the relevancy matrix in uint8 multiples of 1/240: two
# relevancies closer than this are the same.
SMS_EPS = 1.1 / 240


def _both_ways(x: jax.Array) -> jax.Array:
  """float[2, B, B]: x_ii - x_ij ([0]: row i's diagonal against its column j)
  and x_ii - x_ji ([1]: column i's against its row j), for x float[B, B]."""
  x = x.astype(jnp.float32)
  return jnp.diag(x)[:, None] - jnp.stack([x, x.T])


def _mean_off_diagonal(terms: jax.Array, valid: jax.Array | None) -> jax.Array:
  """Mean of float[2, B, B] over the pairs of distinct valid elements."""
  n = terms.shape[-1]
  valid = _valid(valid, n)
  keep = valid[:, None] & valid[None, :] & ~jnp.eye(n, dtype=bool)
  return jnp.sum(jnp.where(keep, terms, 0.0)) / jnp.maximum(
    2 * jnp.sum(keep), 1
  )


def max_margin_ranking_loss(
  similarity: jax.Array, margin: float = 0.2, valid: jax.Array | None = None
) -> jax.Array:
  """Bidirectional max-margin ranking loss (EK-100 MIR fine-tuning).

  With s = similarity[i, j] (video i vs text j; pair i is the positive),
  each off-diagonal (i, j) contributes relu(m - (s_ii - s_ij)) and
  relu(m - (s_ii - s_ji)); the loss is their mean over 2 B (B - 1) terms.
  This is AVION/LaViLa's `MaxMarginRankingLoss(fix_norm=True)` (both pass
  the batch relevancy to it, which it ignores).

  Args:
    similarity: float[B, B] cosine similarities between L2-normalised video
      (rows) and text (columns) embeddings of the global batch (the loss is
      the same for the transpose: each pair is ranked both ways).
    margin: the margin (AVION: 0.2).
    valid: optional bool[B]; only pairs of valid elements are terms (the
      mean runs over 2 V (V - 1) terms for V valid elements).

  Returns:
    float32[].
  """
  return _mean_off_diagonal(jax.nn.relu(margin - _both_ways(similarity)), valid)


def relevancy_max_margin_loss(
  similarity: jax.Array,
  relevancy: jax.Array,
  margin: float = 0.4,
  valid: jax.Array | None = None,
) -> jax.Array:
  """The max-margin ranking loss with each pair's margin scaled by its
  positive's relevancy: relu(r_ii m - (s_ii - s_ij)), both ways (SMS-Loss's
  `AdaptiveMaxMarginRankingLoss`).

  Args:
    similarity: float[B, B], video i vs text j (as `max_margin_ranking_loss`).
    relevancy: float[B, B], the relevancy of video i to the caption of item j
      (its diagonal: each positive's; only the diagonal is read).
    margin: the margin at relevancy 1 (the reference: 0.4).
    valid: optional bool[B], as `max_margin_ranking_loss`.

  Returns:
    float32[].
  """
  scaled = jnp.diag(relevancy.astype(jnp.float32))[:, None] * margin
  return _mean_off_diagonal(jax.nn.relu(scaled - _both_ways(similarity)), valid)


def sms_loss(
  similarity: jax.Array,
  relevancy: jax.Array,
  *,
  margin: float = 0.6,
  threshold: float = 0.1,
  valid: jax.Array | None = None,
) -> jax.Array:
  """Symmetric Multi-Similarity loss (SMS; Wang et al., arXiv 2406.12256).

  Each pair (i, j), i != j, is ranked both ways against the positive pair i:
  video i's caption against caption j (d = s_ii - s_ij, w = r_ii - r_ij) and
  caption i's video against video j (d = s_ii - s_ji, w = r_ii - r_ji). A pair
  less relevant than the positive (w > `SMS_EPS`) is pushed below it by
  w x margin, relu(w m - d); one as relevant (|w| < `SMS_EPS`) is kept within
  `threshold` of it, relu(|w m - d| - threshold); one more relevant is pulled
  above it, relu(d - w m). The loss is the mean of the 2 B (B - 1) terms, as
  the reference's `SymmetricMultiSimiliarityLoss` (fix_norm). It takes the
  relevancies as given: the EK-100 MIR task passes EPIC's exact values, not
  the reference's uint8 truncations of M x 240 (whose ties differ: 1/18 and
  1/20 tie there, not here; `vidjax.tasks.retrieval`, docs/recipes.md).

  Args:
    similarity: float[B, B] cosine similarities, video i (rows) vs text j.
    relevancy: float[B, B] the training matrix's relevancy of video i to
      the caption of item j; the diagonal is each positive's.
    margin: the margin at a relevancy gap of 1 (the reference: 0.6).
    threshold: how far a pair as relevant as the positive may be from it
      (the reference: 0.1).
    valid: optional bool[B]; only pairs of valid elements are terms.

  Returns:
    float32[].
  """
  w = _both_ways(relevancy)
  gap = w * margin - _both_ways(similarity)
  terms = jnp.where(
    w > SMS_EPS,
    jax.nn.relu(gap),
    jnp.where(
      jnp.abs(w) < SMS_EPS,
      jax.nn.relu(jnp.abs(gap) - threshold),
      jax.nn.relu(-gap),
    ),
  )
  return _mean_off_diagonal(terms, valid)
