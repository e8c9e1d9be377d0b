"""The docs stay true: the layout (docs/layout.md) names every module where
it lives, the exit codes listed are those defined, every relative link
resolves, and CI runs the README's test command and every benchmark the
docs name."""

from pathlib import Path
import re

REPO = Path(__file__).resolve().parents[1]
# Every Markdown file CI reads benchmark names from, and whose links resolve.
DOCS = ("README.md", "BENCHMARKS.md", "docs/*.md")


def _docs() -> list[Path]:
  return sorted(p for pattern in DOCS for p in REPO.glob(pattern))


def _layout_entries() -> list[tuple[str, str, list[str]]]:
  """docs/layout.md's tree under vidjax/: (folder, line, names) per line,
  folder '' for vidjax/ itself and 'data/chunk' for a package in a package;
  names the files or folders an entry line starts with (none on a line that
  continues the one above)."""
  layout = (REPO / "docs/layout.md").read_text()
  block = re.search(r"\n```\n(vidjax/\n.*?)```", layout, re.S).group(1)
  entries, path, last, folder = [], [], 0, None
  for line in block.splitlines():
    indent = len(line) - len(line.lstrip(" "))
    names = []
    if indent == 0:  # vidjax/, or benchmarks/, configs/, tests/, ...
      path, last = [], 0
      folder = "" if line.startswith("vidjax/") else None
    elif folder is not None and indent <= last + 2:  # An entry.
      path, last = path[: indent // 2 - 1], indent
      names = re.match(r"[\w.]+(?:\.py|/)(?:, [\w.]+\.py)*", line.strip())
      names = names.group(0).split(", ") if names else []
      if names and names[0].endswith("/"):  # A folder: its line its own.
        path.append(names[0].rstrip("/"))
      folder = "/".join(path)
    # Deeper: continues the entry above, in its folder.
    if folder is not None:
      entries.append((folder, line, names))
  return entries


def _layout_sections() -> dict[str, str]:
  """Package folder -> the layout's lines for it."""
  sections = {}
  for folder, line, _ in _layout_entries():
    sections[folder] = sections.get(folder, "") + line + "\n"
  return sections


def test_layout_names_every_module():
  sections = _layout_sections()
  nested = {"data/annotations", "data/chunk", "data/synthetic"}
  assert {"", "data"} | nested <= set(sections), sorted(sections)
  missing = []
  for path in sorted((REPO / "vidjax").rglob("*.py")):
    relative = path.relative_to(REPO / "vidjax")
    folder = "/".join(relative.parent.parts)
    if path.name == "__init__.py" and "def " not in path.read_text():
      continue  # A package's docstring (and version) only.
    if not re.search(rf"\b{re.escape(path.name)}", sections.get(folder, "")):
      missing.append(relative.as_posix())
  assert not missing, f"docs/layout.md's tree lacks {missing}"


def test_layout_names_no_module_that_is_gone():
  gone = []
  for folder, _, names in _layout_entries():
    for name in names:  # A folder entry's folder is its own.
      where = REPO / "vidjax" / folder
      if not (where if name.endswith("/") else where / name).exists():
        gone.append(f"{folder}: {name}")
  assert not gone, f"docs/layout.md names what vidjax/ lacks: {gone}"


def test_docs_list_the_exit_codes_errors_defines():
  from vidjax.base import errors

  training = (REPO / "docs/training.md").read_text()
  listed = re.search(r"\n## Exit codes\n.*?(?=\n## |\Z)", training, re.S)
  defined = {v for k, v in vars(errors).items() if k.startswith("EXIT_")}
  codes = {int(c) for c in re.findall(r"^\| `(\d+)` \|", listed.group(0), re.M)}
  assert codes == defined


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
  """NAME of every `python -m benchmarks.NAME` in README.md, BENCHMARKS.md
  and docs/*.md (a command may break across lines), as .ci/run finds them."""
  text = " ".join(p.read_text().replace("\n", " ") for p in _docs())
  return set(re.findall(r"python +-m +benchmarks\.([a-z_]+)", text))


def test_ci_smokes_every_benchmark_the_docs_name():
  named = _benchmarks_the_docs_name()
  assert {"loader", "pipeline", "memory"} <= named, named
  lacking = [
    name
    for name in sorted(named)
    if '"--smoke"' not in (REPO / f"benchmarks/{name}.py").read_text()
  ]
  assert not lacking, f"benchmarks the docs name without --smoke: {lacking}"
  ci = (REPO / ".ci/run").read_text()
  assert f"cat {' '.join(DOCS)}" in ci, "CI no longer finds them"
  assert 'python -m "benchmarks.${bench}" --smoke' in ci
  benchmarks = (REPO / "BENCHMARKS.md").read_text()
  for name in named:  # Each one's section says how long it runs.
    section = re.search(
      rf"\n## [^\n]*`python -m benchmarks\.{name}`.*?(?=\n## |\Z)",
      benchmarks,
      re.S,
    )
    if section:
      assert "Running time:" in section.group(0), name


def _without_code(text: str) -> str:
  """Markdown text less its fenced blocks and code spans, which hold no
  links or headings."""
  text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
  return re.sub(r"`[^`\n]*`", "", text)


def _anchors(path: Path) -> set[str]:
  """The `#anchors` GitHub gives the headings of a Markdown file: the text
  lowercased, punctuation dropped, spaces as hyphens, repeats numbered
  (none in a file that is not Markdown)."""
  if path.suffix != ".md":
    return set()
  text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
  anchors = set()
  for heading in re.findall(r"^#{1,6} +(.*?) *#*$", text, re.M):
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # Link text.
    slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
    anchor, n = slug, 0
    while anchor in anchors:
      n += 1
      anchor = f"{slug}-{n}"
    anchors.add(anchor)
  return anchors


def test_every_relative_link_resolves():
  broken = []
  for doc in _docs():
    text = _without_code(doc.read_text())
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
      if re.match(r"[a-z]+:", target):  # https:, mailto:
        continue
      file, _, anchor = target.partition("#")
      linked = (doc.parent / file).resolve() if file else doc
      if not linked.exists():
        broken.append(f"{doc.relative_to(REPO)}: {target} (no such file)")
      elif anchor and anchor not in _anchors(linked):
        broken.append(f"{doc.relative_to(REPO)}: {target} (no such heading)")
  assert not broken, broken


def test_anchors_are_githubs():
  # The slug rule on headings like the docs': code, colons, apostrophes.
  page = REPO / "BENCHMARKS.md"
  assert "masked-training-python--m-benchmarksmasking" in _anchors(page)
  assert "gpu-check-launchgpu_checksh" in _anchors(page)


def test_every_command_the_docs_name_runs_as_a_module():
  """Each `python -m vidjax.X` (and `benchmarks.X`) the docs and the launch
  scripts name is a module with a main block, or a package with a
  `__main__.py`: the command line a reader copies exists."""
  texts = [p.read_text() for p in _docs()]
  texts += [p.read_text() for p in sorted((REPO / "launch").iterdir())]
  texts += [(REPO / "notebooks/quickstart.ipynb").read_text()]
  named = set(
    re.findall(
      r"python3? +-m +((?:vidjax|benchmarks)(?:\.[a-z_]+)+)", " ".join(texts)
    )
  )
  assert {"vidjax.main", "vidjax.embed", "vidjax.search"} <= named, named
  missing = []
  for module in sorted(named):
    path = REPO.joinpath(*module.split("."))
    if (path / "__main__.py").is_file():
      continue
    source = path.with_suffix(".py")
    if not (
      source.is_file() and 'if __name__ == "__main__":' in source.read_text()
    ):
      missing.append(module)
  assert not missing, f"commands the docs name that do not run: {missing}"
