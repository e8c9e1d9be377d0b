"""Tests for vidjax.tasks.metrics against independent per-query implementations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vidjax.tasks import metrics


@pytest.fixture(scope="module")
def sklearn_metrics():
  """Imported by the tests that use it: at collection it costs seconds in
  every test process."""
  return pytest.importorskip("sklearn.metrics")


def _random_mir(num_videos=37, num_texts=23, seed=0, graded=True):
  rng = np.random.default_rng(seed)
  sim = rng.standard_normal((num_videos, num_texts))  # Continuous: no ties.
  levels = (
    np.array([0, 0, 0, 0.25, 0.5, 0.75, 1.0])
    if graded
    else np.array([0, 0, 0, 1.0])
  )
  rel = rng.choice(levels, size=sim.shape)
  # Every video and every text has at least one fully relevant partner, as in EK-100.
  rel[np.arange(num_videos), np.arange(num_videos) % num_texts] = 1.0
  rel[np.arange(num_texts) % num_videos, np.arange(num_texts)] = 1.0
  return sim, rel


def _official_ap_loop(sim_row, rel_row):
  """The EK-100 AP written as a loop: precision uses the graded relevancy sum."""
  order = sorted(range(len(sim_row)), key=lambda j: -sim_row[j])
  gained, total, hits = 0.0, 0.0, 0
  for k, j in enumerate(order, start=1):
    gained += rel_row[j]
    if rel_row[j] == 1:
      total += gained / k
      hits += 1
  return total / hits


def _ndcg_loop(sim_row, rel_row):
  order = np.argsort(-sim_row)
  k = int((rel_row > 0).sum())
  dcg = sum(rel_row[j] / np.log2(i + 2) for i, j in enumerate(order[:k]))
  idcg = sum(
    r / np.log2(i + 2) for i, r in enumerate(sorted(rel_row, reverse=True)[:k])
  )
  return dcg / idcg


def test_mir_binary_relevancy_matches_sklearn(sklearn_metrics):
  sim, rel = _random_mir(graded=False)
  got = metrics.ek100_mir_metrics(sim, rel)
  for name, s, r in (("v2t", sim, rel), ("t2v", sim.T, rel.T)):
    ap = np.mean(
      [
        sklearn_metrics.average_precision_score(r[i] == 1, s[i])
        for i in range(len(s))
      ]
    )
    ndcg = np.mean(
      [
        sklearn_metrics.ndcg_score(
          r[i : i + 1], s[i : i + 1], k=int((r[i] > 0).sum())
        )
        for i in range(len(s))
      ]
    )
    assert got[f"mAP_{name}"] == pytest.approx(ap, abs=1e-6)
    assert got[f"nDCG_{name}"] == pytest.approx(ndcg, abs=1e-6)
  assert got["mAP_avg"] == pytest.approx((got["mAP_v2t"] + got["mAP_t2v"]) / 2)
  assert got["nDCG_avg"] == pytest.approx(
    (got["nDCG_v2t"] + got["nDCG_t2v"]) / 2
  )


@pytest.mark.parametrize("seed", [1, 2])
def test_mir_graded_relevancy_matches_per_query_loops(
  seed, monkeypatch, sklearn_metrics
):
  monkeypatch.setattr(
    metrics, "_MIR_ROWS_PER_CHUNK", 8
  )  # Exercise the chunking.
  sim, rel = _random_mir(num_videos=41, num_texts=29, seed=seed)
  got = metrics.ek100_mir_metrics(sim, rel)
  for name, s, r in (("v2t", sim, rel), ("t2v", sim.T, rel.T)):
    ap = np.mean([_official_ap_loop(s[i], r[i]) for i in range(len(s))])
    ndcg_loop = np.mean([_ndcg_loop(s[i], r[i]) for i in range(len(s))])
    ndcg_sk = np.mean(
      [
        sklearn_metrics.ndcg_score(
          r[i : i + 1], s[i : i + 1], k=int((r[i] > 0).sum())
        )
        for i in range(len(s))
      ]
    )
    assert got[f"mAP_{name}"] == pytest.approx(ap, abs=1e-6)
    assert got[f"nDCG_{name}"] == pytest.approx(ndcg_loop, abs=1e-6)
    assert got[f"nDCG_{name}"] == pytest.approx(ndcg_sk, abs=1e-6)
  assert all(0 <= v <= 1 for v in got.values())


def test_mir_perfect_ranking_and_validation():
  _, rel = _random_mir()
  perfect = metrics.ek100_mir_metrics(
    rel + 1e-9 * np.random.default_rng(0).random(rel.shape), rel
  )
  assert perfect["nDCG_avg"] == pytest.approx(1.0)
  with pytest.raises(ValueError, match="same shape"):
    metrics.ek100_mir_metrics(np.zeros((3, 4)), np.zeros((4, 3)))


def test_topk_and_ties():
  scores = np.array([[0.1, 0.5, 0.4], [0.3, 0.2, 0.1], [0.2, 0.2, 0.2]])
  labels = np.array([2, 2, 0])
  np.testing.assert_array_equal(
    metrics.topk_correct(scores, labels, 1), [False, False, False]
  )
  np.testing.assert_array_equal(
    metrics.topk_correct(scores, labels, 2), [True, False, False]
  )
  acc = metrics.topk_accuracy(scores, labels, ks=(1, 3), prefix="verb_")
  assert acc == {"verb_top1": 0.0, "verb_top3": 1.0}
  jitted = jax.jit(metrics.topk_correct, static_argnums=2)(
    jnp.asarray(scores), labels, 2
  )
  np.testing.assert_array_equal(jitted, [True, False, False])


def test_a_label_outside_the_classes_counts_as_wrong():
  # An evaluation file may hold a class the head does not have (never
  # trained): it is scored, as wrong, on the host and on the device.
  scores = np.array([[0.1, 0.5, 0.4], [0.3, 0.2, 0.1], [0.6, 0.2, 0.2]])
  labels = np.array([1, 5, -1])
  for k in (1, 3):
    np.testing.assert_array_equal(
      metrics.topk_correct(scores, labels, k), [True, False, False]
    )
    np.testing.assert_array_equal(
      metrics.topk_correct(jnp.asarray(scores), jnp.asarray(labels), k),
      [True, False, False],
    )
  assert metrics.topk_accuracy(scores, labels, ks=(1,)) == {"top1": 1 / 3}


def test_average_views():
  rng = np.random.default_rng(0)
  logits = rng.standard_normal((3, 4, 5))  # 3 views of 4 examples.
  probs = metrics.softmax(logits).mean(0)
  np.testing.assert_allclose(probs.sum(-1), 1.0)
  # The same views, shuffled and grouped by id, give the same averages.
  flat, ids = logits.reshape(12, 5), np.tile(np.arange(4) + 10, 3)
  perm = rng.permutation(12)
  got_ids, got = metrics.average_views(metrics.softmax(flat[perm]), ids[perm])
  np.testing.assert_array_equal(got_ids, np.arange(4) + 10)
  np.testing.assert_allclose(got, probs)
  # Any trailing shape: embeddings [M, D] or [M, K, D].
  _, means = metrics.average_views(flat[perm, None], ids[perm])
  np.testing.assert_allclose(means[:, 0], logits.mean(0))


def test_marginalize_action_scores():
  mapping = np.array(
    [[0, 0], [0, 1], [1, 1], [2, 0]]
  )  # 4 actions over 3 verbs, 2 nouns.
  probs = np.array([[0.1, 0.2, 0.3, 0.4]])
  verb, noun = metrics.marginalize_action_scores(probs, mapping, 3, 2)
  np.testing.assert_allclose(verb, [[0.3, 0.3, 0.4]])
  np.testing.assert_allclose(noun, [[0.5, 0.5]])
  inferred = metrics.marginalize_action_scores(
    probs, mapping
  )  # Sizes from the map.
  np.testing.assert_allclose(inferred[0], verb)
  assert metrics.marginalize_action_scores(probs, mapping, 5, 2)[0].shape == (
    1,
    5,
  )
  with pytest.raises(ValueError, match="action_to_verb_noun"):
    metrics.marginalize_action_scores(probs, mapping[:3], 3, 2)
  with pytest.raises(ValueError, match="num_verbs=2"):
    metrics.marginalize_action_scores(probs, mapping, 2, 2)


def test_retrieval_recall():
  rng = np.random.default_rng(0)
  n = 50
  sim = rng.standard_normal((n, n))
  got = metrics.retrieval_recall(sim)
  ranks_v2t = [(np.argsort(-sim[i]) == i).nonzero()[0][0] for i in range(n)]
  ranks_t2v = [(np.argsort(-sim[:, i]) == i).nonzero()[0][0] for i in range(n)]
  for k in (1, 5, 10):
    assert got[f"v2t_r{k}"] == pytest.approx(np.mean(np.array(ranks_v2t) < k))
    assert got[f"t2v_r{k}"] == pytest.approx(np.mean(np.array(ranks_t2v) < k))
  assert got["chance_r1"] == pytest.approx(1 / n)
  assert metrics.retrieval_recall(np.eye(n))["t2v_r1"] == 1.0
  assert (
    metrics.retrieval_recall(np.ones((n, n)))["v2t_r10"] == 0.0
  )  # Ties count against.
  # Over 5 clips R@5 and R@10 would be 1.0 of any model: left out.
  assert sorted(metrics.retrieval_recall(sim[:5, :5])) == [
    "chance_r1",
    "t2v_r1",
    "v2t_r1",
  ]
  assert "t2v_r5" in metrics.retrieval_recall(sim[:6, :6])


def test_ek100_mean_class_accuracy_and_marginals_as_avion():
  """AVION's definitions (evaluation_ek100cls.py on scikit-learn's confusion
  matrix: every class that is a label or a prediction is a row) on random
  scores, where some classes are predicted but never the label and some
  verbs and nouns are in no action."""
  from sklearn.metrics import confusion_matrix

  rng = np.random.default_rng(0)
  pairs = np.stack(
    [
      rng.choice([0, 1, 2, 4, 5, 6, 8, 9, 10, 12], 30),
      rng.choice([0, 2, 3, 5, 6, 7], 30),
    ],
    1,
  )
  pairs[0] = (0, 0)
  probs = metrics.softmax(2 * rng.standard_normal((300, 30)))
  labels = rng.integers(0, 20, 300)  # Actions 20-29: only ever predicted.

  def avion_mean_accuracy(truth, scores):
    cm = confusion_matrix(truth, scores.argmax(1))
    return np.mean(
      [cm[i, i] / cm[i].sum() if cm[i].sum() else 0.0 for i in range(len(cm))]
    )

  ours = metrics.mean_class_accuracy(probs, labels)
  assert ours == pytest.approx(avion_mean_accuracy(labels, probs))
  labelled = [np.mean(probs[labels == c].argmax(1) == c) for c in range(20)]
  assert ours < np.mean(labelled)  # Not the mean over labelled classes.
  for column, marginal in zip(
    (0, 1), metrics.marginalize_action_scores(probs, pairs)
  ):
    ids = pairs[:, column]
    members = [np.flatnonzero(ids == v) for v in range(ids.max() + 1)]
    theirs = np.stack(
      [probs[:, m if len(m) else [0]].sum(1) for m in members], 1
    )  # AVION's marginalize: none -> action 0's
    np.testing.assert_allclose(marginal, theirs)
    truth = ids[labels]
    assert metrics.mean_class_accuracy(marginal, truth) == pytest.approx(
      avion_mean_accuracy(truth, theirs)
    )


def _egomcq_loop(scores, answers, types):
  """The reference's loop, with each group named by its `types` value."""
  out = {}
  for t, name in ((1, "inter_video"), (2, "intra_video")):
    right = total = 0
    for row, answer, kind in zip(scores, answers, types):
      if kind == t:
        right += int(np.argmax(row)) == answer
        total += 1
    if total:
      out[name] = right / total
  return out


