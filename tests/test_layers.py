"""The package's layers: imports point down only, loading a recipe starts
no runtime, and libraries are used through their public APIs everywhere
but `vidjax.base.internals` (its pins: tests/test_internals.py).

The import graph and the uses are read from the source files (`ast`),
every import counted, also those inside functions.
"""

import ast
import functools
from pathlib import Path
import subprocess
import sys

PACKAGE = Path(__file__).resolve().parents[1] / "vidjax"
# Outside the package, held to the same rules on private APIs and hooks.
BENCHMARKS = PACKAGE.parent / "benchmarks"

# The intended layering, from the ground up: a module may import modules
# of its own layer or of one below, never of one above (and the imports
# form no cycle). Names are the folders and top-level modules of vidjax.
LAYERS = [
  # Errors, private APIs, whole files, the run directory, stopping.
  {"base"},
  # Loading a config: no jax, flax, grain, orbax or PyAV (internals
  # imports its libraries where it uses them).
  {"config"},
  # The read path, the architectures, the device mesh; what a run reports.
  {"data", "models", "sharding", "report"},
  # Weights in, the objectives and their metrics, augmentation, optax.
  {"weights", "tasks", "augment", "optim"},
  # What the loop is built from.
  {"steps", "checkpoints", "evaluation"},
  {"memory"},
  # A run's start-up: resolved, then built.
  {"startup"},
  {"train"},
  # The command lines.
  {"main", "search", "embed", "plot", "checksums", "compile", "export"},
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
  # The benchmarks (benchmarks/, outside the package) are imported by none
  # of its modules: an installed vidjax has no benchmark.
  into_bench = [
    f"{path.relative_to(PACKAGE.parent)} imports {name}"
    for path in sorted(PACKAGE.rglob("*.py"))
    for node in ast.walk(ast.parse(path.read_text()))
    if isinstance(node, (ast.Import, ast.ImportFrom))
    for name in (
      [a.name for a in node.names]
      if isinstance(node, ast.Import)
      else [node.module or ""]
    )
    if name.split(".")[0] == "benchmarks"
  ]
  assert not into_bench, into_bench


def test_recipes_import_only_defaults_and_recipe():
  for path in sorted((PACKAGE.parent / "configs").glob("*.py")):
    assert _imports(path) <= {
      "vidjax.config.defaults",
      "vidjax.config.recipe",
    }, path


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


# Private modules of the libraries vidjax runs on.
PRIVATE_MODULES = (
  "jax._src",
  "grain._src",
  "orbax.checkpoint._src",
  "orbax.checkpoint.experimental",
  "tensorstore",
  "flax.nnx.",  # flax.nnx's own modules (flax.nnx itself is public).
)
# Names a match on a message's text is made with.
_TEXT_MATCHES = {
  "search",
  "match",
  "fullmatch",
  "findall",
  "finditer",
  "sub",
  "split",
  "startswith",
  "endswith",
  "removeprefix",
  "removesuffix",
  "splitlines",
}


def _library_names(tree: ast.AST) -> set[str]:
  """Names bound to third-party modules or objects by `tree`'s imports."""
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        if a.name.split(".")[0] not in sys.stdlib_module_names | {"vidjax"}:
          names.add(a.asname or a.name.split(".")[0])
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      if node.module.split(".")[0] not in sys.stdlib_module_names | {"vidjax"}:
        names |= {a.asname or a.name for a in node.names}
  return names


def _private_uses(path: Path) -> list[str]:
  """`path`'s imports of private library modules, reads of a library's
  private attributes, uses of `unittest.mock`, and matches on the text of
  an exception (`str(error)` searched, split or compared with a literal)."""
  tree = ast.parse(path.read_text())
  library = _library_names(tree)
  found = []
  for node in ast.walk(tree):
    where = f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', 0)}"
    modules = []
    if isinstance(node, ast.Import):
      modules = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    for module in modules:
      if module.startswith(PRIVATE_MODULES) or module.split(".")[0] == "mock":
        found.append(f"{where}: imports {module}")
      if module in ("unittest.mock", "mock"):
        found.append(f"{where}: imports {module} (patching belongs in tests)")
    if (
      isinstance(node, ast.Attribute)
      and node.attr.startswith("_")
      and not node.attr.startswith("__")
      and isinstance(node.value, ast.Name)
      and node.value.id in library
    ):
      found.append(f"{where}: reads {node.value.id}.{node.attr}")
    if (
      isinstance(node, ast.Call)
      and getattr(node.func, "id", "") == "getattr"
      and len(node.args) >= 2
      and isinstance(node.args[1], ast.Constant)
      and str(node.args[1].value).startswith("_")
      and not str(node.args[1].value).startswith("__")
    ):
      found.append(f"{where}: reads the private {node.args[1].value}")
    found += [f"{where}: {what}" for what in _text_matches(node)]
  return found


# What holds a library's message: an exception, a log record's message.
_MESSAGE_NAMES = {"e", "err", "error", "exc", "exception"}
_MESSAGE_ATTRIBUTES = {"msg", "message", "exc_value", "stderr"}


def _is_str_of_name(node: ast.AST) -> bool:
  """`str(e)` of an exception or a message (`str(record.msg)`)."""
  if not (
    isinstance(node, ast.Call)
    and getattr(node.func, "id", "") == "str"
    and len(node.args) == 1
  ):
    return False
  arg = node.args[0]
  if isinstance(arg, ast.Name):
    return arg.id in _MESSAGE_NAMES
  return isinstance(arg, ast.Attribute) and arg.attr in _MESSAGE_ATTRIBUTES


def _text_matches(node: ast.AST) -> list[str]:
  """A match on a message's text made by `node`: `str(e)` searched or split
  (`re.search(..., str(e))`, `str(e).startswith(...)`) or compared with a
  string literal (`str(e) == "..."`, `"..." in str(e)`)."""
  if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
    if node.func.attr in _TEXT_MATCHES and (
      _is_str_of_name(node.func.value) or any(map(_is_str_of_name, node.args))
    ):
      return [f"matches the text of {ast.unparse(node)[:60]}"]
  if isinstance(node, ast.Compare):
    sides = [node.left, *node.comparators]
    literal = any(
      isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides
    )
    if literal and any(map(_is_str_of_name, sides)):
      return [f"compares the text of {ast.unparse(node)[:60]}"]
  return []


def test_private_apis_and_library_messages_only_in_internals():
  """No module but vidjax.base.internals imports a private module of jax,
  Grain, Orbax or TensorStore, reads a library's private attribute,
  patches with unittest.mock, or matches an error's text."""
  found = [
    use
    for path in sorted([*PACKAGE.rglob("*.py"), *BENCHMARKS.rglob("*.py")])
    if path != PACKAGE / "base" / "internals.py"
    for use in _private_uses(path)
  ]
  assert not found, "outside vidjax/base/internals.py:\n" + "\n".join(found)


def test_the_checks_find_what_they_look_for(tmp_path):
  """The checks above on a module that does each thing once."""
  path = PACKAGE / "_example_for_test_layers.py"
  path.write_text(
    "import re\n"
    "from unittest import mock\n"
    "import orbax.checkpoint as ocp\n"
    "from jax._src import core\n"
    "def f(handler, e):\n"
    "  ocp._private_thing\n"
    "  getattr(handler, '_store', None)\n"
    "  re.search('code (\\\\d+)', str(e))\n"
    "  str(e).startswith('flag ')\n"
    "  return str(e) == 'Event loop is closed'\n"
  )
  try:
    found = _private_uses(path)
  finally:
    path.unlink()
  assert [f.split(": ", 1)[1].split(" ")[0] for f in found] == [
    "imports",
    "imports",
    "imports",
    "reads",
    "reads",
    "matches",
    "matches",
    "compares",
  ], found


def test_process_wide_hooks_only_in_main():
  """`sys.unraisablehook`, `sys.excepthook` and filters on loggers are set
  by `vidjax.checkpoints.failed_saves.install_quiet` only, and only `vidjax.main`
  calls it: library code (a Checkpointer) installs no process-wide hook.
  (And by the data workers' own main module, `vidjax.data.lean_worker`.)"""
  setters = {}
  for path in sorted([*PACKAGE.rglob("*.py"), *BENCHMARKS.rglob("*.py")]):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Assign):
        for target in node.targets:
          for name in (
            target.elts if isinstance(target, ast.Tuple) else [target]
          ):
            if ast.unparse(name) in ("sys.unraisablehook", "sys.excepthook"):
              setters.setdefault(_module(path), []).append(ast.unparse(name))
      if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "addFilter"
        and "getLogger" in ast.unparse(node.func.value)
      ):
        setters.setdefault(_module(path), []).append("a logger's filter")
  assert set(setters) == {
    "vidjax.checkpoints.failed_saves",
    "vidjax.data.lean_worker",
  }, setters
  callers = {
    _module(p)
    for p in [*PACKAGE.rglob("*.py"), *BENCHMARKS.rglob("*.py")]
    if "failed_saves.install_quiet(" in p.read_text()
  }
  assert callers == {"vidjax.main"}, callers


def test_every_choice_is_implemented_under_its_defaults_name():
  """The tables that implement a choice are keyed by `vidjax.config.defaults`'s
  names, and every task module is a `tasks.Task`."""
  from vidjax import models, tasks
  from vidjax.config import defaults
  from vidjax.data import annotations
  from vidjax.models import transformer, videomae
  from vidjax.tasks import retrieval

  assert tuple(models.MODELS) == defaults.MODELS
  assert set(defaults.TASK_MODELS.values()) == set(defaults.MODELS)
  assert tuple(transformer.REMAT_POLICIES) == defaults.REMAT_POLICIES
  assert tuple(transformer.ACTIVATIONS) == defaults.ACTIVATIONS
  assert tuple(videomae.BACKBONE_STYLES) == defaults.BACKBONES
  assert tuple(retrieval.LOSSES) == defaults.LOSSES
  assert (
    set(annotations.LOADERS)
    == set(annotations.FORMATS)
    == set(defaults.DATA_FORMATS)
  )
  for name in defaults.TASKS:
    task = tasks.get_task(name)
    assert isinstance(task, tasks.Task), name
    assert isinstance(task, tasks.RetrievalTask) == defaults.needs_text(name)
