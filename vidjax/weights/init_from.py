"""`config.init_from`: fills the live parameters from pretrained weights.

A `Source` holds tensors already named by our parameter paths, with layers
unstacked (`visual.blocks.layers.3.attn.qkv.kernel`), in our layouts;
`weights.py` makes one from any released format, `sources.py` (and, for
a vidjax run, `vidjax.checkpoints.resume.read_init_from`) from what a path names. `fill`
matches it to the parameters of the model being trained:

1. A task change (CLIP -> classifier, VideoMAE -> classifier, ...) renames
   and drops whole parts (the text tower, the decoder) and names the parts
   that start fresh where the source has none of their shape (a new head,
   projections of another `embed_dim`). `keep_init` (`config.init_keep`)
   names parts not to load even if they fit.
2. Stacked layers (`scan=True`) are gathered from the per-layer tensors.
3. Positional tables are resized to the live model (temporal as AVION does,
   spatial bicubically) and one-frame patch kernels inflated to tubelets.
4. Anything else missing or not fitting is an `InitFromError` naming it.

What the source computes beyond its tensors (activation, LayerNorm eps,
pooling, temperature: `Source.facts`) sets the model's config before the
model is built (`vidjax.weights.facts`).

`load_params` (`fit_params`, then `place_params`: a run fits the weights to
its abstract state before compiling) puts each tensor on the sharding of the
live parameter it replaces (the model is never built a second time); a
`Report` says what was loaded, resized, dropped and left at its initial
value.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import re

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from vidjax.base import errors, keypaths, rundir
from vidjax.weights.tensor_io import (
  inflate_kernel,
  interpolate_pos_embed,
  interpolate_temporal,
)

InitFromError = errors.InitFromError  # Weights that do not fit the model.


@dataclasses.dataclass
class Source:
  """Pretrained tensors under our parameter paths.

  kind: the model they come from: 'clip', 'videomae' or 'classifier'.
  tensors: our path (layers unstacked) -> array in our layout.
  names: our path -> the tensor's name in the source, for messages.
  description: where it came from, e.g. 'ViT-B-16.pt (OpenAI CLIP)'.
  unexpected: source names that map to no parameter of `kind`.
  tubelet: frames per patch of the patch kernel (None: unknown).
  backbone: for classifiers, 'clip' or 'videomae'.
  facts: {key of config.model: (value, why)}: what the source computed with
    (`vidjax.weights.facts`), e.g. {'act': ('gelu', "AVION's ...")}.
  """

  kind: str
  tensors: dict[str, np.ndarray]
  names: dict[str, str]
  description: str
  unexpected: list[str] = dataclasses.field(default_factory=list)
  tubelet: int | None = 1
  backbone: str = ""
  facts: dict[str, tuple] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class TaskChange:
  """How a model of one kind initialises one of another.

  rename: (source prefix, target prefix) pairs.
  drop: (source prefix, why) of the parts the target does not use.
  fresh: (target prefix, why) of the parts that may keep their initial
    values: missing from the source, or of another shape (a head).
  optional: (source prefix, why) used only if the target has them.
  """

  rename: tuple = ()
  drop: tuple = ()
  fresh: tuple = ()
  optional: tuple = ()


_TEMPERATURE = (
  "logit_scale",
  "a fixed temperature: model.logit_scale_init "
  "(a video CLIP's own, an image CLIP's not)",
)
_NO_TEMPORAL = "an image model has no temporal table: it starts at zero"
_NEW_HEAD = "a new classification head"
_NEW_PROJECTION = "a projection to another model.embed_dim"
_DECODER = "the classifier has no decoder"
TASK_CHANGES = {
  ("clip", "clip"): TaskChange(
    fresh=(
      ("visual.temporal_pos", _NO_TEMPORAL),
      ("visual.proj.", _NEW_PROJECTION),
      ("text.proj.", _NEW_PROJECTION),
    ),
    optional=(_TEMPERATURE,),
  ),
  ("clip", "classifier"): TaskChange(
    rename=(("visual.", "encoder."),),
    drop=(
      ("text.", "the classifier has no text tower"),
      ("visual.proj.", "the classifier has no projection"),
      ("logit_scale", "the classifier has no temperature"),
    ),
    fresh=(("head.", _NEW_HEAD), ("encoder.temporal_pos", _NO_TEMPORAL)),
  ),
  ("videomae", "videomae"): TaskChange(),
  ("videomae", "classifier"): TaskChange(
    drop=(
      ("encoder_to_decoder.", _DECODER),
      ("mask_token", _DECODER),
      ("decoder", _DECODER),
      # VideoMAE's fine-tuning starts its pooled norm (fc_norm)
      # fresh; the pretraining's per-token norm is not used.
      ("encoder.norm.", "fc_norm starts fresh, as in VideoMAE"),
    ),
    fresh=(
      ("head.", _NEW_HEAD),
      ("encoder.norm.", "fc_norm starts fresh, as in VideoMAE"),
    ),
  ),
  # A distilled student (`vidjax.models.umt`): its encoder is a VideoMAE
  # encoder's; the heads that aligned it to its teacher are not used.
  ("umt", "umt"): TaskChange(),
  ("umt", "classifier"): TaskChange(
    drop=(
      ("align.", "the alignment heads of the distillation"),
      ("encoder.norm.", "fc_norm starts fresh, as in VideoMAE"),
    ),
    fresh=(
      ("head.", _NEW_HEAD),
      ("encoder.norm.", "fc_norm starts fresh, as in VideoMAE"),
    ),
  ),
  ("classifier", "classifier"): TaskChange(
    fresh=(("head.", _NEW_HEAD), ("encoder.temporal_pos", _NO_TEMPORAL))
  ),
}


@dataclasses.dataclass
class Report:
  """What `fill` did: target paths loaded, resized or fresh; source names
  dropped. `resized`, `dropped` and `fresh` map each name to how or why.
  `facts`: what the source computed with ({'model.act': 'gelu', ...});
  `settled`: the config keys set from them (`facts.settle`'s lines)."""

  source: str
  change: str
  loaded: list[str] = dataclasses.field(default_factory=list)
  resized: dict[str, str] = dataclasses.field(default_factory=dict)
  dropped: dict[str, str] = dataclasses.field(default_factory=dict)
  fresh: dict[str, str] = dataclasses.field(default_factory=dict)
  facts: dict[str, object] = dataclasses.field(default_factory=dict)
  settled: list[str] = dataclasses.field(default_factory=list)

  def summary(self) -> str:
    """A few lines for the start-up log; names grouped by reason."""
    lines = [
      f"{self.source}, {self.change}: {len(self.loaded)} loaded, "
      f"{len(self.resized)} resized, {len(self.dropped)} dropped, "
      f"{len(self.fresh)} at their initial values"
    ]
    if self.facts:
      lines.append(
        "  computed with "
        + ", ".join(
          f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v!r}"
          for k, v in self.facts.items()
        )
      )
    lines += [f"  set {line}" for line in self.settled]
    lines += [f"  resized {name}: {how}" for name, how in self.resized.items()]
    for title, names in (("dropped", self.dropped), ("fresh", self.fresh)):
      by_reason = {}
      for name, why in names.items():
        by_reason.setdefault(why, []).append(name)
      for why, group in by_reason.items():
        shown = ", ".join(group[:3]) + (", ..." if len(group) > 3 else "")
        lines.append(f"  {title} ({len(group)}, {why}): {shown}")
    return "\n".join(lines)

  def log(self, workdir=None):
    """Logs the summary; process 0 writes WORKDIR/init_from.json."""
    logging.info("init_from: %s", self.summary())
    if workdir is not None:
      rundir.write_json(
        rundir.path(workdir, rundir.INIT_FROM_JSON),
        dataclasses.asdict(self),
        indent=1,
      )


