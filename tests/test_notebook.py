"""notebooks/quickstart.ipynb runs headless, top to bottom; committed clean."""

import json
from pathlib import Path
import re

import pytest

import limits

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks/quickstart.ipynb"


def _code_cells(nb):
  return [c for c in nb.cells if c.cell_type == "code"]


def test_committed_notebook_has_no_outputs():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  for cell in _code_cells(nb):
    assert not cell.outputs and cell.execution_count is None, (
      f"{NOTEBOOK.name} is committed with outputs; strip them (e.g. "
      "`jupyter nbconvert --clear-output --inplace`)"
    )


def test_install_cell_is_commented_out():
  # Executing the notebook (here, in CI) must never pip install.
  first = _code_cells(nbformat.read(NOTEBOOK, as_version=4))[0].source
  assert "pip install" in first
  assert all(
    line.lstrip().startswith("#") for line in first.splitlines() if line.strip()
  )


@pytest.mark.slow
def test_quickstart_runs_headless(tmp_path, monkeypatch):
  workdir = tmp_path / "run"
  monkeypatch.setenv("VIDJAX_WORKDIR", str(workdir))  # the kernel inherits it
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = nbclient.NotebookClient(
    nb,
    timeout=limits.HANG_S,  # A cell's.
    kernel_name="python3",
    resources={"metadata": {"path": str(NOTEBOOK.parent)}},
  )  # cwd: notebooks/
  client.execute()  # raises CellExecutionError naming the failing cell

  outputs = [o for c in _code_cells(nb) for o in c.outputs]
  images = [o for o in outputs if "image/png" in o.get("data", {})]
  assert len(images) == 2  # the decoded frames and the loss curve
  text = "".join(o.get("text", "") for o in outputs)
  assert "uint8 (8, 96, 128, 3)" in text  # read_clip's frames
  rows = [
    json.loads(line)
    for line in (workdir / "metrics.jsonl").read_text().splitlines()
  ]
  losses = [r["train/loss"] for r in rows if "train/loss" in r]
  assert len(losses) == 5  # step 1 and every 5th of 20
  assert any("eval/t2v_r1" in r for r in rows)
  assert (workdir / "plots" / "loss.png").exists()
  # Its videos indexed and searched (vidjax.search.embed, vidjax.search).
  assert re.search(r"indexed \d+ videos", text), text
  # Its showcase shows what search does: on the held-out videos alone, most
  # held-out captions find their own video first, far above chance.
  found = re.search(
    r"right video first for (\d+) of (\d+) held-out captions \(chance "
    r"about ([\d.]+)",
    text,
  )
  assert found, text
  right, total, chance = int(found[1]), int(found[2]), float(found[3])
  assert right / total > max(0.5, chance + 0.25), found[0]
  assert (workdir / "index" / "embeddings.npy").exists()
  assert (workdir / "hits.html").exists()


def test_a_temporary_run_directory_is_removed_at_the_end(tmp_path, monkeypatch):
  # The first cells and the last, as a user runs them without
  # VIDJAX_WORKDIR: the run directory they make is gone afterwards.
  pytest.importorskip("matplotlib")
  monkeypatch.delenv("VIDJAX_WORKDIR", raising=False)
  monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
  monkeypatch.chdir(NOTEBOOK.parent)
  cells = _code_cells(nbformat.read(NOTEBOOK, as_version=4))
  namespace = {}
  exec(cells[1].source, namespace)  # noqa: S102 (the notebook's own cells)
  assert namespace["WORKDIR"].parent == tmp_path
  assert namespace["WORKDIR"].name.startswith("vidjax_quickstart_")
  exec(cells[-1].source, namespace)  # noqa: S102
  assert list(tmp_path.iterdir()) == []
