"""The model card an export writes (OUT/README.md).

What the model is (kind, sizes, frames, resolution, normalisation, the
tokenizer and context length, what it computes with), how it was trained
(steps, batch, accumulation, data files and their rows, the weights it
started from), its evaluation figures at the exported step (the run's
metrics.jsonl rows at that step) with their definitions, what the format's
own code must be told, a short PyTorch snippet that loads it and embeds a
clip, and the run's whole config.
"""

from __future__ import annotations

import gzip
import json

import vidjax
from vidjax.export import snippets
from vidjax.report import monitor

# What each figure means, by the last part of its name (metrics.jsonl).
DEFINITIONS = {
  "mAP_v2t": "EK-100 multi-instance retrieval: mean average precision, "
  "videos querying captions (relevant: relevancy >= the threshold)",
  "mAP_t2v": "the same, captions querying videos",
  "mAP_avg": "the mean of mAP_v2t and mAP_t2v",
  "nDCG_v2t": "EK-100 multi-instance retrieval: normalised discounted "
  "cumulative gain over the relevancy matrix, videos querying captions",
  "nDCG_t2v": "the same, captions querying videos",
  "nDCG_avg": "the mean of nDCG_v2t and nDCG_t2v",
  "v2t_r1": "recall@1: share of videos whose caption ranks first",
  "t2v_r1": "recall@1: share of captions whose video ranks first",
  "v2t_r5": "recall@5, videos querying captions",
  "t2v_r5": "recall@5, captions querying videos",
  "chance_r1": "recall@1 of a random ranking (the chance level)",
  "top1": "top-1 accuracy",
  "top5": "top-5 accuracy",
  "mean_class_acc": "the mean of the per-class top-1 accuracies",
  "chance_top1": "top-1 accuracy of a random guess",
  "mAP": "mean over classes of the average precision (videos without a "
  "label do not count)",
  "chance_mAP": "mAP of random scores",
  "inter_video": "EgoMCQ accuracy, the five answers from other videos",
  "intra_video": "EgoMCQ accuracy, the five answers from the same video",
  "chance_acc": "accuracy of a random answer",
  "loss": "the task's training or evaluation loss",
  "skipped": "clips that could not be read",
}
KINDS = {
  "clip": "a video-text dual encoder (CLIP-style, as AVION and LaViLa)",
  "videomae": "a VideoMAE masked autoencoder (pretraining: encoder and decoder)",
  "classifier": "a video classifier (ViT, pooling, linear head)",
  "umt": "an unmasked-teacher student (UMT)",
}


def metrics_at(workdir, step: int) -> dict:
  """The run's metrics.jsonl rows at `step`, merged ({} if none)."""
  try:
    rows = monitor.read_metrics(workdir)
  except FileNotFoundError:
    return {}
  merged = {}
  for row in rows:
    if row.get("step") == step:
      merged.update(row)
  merged.pop("step", None)
  return merged


def _rows(path: str) -> str:
  """A data file's rows (lines; a CSV's header not counted), or why not."""
  if not path:
    return ""
  try:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
      lines = sum(1 for line in f if line.strip())
  except OSError:
    return f"`{path}` (not readable where the export ran)"
  header = path.endswith((".csv", ".csv.gz"))
  return f"`{path}`: {lines - header} rows"


