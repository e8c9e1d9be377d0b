"""The text-prompt classifier against a plain loop of its definition."""

from __future__ import annotations

import numpy as np
import pytest

from vidjax.data import synthetic
from vidjax.data.tokenizer import Tokenizer
from vidjax.evaluation import zeroshot


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  return Tokenizer(synthetic.write_vocab(tmp_path_factory.mktemp("v") / "v.gz"))


def _tower(dim=12, seed=0):
  """A text tower: the sum of a random embedding per token id (pad 0 = 0)."""
  table = np.random.default_rng(seed).normal(size=(49408, dim))
  table[0] = 0
  calls = []

  def encode_text(tokens):
    calls.append(tokens.shape)
    return table[np.asarray(tokens)].sum(1)

  return encode_text, calls


def _reference(encode_text, tokenizer, labels, templates):
  """CLIP's / LaViLa's loop: per class, embed, normalise, mean, normalise."""
  out = []
  for label in labels:
    label = [label] if isinstance(label, str) else label
    texts = [t.format(x) for t in templates for x in label]
    e = np.asarray(encode_text(tokenizer(texts)), np.float64)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    m = e.mean(0)
    out.append(m / np.linalg.norm(m))
  return np.stack(out)


@pytest.mark.parametrize("batch_size", [None, 3])
def test_class_embeddings_equal_the_plain_loop(tokenizer, batch_size):
  encode, calls = _tower()
  classes = [
    "open drawer",
    ["cut onion", "cut the onion", "cut onion"],  # Duplicates weigh twice.
    ["take cup"],
    "open drawer",  # Two classes with the same text: equal rows.
  ]
  templates = zeroshot.LAVILA_TEMPLATES
  got = zeroshot.class_embeddings(
    encode, tokenizer, classes, templates, batch_size=batch_size
  )
  rows = sum(s[0] for s in calls)
  shapes = {s[0] for s in calls}
  want = _reference(encode, tokenizer, classes, templates)
  assert got.dtype == np.float32 and got.shape == (4, 12)
  np.testing.assert_allclose(got, want, atol=1e-6)
  np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-6)
  np.testing.assert_array_equal(got[0], got[3])
  # Each distinct string once: 4 texts x 2 templates (padded to 9 by 3s).
  assert rows == (8 if batch_size is None else 9)
  if batch_size:
    assert shapes == {batch_size}


def test_refusals(tokenizer):
  encode, _ = _tower()
  with pytest.raises(ValueError, match="class 1 has no text"):
    zeroshot.class_embeddings(encode, tokenizer, ["a", []])
  with pytest.raises(ValueError, match="non-empty sequence of classes"):
    zeroshot.class_embeddings(encode, tokenizer, [])
  with pytest.raises(ValueError, match="empty or non-string"):
    zeroshot.class_embeddings(encode, tokenizer, ["a", ["b", " "]])
  with pytest.raises(ValueError, match="exactly once"):
    zeroshot.class_embeddings(encode, tokenizer, ["a"], ["a photo"])
  with pytest.raises(ValueError, match="view reduction"):
    zeroshot.reduce_views(np.zeros((2, 3)), [0, 0], "median")


def test_logits_and_views_equal_the_plain_loop():
  rng = np.random.default_rng(1)
  classes = zeroshot.l2_normalize(rng.normal(size=(5, 8)))
  views = rng.normal(size=(9, 8)) * rng.uniform(0.1, 10, size=(9, 1))
  ids = np.array([2, 0, 2, 1, 0, 2, 1, 1, 0]) * 10
  views[3] = views[6]  # A tie between two views of example 10.
  got = zeroshot.logits(views, classes)
  for i, v in enumerate(views):
    for c, k in enumerate(classes):
      cos = v @ k / np.linalg.norm(v) / np.linalg.norm(k)
      assert abs(got[i, c] - cos) < 1e-5
  for how, fn in (("mean", np.mean), ("max", np.max)):
    uid, red = zeroshot.classify(views, classes, ids, how)
    np.testing.assert_array_equal(uid, [0, 10, 20])
    for row, u in enumerate(uid):
      np.testing.assert_allclose(red[row], fn(got[ids == u], 0), atol=1e-6)
  # Without ids every view is its own example.
  _, own = zeroshot.classify(views, classes)
  np.testing.assert_allclose(own, got, atol=1e-6)
  with pytest.raises(ValueError, match=r"\[N, D\] and \[C, D\]"):
    zeroshot.logits(views, classes[:, :4])
