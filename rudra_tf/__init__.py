"""rudra_tf: Rudra's staleness-controlled parameter-server training for TensorFlow.

`import rudra_tf` stays light: TensorFlow is imported only when one of the
TensorFlow-backed names below is first used.
"""

import importlib

__version__ = "0.1.0"

_LAZY = {
    "RudraStrategy": "rudra_tf.strategy",
    "StalenessAwareOptimizer": "rudra_tf.optimizer",
    "LocalCluster": "rudra_tf.cluster",
    "StalenessReport": "rudra_tf.report",
    "StalenessLogger": "rudra_tf.callbacks",
    "PeriodicCheckpoint": "rudra_tf.checkpointing",
}

_MODULES = ("protocol", "checkpointing")

__all__ = sorted(_LAZY) + list(_MODULES)


def __getattr__(name):
  if name in _LAZY:
    return getattr(importlib.import_module(_LAZY[name]), name)
  if name in _MODULES:
    return importlib.import_module(f"rudra_tf.{name}")
  raise AttributeError(f"module 'rudra_tf' has no attribute {name!r}")
