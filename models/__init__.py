"""The papers' networks and small ones, built by name.

>>> import models
>>> model = models.build_model("small_cnn", input_shape=(28, 28, 1),
...                            num_classes=10)
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


def build_model(name, input_shape, num_classes, **kwargs):
  """Builds model `name` for inputs of `input_shape` and `num_classes`.

  Raises:
    ValueError: for an unknown name, listing the valid ones.
  """
  if name not in _BUILDERS:
    raise ValueError(f"Unknown model {name!r}; valid models are "
                     f"{', '.join(MODEL_NAMES)}.")
  module, function = _BUILDERS[name]
  builder = getattr(importlib.import_module(module), function)
  return builder(input_shape=tuple(input_shape), num_classes=num_classes,
                 **kwargs)
