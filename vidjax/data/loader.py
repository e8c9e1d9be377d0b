"""Grain element loader: clip record -> decoded uint8 clip + tokens / labels.

`ClipLoader` is the per-element work that Grain runs in its worker processes
(or threads). In training it is a random map: frame sampling, crop geometry
and flip come from the `np.random.Generator` that Grain derives from the seed
and the element's index, so a run's batches do not depend on the number of
workers. In evaluation it is a plain map over (record, clip view, crop view).

Every element is a dict of numpy arrays (`element_spec`):
  video    uint8[T, H, W, 3]   RGB frames
  tokens   int32[L]            if the records have text and a tokenizer is set
                               (L: its context length, CLIP's 77)
  label    int32[]             if the records have labels (also verb / noun for
                               EPIC-Kitchens-100)
  relevancy_row, relevancy_column, caption_verb  int32[]; nouns, caption_nouns
           int32[K]            with `pairs`: the clip's row of the training
                               relevancy, its caption's column (-1: its own
                               narration), their classes
                               (`vidjax.data.annotations.ek100_classes`)
  (of these targets, only those named by `targets` when given: the task's)
  index    int32[]             the record actually loaded
  view     int32[]             evaluation view (clip * num_crops + crop); 0 in training
  valid    bool[]              False when no clip could be read
  skipped  int32[]             failed reads before this element was produced
  errors   str                 their messages ("" when none), for the report

A video that fails to read (`VideoReadError`) is replaced in training by
another record drawn from the element's own generator, so the replacement is
deterministic; after `max_attempts` failures the element comes out invalid
(kept out of every loss and metric). In evaluation a failure gives an
invalid element, and so do the elements past the last view (the
pipeline's padding to whole batches).

The caption of a training element also comes from its generator: one of the
captions its clip is relevant to (EK-100 MIR, `positives`), else one of the
record's alternative narrations (`extra['texts']`, LaViLa's LLM-generated
lists), else its narration. Evaluation always uses the narration.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses

import numpy as np

from vidjax.base.errors import DataFileError
from vidjax.config import defaults
from vidjax.data import annotations, crop as crop_lib, sampling, video, workers
from vidjax.data.annotations import ek100, ek100_classes

# What an element may carry: the tokens, labels, and the classes behind the
# in-batch relevancy (EK-100 MIR's relevancy-aware losses, `pairs`).
TARGETS = ("tokens", "label", "verb", "noun") + ek100_classes.KEYS


@dataclasses.dataclass(frozen=True)
class ClipSpec:
  """How a record becomes a clip.

  Attributes:
    num_frames: frames per clip (T).
    sampling: 'segment' (one frame in each of T equal segments: LaViLa/AVION)
      or 'stride' (T frames `stride` apart: VideoMAE/Kinetics).
    stride: frame stride for 'stride' sampling.
    size: output (H, W).
    crop: training crop, 'random_resized' (AVION; scale `crop_scale`),
      'multi_scale' (VideoMAE) or 'center'.
    crop_scale: area range of the random-resized crop.
    hflip: probability of a decode-time horizontal flip in training.
    eval_clips: clips per record in evaluation (spread evenly).
    eval_crops: crops per clip in evaluation (1: centre; 3: along the long side).
  """

  num_frames: int = 16
  sampling: str = "segment"
  stride: int = 4
  size: tuple[int, int] = (224, 224)
  crop: str = "random_resized"
  crop_scale: tuple[float, float] = (0.5, 1.0)
  hflip: float = 0.5
  eval_clips: int = 1
  eval_crops: int = 1

  def __post_init__(self):
    if self.sampling not in defaults.SAMPLINGS:
      raise ValueError(
        f"sampling must be one of {defaults.SAMPLINGS}, got {self.sampling!r}"
      )
    if self.crop not in defaults.CROPS:
      raise ValueError(
        f"crop must be one of {defaults.CROPS}, got {self.crop!r}"
      )

  @property
  def views(self) -> int:
    return self.eval_clips * self.eval_crops

  @classmethod
  def from_config(cls, data, *, train: bool = False) -> ClipSpec:
    """From `config.data` (its `size` an int side or (H, W)).

    With `train` and `data.repeats` > 1, the clips the host decodes for
    training: each its centred `data.repeat_canvas` window, unflipped; the
    device crops, flips and resizes the views (`vidjax.augment.views`).
    """
    size = (
      data.size if isinstance(data.size, (tuple, list)) else (data.size,) * 2
    )
    spec = cls(
      num_frames=data.num_frames,
      sampling=data.sampling,
      stride=data.stride,
      size=tuple(size),
      crop=data.crop,
      crop_scale=tuple(data.crop_scale),
      hflip=data.hflip,
      eval_clips=data.eval_clips,
      eval_crops=data.eval_crops,
    )
    if train and data.get("repeats", 1) > 1:
      spec = dataclasses.replace(
        spec, size=canvas_size(data), crop="center", hflip=0.0
      )
    return spec


def canvas_size(data) -> tuple[int, int]:
  """(H, W) of the clips decoded for repeated views: `data.repeat_canvas`,
  or (0, 0) for 8/7 of the output's height (even) at an aspect of 5:4 (or
  the output's, if wider): 256 x 320 for 224 x 224, the short side VideoMAE
  and MAE-ST scale their frames to before cropping 224."""
  height, width = (int(v) for v in data.repeat_canvas)
  if height > 0 and width > 0:
    return height, width
  out_h, out_w = ClipSpec.from_config(data).size
  height = 2 * round(out_h * 8 / 7 / 2)
  width = max(2 * round(height * 5 / 4 / 2), 2 * round(out_w * 8 / 7 / 2))
  return height, width


def element_spec(
  spec: ClipSpec,
  targets: Sequence[str],
  context_length: int = defaults.CONTEXT_LENGTH,
  max_nouns: int = 0,
) -> dict[str, tuple[tuple[int, ...], type]]:
  """(shape, dtype) of each array of an element carrying `targets` (of
  `TARGETS`), as in the module docstring; the `errors` string aside.
  `max_nouns`: K, the noun classes of the relevancy pairs' keys."""
  height, width = spec.size
  out = {"video": ((spec.num_frames, height, width, 3), np.uint8)}
  lengths = dict(
    tokens=context_length, nouns=max_nouns, caption_nouns=max_nouns
  )
  for key in TARGETS:
    if key in targets:
      out[key] = ((lengths[key],) if key in lengths else (), np.int32)
  out.update(
    index=((), np.int32),
    view=((), np.int32),
    valid=((), np.bool_),
    skipped=((), np.int32),
  )
  return out


