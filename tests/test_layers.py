"""The package's layers: imports point down only, and loading a recipe
starts no runtime.

The import graph is read from the source files (`ast`), every import
counted, also those inside functions.
"""

import ast
import functools
from pathlib import Path
import subprocess
import sys

PACKAGE = Path(__file__).resolve().parents[1] / "vidjax"

# The intended layering, from the ground up: a module may import modules
# of its own layer or of one below, never of one above (and the imports
# form no cycle). Names are top-level modules or packages of vidjax.
LAYERS = [
  # Loading a config: no jax, flax, grain, orbax or PyAV.
  {"errors", "defaults", "config", "recipe"},
  # Small parts the layers above share; the run directory is here so
  # that whatever writes a file of the run asks it where.
  {
    "keypaths",
    "whole_files",
    "checksums",
    "failed_saves",
    "tfevents",
    "stopping",
    "rundir",
  },
  # Data, models and what a step is made of.
  {"data", "models", "metrics", "randaugment", "augment", "optim", "sharding"},
  # The text-prompt classifier, on metrics (zero-shot evaluation, labels).
  {"zeroshot"},
  {"tasks"},
  # What the loop is built from.
  {
    "steps",
    "checkpoint",
    "monitor",
    "console",
    "eval_sets",
    "resume",
    "memory",
    "plot",
  },
  {"train"},
  # The command line, and the benchmarks beside it (imported by no one
  # else).
  {"main", "bench", "embed", "search"},
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}
RUNTIMES = ("jax", "flax", "grain", "orbax", "av", "optax", "torch")


def _module(path: Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
  path = PACKAGE.parent.joinpath(*name.split("."))
  return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path) -> set[str]:
  """The vidjax modules `path` imports (`from vidjax.x import y`: the
  module y if it is one, else x)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names if a.name.startswith("vidjax.")}
    elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
      "vidjax"
    ):
      assert not node.level, f"{path}: a relative import"
      for alias in node.names:
        child = f"{node.module}.{alias.name}"
        found.add(child if _is_module(child) else node.module)
  return found


@functools.cache
def _graph() -> dict[str, set[str]]:
  """{module: the vidjax modules it imports}, for every module of vidjax."""
  return {_module(p): _imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> int:
  name = module.split(".")[1]
  assert name in LAYER, f"{module} is in no layer of tests/test_layers.py"
  return LAYER[name]


def test_imports_point_down_the_layers():
  graph = _graph()
  upward = [
    f"{a} -> {b}"
    for a, targets in graph.items()
    if a != "vidjax"
    for b in sorted(targets)
    if _layer(b) > _layer(a)
  ]
  assert not upward, "imports that point up:\n" + "\n".join(upward)
  into_bench = [
    f"{a} -> {b}"
    for a, targets in graph.items()
    for b in targets
    if b.startswith("vidjax.bench") and not a.startswith("vidjax.bench")
  ]
  assert not into_bench, into_bench


def test_recipes_import_only_defaults_and_recipe():
  for path in sorted((PACKAGE.parent / "configs").glob("*.py")):
    assert _imports(path) <= {"vidjax.defaults", "vidjax.recipe"}, path


def test_imports_form_no_cycle():
  graph, done, path = _graph(), set(), []  # DFS: `path` is the chain walked.

  def visit(module):
    if module in path:
      cycle = path[path.index(module) :] + [module]
      raise AssertionError("an import cycle: " + " -> ".join(cycle))
    if module in done:
      return
    path.append(module)
    for target in sorted(graph.get(module, ())):
      visit(target)
    path.pop()
    done.add(module)

  for module in graph:
    visit(module)


def test_loading_every_recipe_starts_no_runtime():
  recipes = sorted(str(p) for p in (PACKAGE.parent / "configs").glob("*.py"))
  code = (
    "import sys; import vidjax.config as c\n"
    "for spec in sys.argv[1:]: c.load_config(spec)\n"
    f"print(sorted(m for m in {RUNTIMES!r} if m in sys.modules))"
  )
  out = subprocess.run(
    [
      sys.executable,
      "-c",
      code,
      *recipes,
      f"{PACKAGE.parent}/configs/clip_vitb16_ego4d.py:flip",
      f"{PACKAGE.parent}/configs/demo.py:debug",
    ],
    capture_output=True,
    text=True,
    check=True,
  )
  assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_private_apis_vidjax_uses_are_still_there():
  """No public API does what these do (the comments where they are used say
  why); a jax or Orbax release that moves one fails here, not silently."""
  # pylint: disable=import-outside-toplevel
  import jax
  from jax._src import ad_checkpoint  # vidjax.memory
  from jax._src.cudnn import fused_attention_stablehlo  # models/attention.py
  import orbax.checkpoint as ocp  # vidjax.checkpoint

  assert callable(ad_checkpoint.saved_residuals)
  assert callable(fused_attention_stablehlo.check_cudnn_version)
  handler = ocp.type_handlers.get_type_handler(jax.Array)
  assert handler._array_metadata_store is not None  # pylint: disable=protected-access


def test_every_choice_is_implemented_under_its_defaults_name():
  """The tables that implement a choice are keyed by `vidjax.defaults`'s
  names, and every task module is a `tasks.Task`."""
  # pylint: disable=import-outside-toplevel
  from vidjax import defaults, models, tasks
  from vidjax.data import annotations
  from vidjax.models import transformer, videomae

  assert tuple(models.MODELS) == defaults.MODELS
  assert set(defaults.TASK_MODELS.values()) == set(defaults.MODELS)
  assert tuple(transformer.REMAT_POLICIES) == defaults.REMAT_POLICIES
  assert tuple(transformer.ACTIVATIONS) == defaults.ACTIVATIONS
  assert tuple(videomae.BACKBONE_STYLES) == defaults.BACKBONES
  assert (
    set(annotations.LOADERS)
    == set(annotations.FORMATS)
    == set(defaults.DATA_FORMATS)
  )
  for name in defaults.TASKS:
    task = tasks.get_task(name)
    assert isinstance(task, tasks.Task), name
    assert isinstance(task, tasks.RetrievalTask) == defaults.needs_text(name)