def test_egomcq_accuracy_equals_the_reference_loop():
  rng = np.random.default_rng(3)
  scores = rng.normal(size=(40, 5))
  scores[:6] = 0.5  # Ties: the first candidate wins, as torch.argmax.
  answers = rng.integers(0, 5, 40)
  types = rng.integers(1, 3, 40)
  got = metrics.egomcq_accuracy(scores, answers, types)
  assert got == pytest.approx(_egomcq_loop(scores, answers, types))
  assert set(got) == {"inter_video", "intra_video"}
  # Scores that pick every answer: 1.0 in both groups; one group only.
  perfect = np.eye(5)[answers]
  assert metrics.egomcq_accuracy(perfect, answers, types) == {
    "inter_video": 1.0,
    "intra_video": 1.0,
  }
  assert set(metrics.egomcq_accuracy(scores, answers, np.ones(40))) == {
    "inter_video"
  }
  with pytest.raises(ValueError, match=r"types \[3\]"):
    metrics.egomcq_accuracy(scores, answers, types + 1)


def test_egomcq_scores_cosine_and_unnormalised():
  rng = np.random.default_rng(4)
  q, v = rng.normal(size=(3, 6)), rng.normal(size=(3, 5, 6))
  v[0, 1] *= 100  # Long vectors win the dot product, not the cosine.
  dot = metrics.egomcq_scores(q, v, cosine=False)
  cos = metrics.egomcq_scores(q, v)
  for n in range(3):
    for k in range(5):
      assert dot[n, k] == pytest.approx(q[n] @ v[n, k])
      want = q[n] @ v[n, k] / np.linalg.norm(q[n]) / np.linalg.norm(v[n, k])
      assert cos[n, k] == pytest.approx(want)


