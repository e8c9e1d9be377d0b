"""The :debug recipes' training runs, each made once per test session.

Runs are deterministic, so tests that need "the :debug pretraining" or "the
same fine-tune from scratch" share one run (in-process, on one synthetic
corpus) instead of training their own.
"""
import shutil
from pathlib import Path

from vidjax import config as config_lib, train
from vidjax.data import synthetic

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
_corpus: list[Path] = []
_runs: dict[tuple, tuple[Path, dict]] = {}


def load(name: str, *overrides: str):
  """`configs/NAME.py:debug` with `--config.KEY=VALUE` overrides."""
  return config_lib.load_config(f"{CONFIGS / name}.py:debug", overrides)


def prepare(config, workdir: Path, tmp_path_factory) -> Path:
  """Puts the session's synthetic corpus into WORKDIR/synthetic."""
  if not _corpus:
    spec = config.data.synthetic  # The same in every :debug recipe.
    _corpus.append(synthetic.make_corpus(
        tmp_path_factory.mktemp("corpus"), num_videos=spec.num_videos,
        segments_per_video=spec.segments_per_video,
        segment_seconds=spec.segment_seconds, height=spec.height,
        width=spec.width, seed=spec.seed, progress=False))
  workdir.mkdir(parents=True, exist_ok=True)
  shutil.copytree(_corpus[0], workdir / "synthetic")
  return workdir


def run(tmp_path_factory, name: str, *overrides: str) -> tuple[Path, dict]:
  """(workdir, final eval metrics) of `train_and_evaluate` on the recipe."""
  key = (name, overrides)
  if key not in _runs:
    config = load(name, *overrides)
    workdir = prepare(config, tmp_path_factory.mktemp(name), tmp_path_factory)
    _runs[key] = workdir, train.train_and_evaluate(config, workdir)
  return _runs[key]