def _describe(model) -> list[str]:
  vision = model.vision
  blocks, (height, width) = vision.blocks, vision.image_size
  augment = model.config.get("augment") or {}
  data = model.config.get("data") or {}
  lines = [
    f"- kind: {KINDS.get(model.kind, model.kind)}",
    f"- vision tower: ViT, width {blocks.width}, {blocks.depth} blocks, "
    f"{blocks.heads} heads, MLP {blocks.mlp_dim}, patches {vision.patch_size} "
    f"px, tubelets of {vision.tubelet} frame(s), pooling {vision.pool!r}",
    f"- input: {vision.num_frames} RGB frames of {height}x{width}, "
    f"normalised as (x / 255 - mean) / std, mean {augment.get('mean')}, "
    f"std {augment.get('std')}",
    "- computes with: "
    + ", ".join(f"{k}={v!r}" for k, (v, _) in sorted(model.facts.items())),
  ]
  if model.kind == "clip":
    text = model.spec.text
    lines += [
      f"- text tower: width {text.blocks.width}, {text.blocks.depth} "
      f"blocks, {text.blocks.heads} heads, vocabulary {text.vocab_size}, "
      f"context length {text.context_length}; tokenizer: CLIP's BPE with "
      f"the vocabulary `{data.get('vocab') or 'bundled with vidjax'}`",
      f"- joint embedding: {vision.output_dim}-d (unnormalised; "
      "L2-normalise for cosine similarity)",
    ]
  if model.kind == "classifier":
    lines.append(f"- classes: {model.spec.num_classes}")
  return lines


def _training(model, checkpoint) -> list[str]:
  config, data = model.config, model.config.get("data") or {}
  optim = config.get("optim") or {}
  lines = [
    f"- step {checkpoint.step} of {config.get('total_steps')} "
    f"({checkpoint.chosen}), task {config.get('task')!r}",
    f"- batch: {config.get('batch_size')} clips per step, gradient "
    f"accumulation {config.get('accum_steps', 1)}",
    f"- optimizer: {optim.get('name', '?')}, learning rate "
    f"{optim.get('lr', '?')}, schedule {optim.get('schedule', '?')}",
    f"- started from: `{config.get('init_from')}`"
    if config.get("init_from")
    else "- started from: random initialisation",
  ]
  for key in ("train_annotations", "eval_annotations", "train_sentences"):
    if data.get(key):
      lines.append(f"- data.{key}: {_rows(data[key])}")
  return lines


def _evaluation(figures: dict) -> list[str]:
  if not figures:
    return ["No figures were logged at this step."]
  lines = ["| metric | value | definition |", "| --- | --- | --- |"]
  for name, value in sorted(figures.items()):
    shown = f"{value:.6g}" if isinstance(value, float) else value
    meaning = DEFINITIONS.get(name.rsplit("/", 1)[-1], "")
    lines.append(f"| `{name}` | {shown} | {meaning} |")
  return lines


def model_card(model, checkpoint, fmt: str, files, out: str) -> str:
  """OUT/README.md's text.

  Args:
    model: the exported `formats.Model`.
    checkpoint: where it came from (`Checkpoint`).
    fmt: the format written.
    files: what the format wrote (`formats.Files`).
    out: OUT's absolute path (the snippet loads from it).
  """
  written = sorted({*files.tensors, *files.pickles, *files.json})
  sections = [
    f"# vidjax {model.kind}, step {checkpoint.step} ({fmt} format)",
    "",
    f"Exported by `python -m vidjax.export` (vidjax {vidjax.__version__}) "
    f"from `{checkpoint.directory}/{checkpoint.step}`. Files: "
    + ", ".join(f"`{name}`" for name in written)
    + ".",
    "",
    "## The model",
    *_describe(model),
    "",
    "## How it was trained",
    *_training(model, checkpoint),
    "",
    f"## Evaluation at step {checkpoint.step}",
    "",
    f"From the run's metrics.jsonl (`{checkpoint.workdir}`).",
    "",
    *_evaluation(metrics_at(checkpoint.workdir, checkpoint.step)),
    "",
    "## Loading it",
    "",
    *[f"- {note}" for note in files.notes + files.skipped],
    "",
    "```python",
    snippets.snippet(model, fmt, out, files.notes),
    "```",
    "",
    "## The run's config",
    "",
    "```json",
    json.dumps(model.config, indent=1, sort_keys=True),
    "```",
    "",
  ]
  return "\n".join(sections)


def snippet_of(card_text: str) -> str:
  """The PyTorch snippet in a card's text (the first python block)."""
  start = card_text.index("```python\n") + len("```python\n")
  return card_text[start : card_text.index("```", start)]