def _charades_loop(scores, labels, kind="quicksort"):
  """The reference: label-less videos scored -inf, then AP per class."""
  scores = scores.astype(np.float64).copy()
  scores[labels.sum(1) == 0] = -np.inf
  aps = []
  for c in range(scores.shape[1]):
    order = np.argsort(-scores[:, c], kind=kind)
    tp = labels[order, c] == 1
    if tp.sum() == 0:
      aps.append(float("nan"))
      continue
    precision = np.cumsum(tp) / np.arange(1, len(tp) + 1)
    aps.append(sum(precision[i] for i in range(len(tp)) if tp[i]) / tp.sum())
  return np.array(aps)


def test_charades_map_equals_the_reference_loop():
  rng = np.random.default_rng(5)
  scores = rng.normal(size=(60, 7))
  labels = (rng.random((60, 7)) < 0.2).astype(int)
  labels[:5] = 0  # Videos without a label.
  labels[5, :] = 1  # Every class has a positive.
  got = metrics.charades_map(scores, labels)
  assert got["classes_left_out"] == 0
  assert got["mAP"] == pytest.approx(np.mean(_charades_loop(scores, labels)))
  # Ties: the lower index first, in both.
  tied = np.round(scores, 0)
  want = np.mean(_charades_loop(tied, labels, kind="stable"))
  assert metrics.charades_map(tied, labels)["mAP"] == pytest.approx(want)
  # Two classes without a positive: the reference says NaN, we leave them out.
  labels[:, [1, 4]] = 0
  ref = _charades_loop(scores, labels)
  assert np.isnan(np.mean(ref))
  got = metrics.charades_map(scores, labels)
  assert got == {"mAP": pytest.approx(np.nanmean(ref)), "classes_left_out": 2}
  # A perfect ranking scores 1.
  assert metrics.charades_map(labels + 0.0, labels)["mAP"] == 1.0
  with pytest.raises(ValueError, match="no class has a positive"):
    metrics.charades_map(scores, np.zeros_like(labels))
