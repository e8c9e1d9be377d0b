"""TorchScript archives (OpenAI's released CLIP `.pt`) read as data.

`torch.jit.load` runs the archive's TorchScript: a class's `__setstate__`
can do anything TorchScript can, e.g. write files. Here nothing in the
archive runs, and torch is not needed. A TorchScript archive is a zip:

    NAME/data.pkl       the module tree, pickled (protocol 2)
    NAME/data/<key>     one raw storage per key (little-endian)
    NAME/code/...       the classes' TorchScript source
    NAME/constants.pkl  the code's constants (not parameters)

`data.pkl` is unpickled by an unpickler that knows a handful of names:
`__torch__.*` classes become a plain `Module` holder that keeps the state
pickled for it (never run), `torch._utils._rebuild_tensor_v2` a numpy view
of the storage its persistent id names (bounds checked), storage classes
their dtype, `collections.OrderedDict` itself. Any other name, and any
class whose source defines `__setstate__` (its state is restored by its own
code), is refused with `Refused`. The state dict is then what
`torch.jit.load(path).state_dict()` gives: each module's `__parameters__`
and `__buffers__` as its class source declares them, depth first.
"""

from __future__ import annotations

import collections
import pickle
import re
import zipfile

import ml_dtypes
import numpy as np

_DTYPES = {
  "DoubleStorage": np.float64,
  "FloatStorage": np.float32,
  "HalfStorage": np.float16,
  "BFloat16Storage": ml_dtypes.bfloat16,
  "LongStorage": np.int64,
  "IntStorage": np.int32,
  "ShortStorage": np.int16,
  "CharStorage": np.int8,
  "ByteStorage": np.uint8,
  "BoolStorage": np.bool_,
}
# torch.jit._pickle's helpers only tag or wrap plain values.
_PLAIN = (
  "build_intlist",
  "build_floatlist",
  "build_boollist",
  "build_doublelist",
  "build_tensorlist",
  "build_complexlist",
  "restore_type_tag",
)


class Refused(Exception):
  """The archive needs its own code to load (the message says which part)."""


class Module:
  """A `__torch__.*` object: its class name and its pickled state."""

  qualname = ""
  state = None

  def __setstate__(self, state):  # BUILD: kept, never interpreted.
    self.state = state


def _plain(value, *unused):
  """torch.jit._pickle's helpers: the value itself (its type tag dropped)."""
  del unused
  return value


class _Storage:
  def __init__(self, array: np.ndarray):
    self.array = array


def _rebuild_tensor(storage, offset, size, stride, *unused) -> np.ndarray:
  """torch._utils._rebuild_tensor_v2 as a numpy view, inside its storage."""
  del unused  # requires_grad, backward hooks, metadata
  if not (
    isinstance(storage, _Storage)
    and isinstance(offset, int)
    and all(isinstance(n, int) and n >= 0 for n in (*size, *stride))
    and len(size) == len(stride)
    and offset >= 0
  ):
    raise pickle.UnpicklingError("a tensor with an invalid shape or storage")
  array = storage.array
  if 0 in size:
    return np.zeros(size, array.dtype)
  last = offset + sum((n - 1) * s for n, s in zip(size, stride))
  if last >= array.size:
    raise pickle.UnpicklingError(
      f"a tensor reaching element {last} of a storage of {array.size}"
    )
  return np.lib.stride_tricks.as_strided(
    array[offset:], size, [s * array.itemsize for s in stride], writeable=False
  )


