"""Deprecated: the evaluation metrics are `vidjax.metrics` now.

`from vidjax.evaluate import ek100_mir_metrics` keeps working, with a
`DeprecationWarning`; import from `vidjax.metrics` instead.
"""
import warnings

from vidjax.metrics import *  # noqa: F401,F403  pylint: disable=wildcard-import
from vidjax.metrics import __all__  # noqa: F401

warnings.warn("vidjax.evaluate is deprecated: import vidjax.metrics instead",
              DeprecationWarning, stacklevel=2)
