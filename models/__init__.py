"""The papers' networks and small ones, built by name.

>>> import models
>>> model = models.build_model("small_cnn", input_shape=(28, 28, 1),
...                            num_classes=10)                  # tf_keras
>>> model = models.build_model("small_cnn", (28, 28, 1), 10,
...                            keras="keras3")                   # Keras 3

Every network is built for either Keras, layer for layer the same.
"""

import importlib

# name -> (module, builder function)
_BUILDERS = {
    "cifar10_full": ("models.cifar10_full", "cifar10_full"),
    "alexnet": ("models.alexnet", "alexnet"),
    "small_cnn": ("models.small_cnn", "small_cnn"),
    "resnet20": ("models.resnet20", "resnet20"),
    "mlp": ("models.small_cnn", "mlp"),
}
MODEL_NAMES = tuple(sorted(_BUILDERS))
# --keras values: the Keras a model is built with, and its module.
KERAS_MODULES = {"tf_keras": "tf_keras", "keras3": "keras"}
KERAS_NAMES = tuple(KERAS_MODULES)


def keras_module(keras):
  """The module of Keras `keras` ("tf_keras" or "keras3").

  Raises:
    ValueError: for another name, listing the valid ones.
  """
  if keras not in KERAS_MODULES:
    raise ValueError(f"Unknown Keras {keras!r}; valid values are "
                     f"{', '.join(KERAS_NAMES)}.")
  return importlib.import_module(KERAS_MODULES[keras])


def build_model(name, input_shape, num_classes, keras="tf_keras", **kwargs):
  """Builds model `name` for inputs of `input_shape` and `num_classes`,
  with Keras `keras` ("tf_keras" or "keras3").

  Raises:
    ValueError: for an unknown name or Keras, listing the valid ones.
  """
  if name not in _BUILDERS:
    raise ValueError(f"Unknown model {name!r}; valid models are "
                     f"{', '.join(MODEL_NAMES)}.")
  module, function = _BUILDERS[name]
  keras = keras_module(keras)
  builder = getattr(importlib.import_module(module), function)
  return builder(input_shape=tuple(input_shape), num_classes=num_classes,
                 keras=keras, **kwargs)
