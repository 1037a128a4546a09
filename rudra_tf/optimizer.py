"""StalenessAwareOptimizer: any tf_keras optimizer, applied by Rudra's rules."""

from absl import logging
import tensorflow as tf
import tf_keras

from rudra_tf import compensation as compensation_lib
from rudra_tf import protocol as protocol_lib
from rudra_tf import shard_updates
from rudra_tf import strategy as strategy_lib
from rudra_tf import tf_hooks


class _CallableList(list):
  """A list that is also callable: tf_keras code calls `variables()`."""

  def __call__(self):
    return self


# Registered, so that tf_keras.models.load_model finds the class of a saved
# model's optimizer once rudra_tf is imported, with no custom_objects.
@tf_keras.saving.register_keras_serializable(package="rudra_tf")
class StalenessAwareOptimizer(shard_updates.WrapperSurface,
                              tf_keras.optimizers.Optimizer):
  """Wraps a tf_keras optimizer (by composition) for a RudraStrategy.

  A learner's `apply_gradients` pushes its gradients, with the timestamp of
  the weights they were computed on, to the parameter-server shards. A shard
  that has gathered c = floor(λ/n) gradients applies one update with the
  wrapped optimizer (its slots, schedule and hyper-parameters):

      θ(i+1) = θ(i) - m · α(i) · (1/c) · Σ_{l=1..c} w(σ_l) · g_l

  where α(i) is the inner optimizer's (scheduled) learning rate at the shard's
  timestamp i, and by `lr_policy`:

  * "none":                m = 1,   w(σ) = 1.
  * "divide_by_n":         m = 1/n for n-softsync, 1/λ for async, 1 for
                           hardsync (the ICDM rule α0 / <σ>); w(σ) = 1.
  * "divide_by_staleness": m = 1,   w(σ) = 1/σ for σ > 0, 1 for σ = 0
                           (the IJCAI follow-up's per-gradient rule).

  `compensation` corrects each accepted gradient g, on the shard and
  before its weight w(σ), by how far the weights moved since its pull
  (rudra_tf/compensation.py, where the rules are worked by hand):

  * "none" (the default): g as it is.
  * "delay" (DC-ASGD): g + λ_dc · g ⊙ g ⊙ (θ_now − θ_pulled), λ_dc =
    `compensation_strength` (default 0.04).
  * "delay_adaptive" (DC-ASGD-a): the same with λ_dc = λ0 / sqrt(ms + ε)
    per parameter, ms a moving average (0.95) of g ⊙ g; λ0 =
    `compensation_strength` (default 2.0).
  * "gap_aware": g / G, G = 1 + |θ_now − θ_pulled| / C per parameter, C =
    α · sqrt(v̂) the typical step (v̂ a bias-corrected moving average
    (0.999) of g ⊙ g, α = m · α(i)).

  A rule needs θ_pulled on the shard: the learner sends the weights it
  pulled with its gradients, so a push carries the model twice (a row
  gradient travels dense). Each rule combines with any lr_policy ("none"
  compares a rule with Rudra's α0/n and α0/σ at the same α0) and any
  protocol; for hardsync θ_now = θ_pulled and only the rule's state
  moves. The rule's state (ms or v, and its count, per parameter) lives
  on the ps next to the variable and is saved with the optimizer.

  For SGD the update is exactly the paper's. For adaptive optimizers (Adam)
  the inner rule receives the weighted mean gradient; m still multiplies the
  step size, and the timestamp drives Adam's bias correction.

  The inner optimizer's gradient clipping runs on the learner, before the
  push; its weight decay and variable constraints run with each update.

  Must be created inside `RudraStrategy.scope()`. The inner optimizer may
  be a tf_keras optimizer (SGD, Adam, AdamW, ...) or a legacy one
  (`tf_keras.optimizers.legacy.SGD`, `RMSprop`, ..., as TensorFlow's
  parameter-server tutorial uses): a legacy optimizer's `decay` and
  schedule then count the shard's updates (its timestamp), as they count
  the steps of plain training. It may be created outside the scope, as
  stock ParameterServerStrategy allows: its learning rate and step
  counter then stay on the chief, and each update reads them from there.

  Unwrapped: a model compiled (or a custom loop written) with a plain
  tf_keras optimizer trains too: RudraStrategy gathers each step's
  gradients from the optimizer's own apply_gradients and pushes them
  through an implicit wrapper with lr_policy "none" (rudra_tf/strategy.py,
  `_StepGradients`). Wrap it yourself to choose another policy, and to
  have the protocol state (each shard's timestamp, counters and pending
  gradients) saved with the optimizer: an unwrapped optimizer's
  checkpoints hold its own variables only, as under stock PSS.

  Saving: `model.save` to .keras or .h5 stores the wrapper's config and its
  state (the inner optimizer's slots, each shard's timestamp, counters,
  histogram and pending gradients); `tf_keras.models.load_model` inside a
  new RudraStrategy's scope resumes from it. Loaded where no RudraStrategy
  is current, it is a plain tf_keras model compiled with the inner
  optimizer (fresh state; tf_keras then warns that it skipped the saved
  optimizer variables). The SavedModel format, as in plain tf_keras,
  restores no optimizer state.

  Keras 3: wrapping a Keras 3 optimizer (`keras.optimizers.SGD`, Adam,
  AdamW, ..., with a `keras.optimizers.schedules` schedule) returns a
  `keras3_optimizer.Keras3StalenessAwareOptimizer` (Keras 3's compile takes
  only Keras 3 optimizers) with the same rule, arguments and saved state:
  a Keras 3 model then trains with `model.fit` (rudra_tf/keras3_training.py)
  or in a hand-written loop over ClusterCoordinator, where a plain Keras 3
  optimizer trains too, as above. Its update rule is its own
  `update_step`, applied on the shards with the rate and step counter
  above (tf_hooks.Keras3OptimizerHooks). A tf_keras optimizer on a Keras 3
  model, or the reverse, is refused at compile.

  Limitations: `use_ema=True`, and a Keras 3 optimizer's
  `gradient_accumulation_steps`, are not supported. With a compensation
  rule every update runs inside the shard's lock (async's unlocked path
  under `consistent_pulls=False` is not taken: the rule's state and θ_now
  must be one version), a push carries the model's size M more bytes, and
  an embedding's row gradient travels dense.
  """

  def __new__(cls, optimizer=None, *args, **kwargs):
    # A Keras 3 optimizer gets the Keras 3 wrapper: Keras 3's compile
    # accepts only its own optimizer class.
    if cls is StalenessAwareOptimizer and tf_hooks.is_keras3_optimizer(
        optimizer):
      from rudra_tf import keras3_optimizer  # pylint: disable=g-import-not-at-top
      return keras3_optimizer.Keras3StalenessAwareOptimizer(
          optimizer, *args, **kwargs)
    return super().__new__(cls)

  def __init__(self, optimizer, lr_policy=protocol_lib.LR_NONE,
               name="StalenessAwareOptimizer", *,
               compensation=compensation_lib.NONE,
               compensation_strength=None):
    strategy = shard_updates.current_rudra_strategy(
        "tf_keras.models.load_model")
    hooks = shard_updates.checked_hooks(optimizer, wrapper_classes())
    updates = shard_updates.ShardUpdates(hooks, lr_policy, strategy,
                                         compensation, compensation_strength)
    super().__init__(name=name, jit_compile=False)
    self._optimizer = optimizer
    self._updates = self._no_dependency(updates)
    self._strategy = self._no_dependency(strategy)

  # ----------------------------------------------------------- properties
  # (inner_optimizer, lr_policy, learning_rate, iterations, set_weights:
  # shard_updates.WrapperSurface)
  @property
  def variables(self):
    """The inner optimizer's variables, then each shard's protocol state.

    Callable too, as tf_keras's own (`optimizer.variables()`)."""
    return _CallableList(self._updates.variables())

  # -------------------------------------------------------------- training
  def build(self, var_list):
    # The protocol state is built with the slots, so that a checkpoint
    # restored before training restores it too; tracked here, so that the
    # optimizer's checkpoints and saved models hold it.
    self._rudra_shards = self._updates.build(var_list)
    # Tracked too: the compensation rule's state (none for most rules).
    self._rudra_compensation = self._updates.compensation_variables()

  def update_step(self, gradient, variable):
    raise NotImplementedError(
        "StalenessAwareOptimizer applies updates on the parameter-server "
        "shards; call apply_gradients inside a RudraStrategy training step.")

  def apply_gradients(self, grads_and_vars, name=None,
                      skip_gradients_aggregation=False, **kwargs):
    """Pushes this learner's gradients with the timestamps of its pull."""
    del name, skip_gradients_aggregation, kwargs
    return self.apply_gradients_checked(grads_and_vars)

  # --------------------------------------------------------- serialization
  def get_config(self):
    return {
        "name": self.name,
        "optimizer": tf_keras.optimizers.serialize(self._optimizer),
        "lr_policy": self._updates.policy.name,
        **self._updates.compensation.get_config(),
        # tf_keras's deserializer takes a config without it for a legacy
        # optimizer (and then cannot find this class in an .h5 file).
        "is_legacy_optimizer": False,
    }

  @classmethod
  def from_config(cls, config, custom_objects=None):
    config = dict(config)
    config.pop("is_legacy_optimizer", None)
    inner = config.pop("optimizer")
    if tf_hooks.optimizer_hooks(inner) is None:
      # Its config says whether it is a legacy optimizer.
      inner = tf_keras.optimizers.deserialize(
          inner, custom_objects=custom_objects)
    if not isinstance(tf.distribute.get_strategy(),
                      strategy_lib.RudraStrategy):
      # load_model with no RudraStrategy around: a plain tf_keras model,
      # compiled with the inner optimizer (fresh: the saved state belongs
      # to the parameter-server shards).
      logging.warning(
          "Loading a StalenessAwareOptimizer outside a RudraStrategy: the "
          "model is compiled with its inner optimizer (%s), with fresh "
          "state; load it inside a RudraStrategy's scope to train on from "
          "the saved state.", type(inner).__name__)
      return inner
    return cls(inner, **config)


def wrapper_classes():
  """Both StalenessAwareOptimizer classes (tf_keras's, Keras 3's)."""
  from rudra_tf import keras3_optimizer  # pylint: disable=g-import-not-at-top
  return (StalenessAwareOptimizer,
          keras3_optimizer.Keras3StalenessAwareOptimizer)
