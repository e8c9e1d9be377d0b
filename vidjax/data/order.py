"""The training order: the records shuffled each epoch.

Without jax (`vidjax.data.lean_worker`): the data workers unpickle it.
"""

from __future__ import annotations

import grain
import numpy as np


class EpochShuffle(grain.MapDataset):
  """The parent's elements in a new order each epoch, as Grain's
  `MapDataset.shuffle`, from one permutation an epoch.

  Element `index` is the parent's `order(epoch)[index % len] + epoch * len`
  (epoch `index // len`: a `repeat` after it passes the epochs through).
  Grain's shuffle finds each position with `index_shuffle`, which slows
  down as the set shrinks (about 20 ms / len a lookup under ~10,000
  elements: 1.7 ms a clip of a 12-clip set, 0.2 ms of a 100-clip one); a
  permutation costs microseconds to milliseconds once an epoch, and 4
  bytes an element (16 MB a process for Ego4D's 4 M clips). The two epochs
  last used are kept (reader threads at an epoch's boundary).
  `python -m benchmarks.pipeline` prints both costs.
  """

  def __init__(self, parent: grain.MapDataset, *, seed: int):
    super().__init__(parent)
    self._seed = seed
    self._orders: dict[int, np.ndarray] = {}

  def __len__(self) -> int:
    return len(self._parent)

  def __str__(self) -> str:
    return f"EpochShuffle(seed={self._seed})"

  def order(self, epoch: int) -> np.ndarray:
    """uint32[len]: the parent's positions in epoch `epoch`'s order."""
    if (order := self._orders.get(epoch)) is None:
      rng = np.random.default_rng([self._seed, epoch])
      order = rng.permutation(np.arange(len(self), dtype=np.uint32))
      self._orders[epoch] = order
      for old in [e for e in list(self._orders) if e not in (epoch, epoch - 1)]:
        self._orders.pop(old, None)
    return order

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    epoch, position = divmod(index, len(self))
    return self._parent[int(self.order(epoch)[position]) + epoch * len(self)]
