"""pyproject.toml declares what the package imports, and nothing it does not.

`pip install -e .` must bring every package that vidjax's code imports;
one that arrives only as another package's dependency (psutil through
Orbax) can leave with that package's next release.
"""

import ast
import functools
from importlib import metadata
from pathlib import Path
import re
import sys
import tomllib

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "vidjax"
# Run from a checkout (`python -m benchmarks.NAME`), never installed; their
# imports are declared too (core, or the [bench] extra).
BENCHMARKS = REPO / "benchmarks"
# Imported only where the optional part runs: the import name, the extra
# that declares its distribution (None: used when installed, declared
# nowhere), and that distribution.
OPTIONAL = {
  "matplotlib": (
    "plots",
    "matplotlib",
  ),  # vidjax.report.plot, drawn at a run's end
  "torch": ("parity", "torch"),  # reading a .pt checkpoint
  "ftfy": (None, "ftfy"),  # the tokenizer's text clean-up, as OpenCLIP's
  "cv2": ("bench", "opencv-python-headless"),  # benchmarks.loader's peers
  "decord": ("bench", "decord"),
}


def _name(requirement: str) -> str:
  """A requirement's distribution name, normalised (PEP 503)."""
  name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
  return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> tuple[set[str], dict[str, set[str]]]:
  project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  extras = {
    extra: {_name(r) for r in requirements}
    for extra, requirements in project["optional-dependencies"].items()
  }
  return {_name(r) for r in project["dependencies"]}, extras


def _imported(*packages: Path) -> dict[str, set[str]]:
  """Third-party top-level modules imported in packages -> the files."""
  found = {}
  paths = [(p, d) for d in packages for p in sorted(d.rglob("*.py"))]
  for path, package in paths:
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
      elif isinstance(node, ast.ImportFrom) and not node.level:
        names = [node.module]
      else:
        continue
      for name in names:
        top = name.split(".")[0]
        if top not in sys.stdlib_module_names | {"vidjax", "benchmarks"}:
          found.setdefault(top, set()).add(
            str(path.relative_to(package.parent))
          )
  return found


@functools.cache
def _distributions(module: str) -> frozenset[str]:
  """The installed distributions that provide a top-level module."""
  return frozenset(map(_name, _providers().get(module, [])))


@functools.cache
def _providers() -> dict[str, list[str]]:
  return metadata.packages_distributions()


def _undeclared(imported: dict[str, set[str]]) -> dict[str, list[str]]:
  """The imported modules that no core dependency provides -> the files."""
  core, extras = _declared()
  undeclared = {}
  for module, files in imported.items():
    if module in OPTIONAL:
      extra, distribution = OPTIONAL[module]
      assert extra is None or _name(distribution) in extras[extra], module
    elif not _distributions(module) & core:
      undeclared[module] = sorted(files)
  return undeclared


def test_every_imported_package_is_declared():
  assert _undeclared(_imported(PACKAGE, BENCHMARKS)) == {}, (
    "imported but not in pyproject.toml's dependencies"
  )


def test_every_declared_package_is_imported():
  core, _ = _declared()
  imported = set().union(*map(_distributions, _imported(PACKAGE)))
  assert core - imported == set(), "declared but never imported"


def test_the_check_finds_an_undeclared_import(tmp_path):
  # Pillow came with matplotlib (the [plots] extra) only: the search page's
  # thumbnails once imported it.
  (tmp_path / "search.py").write_text(
    "import numpy\n\ndef f():\n  from PIL import Image\n"
  )
  assert _undeclared(_imported(tmp_path)) == {
    "PIL": [f"{tmp_path.name}/search.py"]
  }


def test_the_installed_package_holds_no_benchmark():
  """`pip install .` installs the packages pyproject.toml's find settings
  select: vidjax's, and never benchmarks/ (run from a checkout)."""
  import setuptools

  find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"][
    "setuptools"
  ]["packages"]["find"]
  packages = setuptools.find_packages(str(REPO), include=find["include"])
  assert "vidjax" in packages and "vidjax.data.chunk" in packages, packages
  assert not [p for p in packages if not p.startswith("vidjax")], packages
