"""The text-prompt classifier: classes made of texts, scored by cosine.

Every zero-shot evaluation (EGTEA, Charades-Ego, EK-100 CLS) and the labels
of one's own videos use this one classifier, as CLIP and LaViLa build it:

1. each class is one or more texts (a name, or for EK-100 every distinct
   narration of the action), each put into every prompt template
   (`'{}'`, or LaViLa's Ego4D-style `'#C C {}'`, `'#C {}'`);
2. every (text, template) string is embedded by the text tower and
   L2-normalised; a class is the mean of its strings' embeddings,
   L2-normalised again;
3. a video's logits are the cosine similarities of its L2-normalised
   embedding with the class embeddings;
4. the views of one video (clips x crops) are reduced by the mean or the
   max of their logits (`max` is LaViLa's zero-shot EGTEA protocol).

Each distinct string is embedded once however many classes use it; a class
still averages over its own list as given (a text listed twice weighs
twice), as a plain loop over classes would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from vidjax.tasks import metrics

__all__ = [
  "LAVILA_TEMPLATES",
  "REDUCTIONS",
  "class_embeddings",
  "classify",
  "l2_normalize",
  "logits",
  "reduce_views",
]

# LaViLa's `--cls-use-template` prompts, in Ego4D's narration style.
LAVILA_TEMPLATES = ("#C C {}", "#C {}")
REDUCTIONS = ("mean", "max")


def l2_normalize(x, axis: int = -1) -> np.ndarray:
  """float32 `x / ||x||` along `axis`; a zero vector stays zero."""
  x = np.asarray(x, np.float32)
  norm = np.linalg.norm(x, axis=axis, keepdims=True)
  return x / np.maximum(norm, np.finfo(np.float32).tiny)


def _class_lists(class_texts) -> list[list[str]]:
  if isinstance(class_texts, str) or not len(class_texts):
    raise ValueError(
      "zeroshot: class_texts must be a non-empty sequence of classes "
      "(each a text or a list of texts)"
    )
  lists = []
  for c, texts in enumerate(class_texts):
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts:
      raise ValueError(
        f"zeroshot: class {c} has no text; give every class at least one "
        "(its name, or its narrations)"
      )
    for t in texts:
      if not isinstance(t, str) or not t.strip():
        raise ValueError(
          f"zeroshot: class {c} has an empty or non-string text {t!r}"
        )
    lists.append(texts)
  return lists


def _check_templates(templates: Sequence[str]) -> list[str]:
  if isinstance(templates, str) or not len(templates):
    raise ValueError(
      "zeroshot: templates must be a non-empty sequence such as ('{}',)"
    )
  for t in templates:
    if not isinstance(t, str) or t.count("{}") != 1:
      raise ValueError(
        f"zeroshot: template {t!r} must hold '{{}}' exactly once (where the "
        "class text goes)"
      )
  return list(templates)


def _embed_strings(
  encode_text: Callable, tokenizer: Callable, strings: list[str], batch_size
) -> np.ndarray:
  """float32[len(strings), D], L2-normalised; fixed-size padded batches
  when `batch_size` is given (one compiled shape)."""
  tokens = np.asarray(tokenizer(strings))
  if not batch_size:
    return l2_normalize(np.asarray(encode_text(tokens), np.float32))
  pad = -len(tokens) % batch_size
  tokens = np.concatenate([tokens, np.zeros_like(tokens[:1]).repeat(pad, 0)])
  out = [
    np.asarray(encode_text(tokens[s : s + batch_size]), np.float32)
    for s in range(0, len(tokens), batch_size)
  ]
  return l2_normalize(np.concatenate(out)[: len(strings)])


def class_embeddings(
  encode_text: Callable,
  tokenizer: Callable,
  class_texts: Sequence[str | Sequence[str]],
  templates: Sequence[str] = ("{}",),
  *,
  batch_size: int | None = None,
) -> np.ndarray:
  """Class embeddings of a text-prompt classifier (steps 1-2 of the note).

  Args:
    encode_text: int32[B, L] tokens -> float[B, D] text embeddings
      (unnormalised is fine), e.g. a CLIP model's `encode_text`.
    tokenizer: list of B strings -> int32[B, L] (a `vidjax.data.tokenizer
      .Tokenizer`).
    class_texts: C classes, each a string or a non-empty list of strings.
    templates: prompt templates, each holding `{}` once.
    batch_size: strings per `encode_text` call, the last call padded (so a
      jitted tower compiles once); None embeds all strings in one call.

  Returns:
    float32[C, D], each row L2-normalised.

  Raises:
    ValueError: no class, a class without text, or a template without `{}`.
  """
  lists = _class_lists(class_texts)
  templates = _check_templates(templates)
  strings, where = [], {}
  rows = []  # Per class: the index of each of its (text, template) strings.
  for texts in lists:
    idx = []
    for tmpl in templates:
      for text in texts:
        s = tmpl.format(text)
        if s not in where:
          where[s] = len(strings)
          strings.append(s)
        idx.append(where[s])
    rows.append(idx)
  emb = _embed_strings(encode_text, tokenizer, strings, batch_size)
  flat = np.concatenate(rows)
  owner = np.repeat(np.arange(len(rows)), [len(r) for r in rows])
  sums = np.zeros((len(rows), emb.shape[1]), np.float64)
  np.add.at(sums, owner, emb[flat])
  means = sums / np.array([len(r) for r in rows], np.float64)[:, None]
  return l2_normalize(means)


def logits(video_emb, class_emb) -> np.ndarray:
  """Cosine logits (step 3): float32[N, C] from video embeddings
  float[N, D] (normalised here) and class embeddings float[C, D] (as
  `class_embeddings` returns them, already normalised)."""
  video = l2_normalize(video_emb)
  classes = np.asarray(class_emb, np.float32)
  if video.ndim != 2 or classes.ndim != 2 or video.shape[1] != classes.shape[1]:
    raise ValueError(
      f"zeroshot.logits: video {video.shape} and class {classes.shape} "
      "embeddings must be [N, D] and [C, D]"
    )
  return video @ classes.T


def reduce_views(values, example_ids, how: str = "mean"):
  """Reduces the views of each example (step 4).

  Args:
    values: float[M, C], one row per view (clip x crop).
    example_ids: int[M], the example of each view, in any order.
    how: 'mean' or 'max' (elementwise over the example's views).

  Returns:
    (ids, reduced): int[U] sorted unique ids and float64[U, C].
  """
  if how not in REDUCTIONS:
    raise ValueError(f"zeroshot: view reduction {how!r} not in {REDUCTIONS}")
  if how == "mean":
    return metrics.average_views(values, example_ids)
  values = np.asarray(values, np.float64)
  ids, group = np.unique(np.asarray(example_ids), return_inverse=True)
  out = np.full((len(ids),) + values.shape[1:], -np.inf)
  np.maximum.at(out, group.reshape(-1), values)
  return ids, out


def classify(video_emb, class_emb, example_ids=None, how: str = "mean"):
  """Logits of each example: `logits` of every view, then `reduce_views`.

  Args:
    video_emb: float[M, D], one row per view.
    class_emb: float32[C, D] from `class_embeddings`.
    example_ids: int[M] (None: every row is its own example).
    how: 'mean' or 'max' over an example's views.

  Returns:
    (ids, scores): int[U] and float64[U, C].
  """
  scores = logits(video_emb, class_emb)
  if example_ids is None:
    example_ids = np.arange(len(scores))
  return reduce_views(scores, example_ids, how)