def _match(name: str, rules) -> str | None:
  """The reason of the first (prefix, reason) rule that `name` starts with."""
  return next((why for prefix, why in rules if name.startswith(prefix)), None)


def _fit(
  path: str,
  value: np.ndarray,
  shape: tuple,
  *,
  inflate: int,
  patch_inflation: str,
) -> tuple[np.ndarray | None, str]:
  """`value` made to `shape` (resized if its kind allows), or (None, '')."""
  if value.shape == tuple(shape):
    return value, ""
  if value.ndim != len(shape) or value.shape[-1] != shape[-1]:
    return None, ""
  if path.endswith("temporal_pos"):
    how = "linear interpolation" if shape[0] > value.shape[0] else "truncated"
    return interpolate_temporal(value, shape[0]), how
  if path.endswith("spatial_pos"):
    try:
      return interpolate_pos_embed(value, shape[0]), "bicubic interpolation"
    except ValueError:
      return None, ""
  if path.endswith("patch_embed.kernel") and inflate > 1:
    kernel = inflate_kernel(value, inflate, patch_inflation)
    if kernel.shape == tuple(shape):
      return kernel, f"inflated to {inflate} frames ({patch_inflation})"
  return None, ""


def _renamed(
  source: Source, change: TaskChange, keep_init: tuple, report: Report
) -> dict[str, tuple[np.ndarray, str]]:
  """The source's tensors the target may use, under the target's paths:
  {path: (array, name in the source)}. The rest go to `report.dropped`."""
  tensors = {}
  for path, value in source.tensors.items():
    name = source.names.get(path, path)
    why = _match(path, change.drop)
    if why is None:
      for old, new in change.rename:
        if path.startswith(old):
          path = new + path[len(old) :]
          break
      if path.startswith(keep_init):
        why = "config.init_keep"
    if why:
      report.dropped[name] = why
    else:
      tensors[path] = value, name
  return tensors


