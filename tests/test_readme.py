"""README stays true: its layout section names every module where it lives,
and CI runs its test command."""

from pathlib import Path
import re

REPO = Path(__file__).resolve().parents[1]


def _layout_sections() -> dict[str | None, str]:
  """Package folder ('' for vidjax/ itself, 'data/chunk' for a package in
  a package) -> the layout's lines for it."""
  readme = (REPO / "README.md").read_text()
  block = re.search(r"## Layout\n.*?```\n(.*?)```", readme, re.S).group(1)
  sections, folder, package = {}, None, None
  for line in block.splitlines():
    header = re.fullmatch(r"  (\w+)/(.*)", line)
    subpackage = re.fullmatch(r"    (\w+)/(.*)", line)  # e.g. data/chunk/
    if not line.startswith(" "):  # vidjax/, or configs/, tests/, ...
      folder = package = "" if line.startswith("vidjax/") else None
    elif header:
      folder = package = header.group(1)
    elif subpackage and package:
      folder = f"{package}/{subpackage.group(1)}"
    elif not line.startswith("    "):
      folder = package = ""
    elif not line.startswith("      "):
      folder = package
    sections[folder] = sections.get(folder, "") + line + "\n"
  return sections


def test_layout_names_every_module():
  sections = _layout_sections()
  missing = []
  for path in sorted((REPO / "vidjax").rglob("*.py")):
    relative = path.relative_to(REPO / "vidjax")
    folder = "/".join(relative.parent.parts)
    if path.name == "__init__.py" and "def " not in path.read_text():
      continue  # A package's docstring (and version) only.
    if not re.search(rf"\b{re.escape(path.name)}", sections.get(folder, "")):
      missing.append(relative.as_posix())
  assert not missing, f"README's layout section lacks {missing}"


def test_readme_lists_the_exit_codes_errors_defines():
  from vidjax.base import errors

  readme = (REPO / "README.md").read_text()
  listed = re.search(r"\n- Exit codes .*?(?=\n- )", readme, re.S).group(0)
  defined = {v for k, v in vars(errors).items() if k.startswith("EXIT_")}
  assert {int(c) for c in re.findall(r"`(\d+)`", listed)} == defined


def test_ci_runs_the_readme_test_command():
  command = 'pip install -e ".[dev]" && python -m pytest -q'
  readme = (REPO / "README.md").read_text()
  block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
  assert command in block.splitlines()  # The first code block: the start.
  ci = (REPO / ".ci/run").read_text().splitlines()
  steps = [line for line in ci if line and not line.startswith(("#", " "))]
  # After `set`, `cd` and the constraints: the style first (seconds), then
  # the tests; a failure in either ends CI (`set -e` alone would go on).
  assert steps[3].endswith("&& ruff check && ruff format --check || exit 1")
  assert f"{command} || exit 1" in steps[4:], steps


def _benchmarks_the_docs_name() -> set[str]:
  """NAME of every `python -m benchmarks.NAME` in README.md and
  BENCHMARKS.md (a command may break across lines), as .ci/run finds them."""
  text = " ".join(
    (REPO / name).read_text().replace("\n", " ")
    for name in ("README.md", "BENCHMARKS.md")
  )
  return set(re.findall(r"python +-m +vidjax\.bench\.([a-z_]+)", text))


def test_ci_smokes_every_benchmark_the_docs_name():
  named = _benchmarks_the_docs_name()
  assert {"loader", "pipeline", "memory"} <= named, named
  lacking = [
    name
    for name in sorted(named)
    if '"--smoke"' not in (REPO / f"vidjax/bench/{name}.py").read_text()
  ]
  assert not lacking, f"benchmarks the docs name without --smoke: {lacking}"
  ci = (REPO / ".ci/run").read_text()
  assert "cat README.md BENCHMARKS.md" in ci, "CI no longer finds them"
  assert 'python -m "benchmarks.${bench}" --smoke' in ci
  benchmarks = (REPO / "BENCHMARKS.md").read_text()
  for name in named:  # Each one's section says how long it runs.
    section = re.search(
      rf"\n## [^\n]*`python -m vidjax\.bench\.{name}`.*?(?=\n## |\Z)",
      benchmarks,
      re.S,
    )
    if section:
      assert "Running time:" in section.group(0), name
