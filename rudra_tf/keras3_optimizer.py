"""Keras3StalenessAwareOptimizer: a Keras 3 optimizer, applied by Rudra's rules.

`rudra_tf.StalenessAwareOptimizer(keras.optimizers.SGD(...))` returns one of
these: Keras 3's `compile` takes only Keras 3 optimizers, so the wrapper of a
Keras 3 optimizer is a Keras 3 optimizer. Everything else (the push, the
update on the shards, the saved state) is `shard_updates.ShardUpdates`,
shared with the tf_keras wrapper.
"""

import contextlib

from absl import logging
import keras
import tensorflow as tf

from rudra_tf import compensation as compensation_lib
from rudra_tf import protocol as protocol_lib
from rudra_tf import shard_updates
from rudra_tf import strategy as strategy_lib


# Registered under the tf_keras wrapper's name, in Keras 3's registry, so
# that keras.models.load_model finds it once rudra_tf is imported.
@keras.saving.register_keras_serializable(package="rudra_tf",
                                          name="StalenessAwareOptimizer")
class Keras3StalenessAwareOptimizer(shard_updates.WrapperSurface,
                                    keras.optimizers.Optimizer):
  """Wraps a Keras 3 optimizer (by composition) for a RudraStrategy.

  Made by `rudra_tf.StalenessAwareOptimizer(optimizer, lr_policy)` when
  `optimizer` is a Keras 3 one (`keras.optimizers.SGD`, Adam, AdamW, ...,
  with a `keras.optimizers.schedules` schedule or not). The update rule is
  the tf_keras wrapper's: a shard that has gathered c = floor(λ/n)
  gradients applies

      θ(i+1) = θ(i) - m · α(i) · (1/c) · Σ_{l=1..c} w(σ_l) · g_l

  with the inner optimizer's `update_step`, its slots, and its (scheduled)
  rate α at the shard's timestamp i; m and w(σ) by `lr_policy` ("none",
  "divide_by_n", "divide_by_staleness"; see rudra_tf.StalenessAwareOptimizer).
  `compensation` ("none", "delay", "delay_adaptive", "gap_aware") corrects
  each g_l on the shard first, as there (rudra_tf/compensation.py).

      strategy = rudra_tf.RudraStrategy(resolver, protocol="2-softsync")
      with strategy.scope():
        model = keras.Sequential([keras.Input((784,)),
                                  keras.layers.Dense(10)])
        model.compile(
            optimizer=rudra_tf.StalenessAwareOptimizer(
                keras.optimizers.SGD(0.1, momentum=0.9), "divide_by_n"),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
      model.fit(x_train, y_train, batch_size=32, epochs=2)

  `iterations` is the first shard's timestamp (updates applied); setting
  `learning_rate` (LearningRateScheduler) sets the inner optimizer's.
  Saved to .keras with the inner optimizer's config and state and each
  shard's protocol state; `keras.models.load_model` inside a RudraStrategy's
  scope resumes from it, and outside one returns the model compiled with
  the inner optimizer (fresh state).

  Limitations: the inner optimizer's `use_ema` and
  `gradient_accumulation_steps` are refused (each learner step pushes one
  gradient); mixed-precision loss scaling is not applied.
  """

  def __init__(self, optimizer, lr_policy=protocol_lib.LR_NONE,
               name="StalenessAwareOptimizer", *,
               compensation=compensation_lib.NONE,
               compensation_strength=None):
    strategy = shard_updates.current_rudra_strategy(
        "keras.models.load_model")
    # Imported here: the tf_keras wrapper imports this module.
    from rudra_tf import optimizer as optimizer_lib  # pylint: disable=g-import-not-at-top
    hooks = shard_updates.checked_hooks(optimizer,
                                        optimizer_lib.wrapper_classes())
    updates = shard_updates.ShardUpdates(hooks, lr_policy, strategy,
                                         compensation, compensation_strength)
    super().__init__(learning_rate=0.0, name=name)
    self._optimizer = optimizer
    # Plain attributes: Keras 3 tracks what is set through setattr.
    object.__setattr__(self, "_updates", updates)
    object.__setattr__(self, "_rudra_shards", None)

  # ----------------------------------------------------------- properties
  # (inner_optimizer, lr_policy, learning_rate, iterations, set_weights,
  # load_own_variables: shard_updates.WrapperSurface)
  @property
  def variables(self):
    """The inner optimizer's variables, then each shard's protocol state."""
    return self._updates.variables()

  def save_own_variables(self, store):
    for index, variable in enumerate(self.variables):
      store[str(index)] = variable.numpy()

  # -------------------------------------------------------------- training
  def build(self, variables):
    # The shards are built with the slots, so that a restore before the
    # first step finds them; an attribute the checkpoint tracks.
    if not self.built:
      # Keras 3 places slots with the strategy's colocate_vars_with, which
      # needs its scope (a restored checkpoint's caller may be outside).
      with (contextlib.nullcontext() if tf.distribute.has_strategy() else
            self._updates.strategy.scope()):
        shards = self._updates.build(variables)
      self._rudra_shards = list(shards)
      self._rudra_compensation = self._updates.compensation_variables()
      self.built = True

  def update_step(self, gradient, variable, learning_rate):
    raise NotImplementedError(
        "StalenessAwareOptimizer applies updates on the parameter-server "
        "shards; call apply_gradients inside a RudraStrategy training step.")

  def apply_gradients(self, grads_and_vars):
    """Pushes this learner's gradients with the timestamps of its pull."""
    return self.apply_gradients_checked(grads_and_vars)

  def apply(self, grads, trainable_variables=None):
    if trainable_variables is None:
      trainable_variables = self._trainable_variables
    return self.apply_gradients(zip(grads, trainable_variables))

  def finalize_variable_values(self, var_list):
    del var_list  # no EMA: the shards' weights are final as they are

  # --------------------------------------------------------- serialization
  def get_config(self):
    return {
        "name": self.name,
        "optimizer": keras.optimizers.serialize(self._optimizer),
        "lr_policy": self._updates.policy.name,
        **self._updates.compensation.get_config(),
    }

  @classmethod
  def from_config(cls, config, custom_objects=None):
    config = dict(config)
    inner = keras.optimizers.deserialize(config.pop("optimizer"),
                                         custom_objects=custom_objects)
    if not isinstance(tf.distribute.get_strategy(),
                      strategy_lib.RudraStrategy):
      logging.warning(
          "Loading a StalenessAwareOptimizer outside a RudraStrategy: the "
          "model is compiled with its inner optimizer (%s), with fresh "
          "state; load it inside a RudraStrategy's scope to train on from "
          "the saved state.", type(inner).__name__)
      return inner
    return cls(inner, **config)