def fill(
  target: dict[str, tuple],
  source: Source,
  kind: str,
  *,
  tubelet: int = 1,
  keep_init=(),
  patch_inflation: str = "center",
) -> tuple[dict[str, np.ndarray], Report]:
  """Matches a source to a model's parameters.

  Args:
    target: the model's parameter paths -> shapes (stacked layers have a
      leading depth axis).
    source: the pretrained tensors.
    kind: the model's kind ('clip', 'videomae' or 'classifier').
    tubelet: the model's frames per patch (one-frame kernels are inflated).
    keep_init: target path prefixes left at their initial values even if
      the source has them and they fit (`config.init_keep`).
    patch_inflation: 'center' or 'average' (see `inflate_kernel`).

  Returns:
    ({target path: array of the target's shape}, report). Paths not in the
    dict keep their initial values.

  Raises:
    InitFromError: listing every missing, unexpected and misfitting tensor.
  """
  change = TASK_CHANGES.get((source.kind, kind))
  if change is None:
    raise InitFromError(
      f"{source.description} holds a {source.kind} model; "
      f"it cannot initialise a {kind} model"
    )
  if (source.kind, kind) == ("videomae", "classifier") and source.facts.get(
    "pool", ("",)
  )[0] == "token":
    # A Hugging Face encoder saved with use_mean_pooling=False: its own
    # classifier (VideoMAEForVideoClassification.from_pretrained) normalises
    # every token with its last LayerNorm and classifies the first.
    change = dataclasses.replace(
      change, drop=tuple(d for d in change.drop if d[0] != "encoder.norm.")
    )
  report = Report(
    source.description,
    f"{source.kind} -> {kind}",
    facts={f"model.{k}": v for k, (v, _) in source.facts.items()},
  )
  keep_init = tuple(keep_init)
  tensors = _renamed(source, change, keep_init, report)
  values, missing, mismatched, used = {}, [], [], set()
  for path, shape in sorted(target.items()):
    stacked = is_stacked(path)
    parts = layer_names(path, shape[0]) if stacked else [path]
    present = [p for p in parts if p in tensors]
    used.update(present)
    if not present:
      why = (
        "config.init_keep"
        if keep_init and path.startswith(keep_init)
        else _match(path, change.fresh)
      )
      if why is None:
        missing.append(path)
      else:
        report.fresh[path] = why
      continue
    missing += [p for p in parts if p not in tensors]
    inflate = tubelet if source.tubelet == 1 else 1
    fitted = [
      _fit(
        path,
        tensors[p][0],
        shape[1:] if stacked else shape,
        inflate=inflate,
        patch_inflation=patch_inflation,
      )
      for p in present
    ]
    if any(value is None for value, _ in fitted):
      name, value = tensors[present[0]][1], tensors[present[0]][0]
      why = _match(path, change.fresh)
      if why is None:
        mismatched.append((name, value.shape, path, tuple(shape)))
      else:
        report.dropped[name] = f"{value.shape} does not fit {tuple(shape)}"
        report.fresh[path] = why
      continue
    values[path] = np.stack([v for v, _ in fitted]) if stacked else fitted[0][0]
    if fitted[0][1]:
      report.resized[path] = (
        f"{tensors[present[0]][0].shape} -> {tuple(shape)}, {fitted[0][1]}"
      )
    else:
      report.loaded.append(path)
  unexpected = list(source.unexpected)
  for path in sorted(set(tensors) - used):
    why = _match(path, change.optional)
    if why:
      report.dropped[tensors[path][1]] = why
    else:
      unexpected.append(tensors[path][1])
  if missing or unexpected or mismatched:
    raise InitFromError(
      *_problems(
        source,
        kind,
        missing,
        unexpected,
        mismatched,
        keep_init,
        tensors,
        target,
      )
    )
  return values, report