class _DataUnpickler(pickle.Unpickler):
  """data.pkl -> `Module`s, numpy arrays and plain values; nothing runs."""

  def __init__(
    self,
    file,
    archive: zipfile.ZipFile,
    prefix: str,
    setstate: set[str],
    byteorder: str,
  ):
    super().__init__(file)
    self.archive, self.prefix, self.setstate = archive, prefix, setstate
    self.byteorder, self.storages = byteorder, {}

  def find_class(self, module, name):
    qualname = f"{module}.{name}"
    if module == "__torch__" or module.startswith("__torch__."):
      if qualname in self.setstate:
        raise Refused(
          f"its class {qualname} restores itself with its own "
          "code (__setstate__)"
        )
      return type("Module", (Module,), {"qualname": qualname})
    if module == "torch" and name in _DTYPES:
      return np.dtype(_DTYPES[name]).newbyteorder(self.byteorder)
    if (module, name) in (
      ("torch._utils", "_rebuild_tensor_v2"),
      ("torch._utils", "_rebuild_tensor"),
    ):
      return _rebuild_tensor
    if module == "torch._utils" and name == "_rebuild_parameter":
      return lambda data, *unused: data
    if module == "torch.jit._pickle" and name in _PLAIN:
      return _plain
    if (module, name) == ("collections", "OrderedDict"):
      return collections.OrderedDict
    raise Refused(f"it names {qualname}, which is not plain data")

  def persistent_load(self, pid):
    if not (
      isinstance(pid, tuple)
      and len(pid) == 5
      and pid[0] == "storage"
      and isinstance(pid[1], np.dtype)
      and isinstance(pid[2], str)
      and isinstance(pid[4], int)
    ):
      raise pickle.UnpicklingError(f"unknown persistent id {pid!r:.80}")
    _, dtype, key, _, numel = pid
    if key not in self.storages:
      info = self.archive.getinfo(f"{self.prefix}/data/{key}")
      if info.file_size != numel * dtype.itemsize:
        raise pickle.UnpicklingError(
          f"storage {key} has {info.file_size} bytes, not {numel} x "
          f"{dtype.itemsize}"
        )
      self.storages[key] = _Storage(
        np.frombuffer(self.archive.read(info), dtype)
      )
    return self.storages[key]


def _declarations(archive: zipfile.ZipFile, prefix: str):
  """From the classes' source (read, not run): {class: (parameter and buffer
  names)} and the classes that define `__setstate__`."""
  declared, setstate = {}, set()
  for name in archive.namelist():
    if not (name.startswith(f"{prefix}/code/") and name.endswith(".py")):
      continue
    module = name[len(f"{prefix}/code/") : -3].replace("/", ".")
    qualname = None
    for line in archive.read(name).decode("utf-8", "replace").splitlines():
      if match := re.match(r"class (\w+)\(", line):
        qualname = f"{module}.{match.group(1)}"
        declared[qualname] = []
      elif qualname and (
        match := re.match(r"  __(?:parameters|buffers)__ = \[(.*)\]", line)
      ):
        declared[qualname] += re.findall(r'"([^"]+)"', match.group(1))
      elif qualname and line.startswith("  def __setstate__("):
        setstate.add(qualname)
  return declared, setstate


def _tensors(module: Module, declared: dict, prefix: str, out: dict) -> None:
  """A module's parameters and buffers, then its submodules', as
  `Module.state_dict` orders them."""
  if not isinstance(module.state, dict):
    raise Refused(f"{module.qualname} has no attribute dict")
  names = declared.get(module.qualname)
  for name, value in module.state.items():
    if isinstance(value, np.ndarray) and (names is None or name in names):
      out[prefix + name] = value
  for name, value in module.state.items():
    if isinstance(value, Module):
      _tensors(value, declared, f"{prefix}{name}.", out)


def read(path: str) -> dict[str, np.ndarray]:
  """The parameters and buffers of a TorchScript archive, without its code.

  Returns:
    {name: numpy array in the stored dtype}, the names and values of
    `torch.jit.load(path).state_dict()`.

  Raises:
    Refused: the archive needs its code run to load (its message says why).
    zipfile.BadZipFile, KeyError, pickle.UnpicklingError, ...: damaged.
  """
  with zipfile.ZipFile(path) as archive:
    pickles = [
      n
      for n in archive.namelist()
      if n.count("/") == 1 and n.endswith("/data.pkl")
    ]
    if len(pickles) != 1:
      raise Refused("it is an older TorchScript format (no data.pkl)")
    prefix = pickles[0].split("/")[0]
    byteorder = "<"
    if f"{prefix}/byteorder" in archive.namelist():
      byteorder = {b"little": "<", b"big": ">"}[
        archive.read(f"{prefix}/byteorder").strip()
      ]
    declared, setstate = _declarations(archive, prefix)
    with archive.open(pickles[0]) as f:
      root = _DataUnpickler(f, archive, prefix, setstate, byteorder).load()
  if not isinstance(root, Module):
    raise Refused(f"its data.pkl holds a {type(root).__name__}, not a module")
  out = {}
  _tensors(root, declared, "", out)
  return out
