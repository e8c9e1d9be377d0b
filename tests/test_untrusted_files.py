"""Files from elsewhere run no code: each reader gets a crafted malicious file.

Every file here would write a marker file if its code ran. With default
flags each reader reads the data it can or refuses the file in one line
naming the opt-in, and the marker is never written. Where an opt-in exists,
the same file does run with it: the crafted file is really malicious.
"""

import io
import json
import pickle
import sys
import zipfile

import numpy as np
import pytest

from vidjax.base import errors
from vidjax.data.annotations import records
from vidjax.weights import sources, tensor_io


class _WritesMarker:
  """Unpickling it runs `exec`, which writes the marker file."""

  def __init__(self, marker):
    self.marker = str(marker)

  def __reduce__(self):
    return exec, (f'open({self.marker!r}, "w").write("ran")',)


def _archive(path, data_pkl: bytes, code: str = "class M(Module):\n"):
  """A TorchScript archive's zip layout around the given data.pkl."""
  with zipfile.ZipFile(path, "w") as z:
    z.writestr("m/data.pkl", data_pkl)
    z.writestr("m/constants.pkl", pickle.dumps((), protocol=2))
    z.writestr("m/code/__torch__.py", code)
    z.writestr("m/version", "3\n")
  return str(path)


def _assert_refused(path, marker, *words):
  with pytest.raises(errors.InitFromError) as error:
    sources.read_source(path)
  message = str(error.value)
  assert message.startswith(path) and len(message.splitlines()) == 1, message
  for word in words:
    assert word in message, message
  assert not marker.exists()


@pytest.mark.parity
def test_torchscript_setstate_code_never_runs_by_default(tmp_path):
  torch = pytest.importorskip("torch")
  marker = tmp_path / "marker"

  class Evil(torch.nn.Module):
    """A module whose TorchScript `__setstate__` saves a file."""

    def __init__(self):
      super().__init__()
      self.proj = torch.nn.Parameter(torch.arange(4.0))
      self.target = str(marker)

    def forward(self, x):
      return x * self.proj

    @torch.jit.export
    def __getstate__(self) -> tuple[torch.Tensor, str, bool]:
      return self.proj, self.target, self.training

    @torch.jit.export
    def __setstate__(self, state: tuple[torch.Tensor, str, bool]) -> None:
      self.proj, self.target, self.training = state
      torch.save(self.proj, self.target)

  path = str(tmp_path / "ViT-B-16.pt")
  torch.jit.script(Evil()).save(path)
  _assert_refused(
    path,
    marker,
    "TorchScript",
    "Evil",
    "__setstate__",
    "--config.init_allow_pickle=True",
  )
  # Allowed, torch.jit.load runs it: the file is what this test says.
  tensor_io.load_state_dict(path, allow_pickle=True)
  assert marker.exists()


class _Global:
  """A name a pickle imports (GLOBAL), written without importing it."""

  def __init__(self, module, name):
    self.module, self.name = module, name

  def __call__(self, *args):  # The pickler only pickles callables' names.
    raise NotImplementedError


class _Storage:
  """A storage, pickled as its persistent id (a file data/<key>)."""

  def __init__(self, key, numel):
    self.key, self.numel = key, numel


class _Tensor:
  """A tensor: a view of a storage (offset, size, stride in elements)."""

  def __init__(self, storage, offset, size, stride):
    self.args = (storage, offset, size, stride)


class _TorchScriptPickler(pickle._Pickler):
  """Writes data.pkl as TorchScript's pickler does, for crafted contents."""

  dispatch = pickle._Pickler.dispatch.copy()
  dispatch[_Global] = lambda self, g: self.write(
    f"c{g.module}\n{g.name}\n".encode()
  )

  def persistent_id(self, obj):
    if isinstance(obj, _Storage):
      return (
        "storage",
        _Global("torch", "FloatStorage"),
        obj.key,
        "cpu",
        obj.numel,
      )
    return None

  def reducer_override(self, obj):
    if isinstance(obj, _Tensor):
      return (
        _Global("torch._utils", "_rebuild_tensor_v2"),
        obj.args + (False, {}),
      )
    if isinstance(obj, dict) and "__class__" in obj:  # A TorchScript object.
      state = {k: v for k, v in obj.items() if k != "__class__"}
      return _Global("__torch__", obj["__class__"]), (), state
    return NotImplemented


def _crafted_archive(path, module: dict, storage: np.ndarray):
  """An archive of `__torch__.M` (`module`: its attributes) declaring one
  parameter, `proj`, whose storage 0 is `storage`."""
  data_pkl = io.BytesIO()
  _TorchScriptPickler(data_pkl, protocol=2).dump(module)
  path = _archive(
    path,
    data_pkl.getvalue(),
    'class M(Module):\n  __parameters__ = ["proj", ]\n  __buffers__ = []\n',
  )
  with zipfile.ZipFile(path, "a") as z:
    z.writestr("m/data/0", storage.astype("<f4").tobytes())
  return path