_SHOWN = 3  # Names shown per kind of problem; the rest are counted.


def _layers(names, depth_of=None) -> dict[str, int]:
  """{tower: layers}: from per-layer names ('visual.blocks.layers.3.mlp...'),
  and with `depth_of` {path: shape} from stacked paths' leading axis."""
  out: dict[str, int] = {}
  for path, shape in (depth_of or {}).items():
    if is_stacked(path):
      tower = path.split(".")[0]
      out[tower] = max(out.get(tower, 0), shape[0])
  for name in names:
    found = re.match(r"([^.]+)\..*?\.layers\.(\d+)\.", name)
    if found:
      tower = found[1]
      out[tower] = max(out.get(tower, 0), int(found[2]) + 1)
  return out


def _problems(
  source, kind, missing, unexpected, mismatched, keep_init, tensors, target
) -> tuple[str, str]:
  """(message, hint) for weights that do not fit: a few names of each kind
  of problem; weights of another architecture (misfits in two towers, or
  other depths) named as such, both side by side, with a hint that can
  work; a misfit in one tower: config.init_keep for it."""

  def listing(title, names):
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    shown = ", ".join(names[:_SHOWN]) + more
    return f"\n  {title} ({len(names)}): {shown}" if names else ""

  misfits = [f"{n} {a} -> {p} {b}" for n, a, p, b in mismatched]
  towers = {p.split(".")[0] for p in missing} | {
    p.split(".")[0] for _, _, p, _ in mismatched
  }
  theirs, ours = _layers(tensors), _layers(target, target)
  other_depth = any(theirs.get(t, n) != n for t, n in ours.items())
  if len(towers) > 1 or (other_depth and mismatched):

    def sizes(layers):
      return ", ".join(f"{t} {n} layers" for t, n in sorted(layers.items()))

    example = (
      f"\n  e.g. {mismatched[0][2]}: {mismatched[0][1]} in the weights, "
      f"{mismatched[0][3]} in the model"
      if mismatched
      else ""
    )
    return (
      f"{source.description} holds another architecture than the "
      f"configured {kind} model ({len(missing)} tensors missing, "
      f"{len(mismatched)} of other shapes):\n  the weights: "
      f"{sizes(theirs) or '?'}; the model: {sizes(ours) or '?'}" + example,
      "configure the weights' architecture (a vidjax run's: the recipe it "
      "trained with, e.g. configs/demo.py for the demo's), or start from "
      "weights of this one",
    )
  hint = ""
  if mismatched and not keep_init:
    (tower,) = towers
    hint = (
      "to start that part fresh instead, name it in config.init_keep: "
      f"--config.init_keep=\"('{tower}.',)\""
    )
  return (
    f"{source.description} does not fit the {kind} model:"
    + listing("missing", sorted(missing))
    + listing("unexpected", sorted(unexpected))
    + listing("shapes differ", misfits),
    hint,
  )


