"""rudra_tf: Rudra's staleness-controlled parameter-server training for TensorFlow.

`import rudra_tf` stays light: TensorFlow is imported only when one of the
TensorFlow-backed names below is first used.
"""

import importlib
import sys

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



def _register_with_keras3():
  """Registers the Keras 3 optimizer wrapper with Keras 3, so that
  keras.models.load_model finds it, when Keras 3 is loaded already (and
  TensorFlow with it: the import then costs little)."""
  keras = sys.modules.get("keras")
  if keras is not None and str(getattr(keras, "__version__", "")).startswith(
      "3."):
    importlib.import_module("rudra_tf.keras3_optimizer")


_register_with_keras3()


def __getattr__(name):
  if name in _LAZY:
    return getattr(importlib.import_module(_LAZY[name]), name)
  if name in _MODULES:
    return importlib.import_module(f"rudra_tf.{name}")
  raise AttributeError(f"module 'rudra_tf' has no attribute {name!r}")