def test_torchscript_read_as_data_names_nothing_else(tmp_path, monkeypatch):
  marker = tmp_path / "marker"
  path = _archive(
    tmp_path / "exec.pt", pickle.dumps(_WritesMarker(marker), protocol=2)
  )
  _assert_refused(path, marker, ".exec", "init_allow_pickle=True")
  # Read without torch: parameters only (not the other attribute), views
  # (a transposed one here) as their values.
  storage = np.arange(6, dtype=np.float32)
  path = _crafted_archive(
    tmp_path / "ok.pt",
    {
      "__class__": "M",
      "training": False,
      "cache": _Tensor(_Storage("0", 6), 0, (6,), (1,)),
      "proj": _Tensor(_Storage("0", 6), 0, (3, 2), (1, 3)),
    },
    storage,
  )
  monkeypatch.setitem(sys.modules, "torch", None)  # Not needed: not imported.
  loaded = tensor_io.load_state_dict(path)
  assert list(loaded) == ["proj"]
  np.testing.assert_array_equal(loaded["proj"], storage.reshape(2, 3).T)
  monkeypatch.undo()
  # A view reaching past its storage is refused, not read.
  path = _crafted_archive(
    tmp_path / "past_end.pt",
    {"__class__": "M", "proj": _Tensor(_Storage("0", 6), 2, (3, 2), (1, 3))},
    storage,
  )
  with pytest.raises(
    errors.InitFromError, match="reaching element 7 of a storage of 6"
  ):
    tensor_io.load_state_dict(path)


@pytest.mark.parity
def test_torch_pickle_runs_nothing_unless_allowed(tmp_path):
  torch = pytest.importorskip("torch")
  marker = tmp_path / "marker"
  path = str(tmp_path / "checkpoint_best.pt")
  torch.save(
    {
      "state_dict": {"visual.proj": torch.ones(2, 2)},
      "args": _WritesMarker(marker),
    },
    path,
  )
  _assert_refused(path, marker, "exec", "--config.init_allow_pickle=True")
  tensor_io.load_state_dict(path, allow_pickle=True)
  assert marker.exists()


def test_npz_object_arrays_are_never_unpickled(tmp_path):
  marker = tmp_path / "marker"
  path = str(tmp_path / "clip.npz")
  np.savez(path, **{"visual.proj": np.array([_WritesMarker(marker)])})
  _assert_refused(path, marker, "cannot be read as .npz")


def test_safetensors_offsets_outside_the_data_are_refused(tmp_path):
  data = np.arange(4, dtype=np.float32).tobytes()
  for name, info in (
    ("past_end", dict(dtype="F32", shape=[8], data_offsets=[0, 32])),
    ("wrong_size", dict(dtype="F32", shape=[4, 4], data_offsets=[0, 16])),
  ):
    header = json.dumps({"visual.proj": info}).encode()
    path = tmp_path / f"{name}.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)
    with pytest.raises(
      errors.InitFromError, match="cannot be read as .safetensors"
    ):
      sources.read_source(str(path))
  path.write_bytes((2**62).to_bytes(8, "little") + header)  # A huge header.
  with pytest.raises(errors.InitFromError, match="header too large"):
    sources.read_source(str(path))


def test_a_weights_directory_runs_nothing(tmp_path):
  """A Hugging Face style directory whose weights file is a pickle."""
  marker = tmp_path / "marker"
  (tmp_path / "hf").mkdir()
  (tmp_path / "hf" / "config.json").write_text('{"model_type": "videomae"}')
  with open(tmp_path / "hf" / "pytorch_model.bin", "wb") as f:
    pickle.dump({"videomae.embeddings": _WritesMarker(marker)}, f)
  with pytest.raises(errors.UserError):
    sources.read_source(str(tmp_path / "hf"))
  assert not marker.exists()


def test_annotation_pickles_hold_only_data_even_when_allowed(tmp_path):
  marker = tmp_path / "marker"
  path = tmp_path / "ego4d_train.pkl"
  path.write_bytes(pickle.dumps([("uid", 0.0, 1.0, _WritesMarker(marker))]))
  with pytest.raises(errors.DataFileError, match="convert-ego4d"):
    records.load_pickle(path, False, "convert-ego4d")
  with pytest.raises(
    errors.DataFileError, match="refusing to load builtins.exec"
  ):
    records.load_pickle(path, True, "convert-ego4d")
  assert not marker.exists()