def is_stacked(path: str) -> bool:
  """Whether a parameter holds every layer of a scanned block stack, with a
  leading [depth] axis: 'visual.blocks.layers.mlp.fc1.kernel'."""
  return re.search(r"\.layers\.(?!\d)", path) is not None


def layer_names(path: str, depth: int) -> list[str]:
  """A stacked parameter's per-layer names: 'visual.blocks.layers.0.mlp...'."""
  return [path.replace(".layers.", f".layers.{i}.", 1) for i in range(depth)]


def fit_params(
  params,
  model_config,
  source: Source,
  *,
  keep_init=(),
  patch_inflation: str = "center",
) -> tuple[dict[str, np.ndarray], Report]:
  """The source's arrays fitted to a parameter tree's shapes (`fill`),
  before anything is initialised or compiled: weights that do not fit are
  refused here.

  Args:
    params: the model's parameters: an nnx.State of jax.Arrays or of
      ShapeDtypeStructs (the abstract state: only shapes are read).
    model_config: `config.model` (its `name` and `tubelet` are read).
    source: from `vidjax.checkpoints.resume.read_start`.
    keep_init: see `fill` (`config.init_keep`).
    patch_inflation: see `fill`.

  Returns:
    ({parameter name: array of its shape}, `Report`), for `place_params`.
  """
  if model_config.name == "classifier" and model_config.backbone not in (
    "",
    source.backbone,
  ):
    raise InitFromError(
      f"{source.description} has a {source.backbone} "
      "backbone but config.model.backbone is "
      f"{model_config.backbone!r}"
    )
  return fill(
    {
      keypaths.name(k): leaf.shape
      for k, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    },
    source,
    model_config.name,
    tubelet=model_config.tubelet,
    keep_init=keep_init,
    patch_inflation=patch_inflation,
  )


def place_params(params, values: dict[str, np.ndarray]):
  """`params` with `fit_params`'s arrays in place, each on its leaf's
  sharding (every process holds the whole array; each device takes its
  slice); the others keep their value."""

  def put(keypath, leaf):
    value = values.get(keypaths.name(keypath))
    if value is None:
      return leaf
    value = np.asarray(value, leaf.dtype)
    sharding = getattr(leaf, "sharding", None)
    if sharding is None:
      return jnp.asarray(value)
    return jax.make_array_from_callback(
      value.shape, sharding, lambda index: value[index]
    )

  return jax.tree_util.tree_map_with_path(put, params)


def load_params(params, model_config, source: Source, **kw):
  """Fills a live parameter tree: `fit_params` then `place_params`.

  Returns:
    (params with the loaded values, `Report`). Parameters the source does
    not provide keep their value.
  """
  values, report = fit_params(params, model_config, source, **kw)
  return place_params(params, values), report


def build(make: Callable[[], nnx.Module], source: Source, kind: str, **kw):
  """`make()`'s model with the source's weights, for standalone use.

  Args:
    make: builds the model (run abstractly, then only what is not loaded is
      initialised, by a jitted init that XLA prunes to those variables).
    source: the pretrained tensors.
    kind: the model's kind.
    **kw: `fill`'s keyword arguments (tubelet, keep_init, patch_inflation).
  """
  abstract = nnx.eval_shape(make)
  flat = {
    keypaths.name(k): v
    for k, v in jax.tree_util.tree_flatten_with_path(
      nnx.state(abstract, nnx.Param)
    )[0]
  }
  values, report = fill(
    {n: v.shape for n, v in flat.items()}, source, kind, **kw
  )
  logging.info("%s", report.summary())
  dotted = lambda path: ".".join(str(part) for part in path)
  rest = jax.jit(
    lambda: nnx.state(make(), lambda path, _: dotted(path) not in values)
  )()
  rest = {dotted(p): v.get_value() for p, v in nnx.to_flat_state(rest)}
  for path, variable in nnx.to_flat_state(nnx.state(abstract)):
    name = dotted(path)
    variable.set_value(
      jnp.asarray(values[name], variable.get_value().dtype)
      if name in values
      else rest[name]
    )
  return abstract