class ClipLoader:
  """Loads element `index` of a record list (see the module docstring).

  `read_clip` is the reader it calls (`vidjax.data.video.read_clip`; the
  pipeline benchmark times the calls through a stand-in)."""

  def __init__(
    self,
    records: Sequence[annotations.ClipRecord],
    root: str,
    spec: ClipSpec,
    tokenizer=None,
    max_attempts: int = 10,
    positives: ek100.CaptionPositives | None = None,
    targets: Sequence[str] | None = None,
    pairs: ek100_classes.PairClasses | None = None,
    read_clip=video.read_clip,
  ):
    if not records:
      raise DataFileError("no records: the annotation file is empty")
    self.records, self.root, self.spec = list(records), str(root), spec
    self.tokenizer, self.max_attempts = tokenizer, max_attempts
    self.positives, self.read_clip = positives, read_clip
    self.pairs = pairs
    first = self.records[0]
    # Only the targets the task reads (`batches.target_keys`): two sets of
    # one shape then make batches of one structure, and one compiled step.
    wanted = set(TARGETS if targets is None else targets)
    carried = {
      "tokens": tokenizer is not None and first.text is not None,
      "label": first.label is not None,
      "verb": "verb_class" in first.extra,
      "noun": "noun_class" in first.extra,
      **{key: pairs is not None for key in ek100_classes.KEYS},
    }
    self.targets = tuple(k for k in TARGETS if k in wanted and carried[k])
    self._spec = element_spec(
      spec,
      self.targets,
      getattr(tokenizer, "context_length", defaults.CONTEXT_LENGTH),
      max_nouns=0 if pairs is None else pairs.nouns.shape[1],
    )

  # Grain calls this with (element, rng) in training (`random_map`).
  def train_element(self, index: int, rng: np.random.Generator) -> dict:
    index = int(index) % len(self.records)
    errors = []
    for _ in range(self.max_attempts):
      try:
        return self._element(index, rng, view=None, errors=errors)
      except video.VideoReadError as e:
        errors.append(str(e))
        index = int(rng.integers(len(self.records)))
    return self._invalid(index, 0, errors)

  # And with the element alone in evaluation (`map`).
  def eval_element(self, element: int) -> dict:
    index, view = divmod(int(element), self.spec.views)
    if index >= len(self.records):  # Padding to whole batches: nothing read.
      return self._invalid(0, 0, [])
    try:
      return self._element(index, None, view=view, errors=[])
    except video.VideoReadError as e:
      return self._invalid(index, view, [str(e)])

  def _element(
    self, index: int, rng, view: int | None, errors: list[str]
  ) -> dict:
    record = self.records[index]
    info = video.video_info(self.root, record.video_id)
    fps = float(info.frame_rate)
    # An open end (a whole-video record) stops at the video's last frame.
    end = min(record.end, info.num_frames / fps)
    lo, hi = sampling.clip_frame_range(
      min(record.start, end), end, fps, info.num_frames
    )
    ids = self._frame_ids(lo, hi, rng, view)
    box = self._crop(info.height, info.width, rng, view)
    # In a data worker, the frames are decoded into a /dev/shm block.
    frames = workers.clip_array(*self._spec["video"])
    try:
      clip = self.read_clip(
        self.root,
        record.video_id,
        ids,
        crop=box.box,
        size=self.spec.size,
        hflip=box.hflip,
        out=frames,
      )
    except BaseException:
      workers.release(frames)
      raise
    if frames is not None and not np.may_share_memory(clip, frames):
      workers.release(frames)  # A reader that made its own array.
    out = {"video": clip, **self._targets(index, rng)}
    out.update(
      index=np.int32(index),
      view=np.int32(view or 0),
      valid=np.bool_(True),
      skipped=np.int32(len(errors)),
      errors="\n".join(errors),
    )
    return out

  def _frame_ids(self, lo: int, hi: int, rng, view) -> np.ndarray:
    s = self.spec
    if view is None or s.eval_clips == 1:
      if s.sampling == "segment":
        return sampling.segment_frame_ids(lo, hi, s.num_frames, rng)
      return sampling.stride_frame_ids(lo, hi, s.num_frames, s.stride, rng)
    clip = view // s.eval_crops
    if s.sampling == "segment":  # Views shift the segment points evenly.
      seg = (hi - lo) / s.num_frames
      offset = (clip + 0.5) / s.eval_clips * seg
      return np.minimum(
        lo + (np.arange(s.num_frames) * seg + offset).astype(np.int64),
        max(hi - 1, lo),
      )
    return sampling.multi_view_frame_ids(
      lo, hi, s.num_frames, s.stride, s.eval_clips
    )[clip]

  def _crop(self, height: int, width: int, rng, view) -> crop_lib.Crop:
    s = self.spec
    if view is not None:
      if s.eval_crops == 1:
        return crop_lib.center_crop(None, height, width, s.size)
      return crop_lib.spatial_views(height, width, s.size, s.eval_crops)[
        view % s.eval_crops
      ]
    if s.crop == "random_resized":
      return crop_lib.random_resized_crop(
        rng, height, width, scale=s.crop_scale, flip_prob=s.hflip
      )
    if s.crop == "multi_scale":
      return crop_lib.multi_scale_crop(
        rng, height, width, s.size, flip_prob=s.hflip
      )
    return crop_lib.center_crop(rng, height, width, s.size, flip_prob=s.hflip)

  def _caption(self, index: int, rng) -> tuple[str, int]:
    """The element's caption (see the module docstring), and its column of
    the sentence file (-1: another text); rng None: eval."""
    record = self.records[index]
    if rng is not None:
      if self.positives is not None:
        column = self.positives.draw_column(index, rng)
        if column is not None:
          return self.positives.captions[column], column
      texts = record.extra.get("texts")
      if texts:
        return texts[int(rng.integers(len(texts)))], -1
    return record.text or "", -1

  def _targets(self, index: int, rng) -> dict:
    record, out = self.records[index], {}
    text, column = (
      self._caption(index, rng) if "tokens" in self.targets else ("", -1)
    )
    for key in self.targets:
      if key == "tokens":
        out[key] = self.tokenizer(text)[0].astype(np.int32)
      elif key == "label":
        out[key] = np.int32(record.label)
      elif key in ("verb", "noun"):  # EPIC-Kitchens-100's verb and noun.
        out[key] = np.int32(record.extra[f"{key}_class"])
    if self.pairs is not None:
      out.update(self.pairs.element(index, column))
    return out

  def _invalid(self, index: int, view: int, errors: list[str]) -> dict:
    """A zero clip marked invalid, same structure as a good element."""
    out = {
      k: np.zeros(shape, dtype)[()]  # [()]: 0-d ones as numpy scalars.
      for k, (shape, dtype) in self._spec.items()
    }
    out.update(
      index=np.int32(index),
      view=np.int32(view),
      skipped=np.int32(len(errors)),
      errors="\n".join(errors),
    )
    return out
