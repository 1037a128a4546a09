"""StalenessAwareOptimizer: any tf_keras optimizer, applied by Rudra's rules."""

from absl import logging
import tensorflow as tf
import tf_keras

from rudra_tf import ledger as ledger_lib
from rudra_tf import protocol as protocol_lib
from rudra_tf import strategy as strategy_lib
from rudra_tf import tf_hooks
from rudra_tf import variables as variables_lib


class _CallableList(list):
  """A list that is also callable: tf_keras code calls `variables()`."""

  def __call__(self):
    return self


# Registered, so that tf_keras.models.load_model finds the class of a saved
# model's optimizer once rudra_tf is imported, with no custom_objects.
@tf_keras.saving.register_keras_serializable(package="rudra_tf")
class StalenessAwareOptimizer(tf_keras.optimizers.Optimizer):
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

  Keras 3: the inner optimizer may be a Keras 3 one (`keras.optimizers.SGD`,
  Adam, AdamW, ..., with a `keras.optimizers.schedules` schedule) for a
  Keras 3 model trained in a hand-written loop over ClusterCoordinator; a
  plain Keras 3 optimizer trains there too, as above. Its update rule is
  its own `update_step`, applied on the shards with the rate and step
  counter above (tf_hooks.Keras3OptimizerHooks). Keras 3's `model.fit`
  under RudraStrategy is not supported yet.

  Limitations: `use_ema=True`, and a Keras 3 optimizer's
  `gradient_accumulation_steps`, are not supported.
  """

  def __init__(self, optimizer, lr_policy=protocol_lib.LR_NONE,
               name="StalenessAwareOptimizer"):
    strategy = tf.distribute.get_strategy()
    if not isinstance(strategy, strategy_lib.RudraStrategy):
      raise ValueError(
          "StalenessAwareOptimizer must be created inside "
          "`with rudra_tf.RudraStrategy(...).scope():`; the current strategy "
          f"is {type(strategy).__name__}. To load a model saved with it "
          "for inference or evaluation without a cluster, pass "
          "compile=False to tf_keras.models.load_model.")
    if isinstance(optimizer, StalenessAwareOptimizer):
      raise ValueError("StalenessAwareOptimizer cannot wrap another "
                       "StalenessAwareOptimizer.")
    hooks = tf_hooks.optimizer_hooks(optimizer)
    if hooks is None:
      raise ValueError(
          "StalenessAwareOptimizer wraps a tf_keras optimizer such as "
          "tf_keras.optimizers.SGD or Adam, a legacy one such as "
          "tf_keras.optimizers.legacy.SGD, or (in loops over "
          "ClusterCoordinator) a Keras 3 one such as keras.optimizers.SGD; "
          f"got {optimizer!r}.")
    if hooks.uses_ema():
      raise ValueError("StalenessAwareOptimizer does not support an inner "
                       "optimizer with use_ema=True.")
    unsupported = hooks.unsupported()
    if unsupported:
      raise ValueError(
          f"StalenessAwareOptimizer does not support {unsupported}.")
    policy = protocol_lib.LearningRatePolicy.create(lr_policy,
                                                    strategy.protocol)
    super().__init__(name=name, jit_compile=False)
    self._optimizer = optimizer
    self._hooks = self._no_dependency(hooks)
    self._policy = policy
    self._strategy = self._no_dependency(strategy)

  # ----------------------------------------------------------- properties
  @property
  def inner_optimizer(self):
    return self._optimizer

  @property
  def lr_policy(self):
    return self._policy.name

  @property
  def learning_rate_multiplier(self):
    """m above: the constant factor on the inner learning rate."""
    return self._policy.multiplier

  @property
  def learning_rate(self):
    return self._optimizer.learning_rate

  @learning_rate.setter
  def learning_rate(self, learning_rate):
    self._optimizer.learning_rate = learning_rate

  @property
  def iterations(self):
    """Updates applied: the first parameter-server shard's timestamp."""
    shards = getattr(self, "_rudra_shards", None)
    return shards[0].timestamp if shards else self._iterations

  @property
  def variables(self):
    """The inner optimizer's variables, then each shard's protocol state.

    Callable too, as tf_keras's own (`optimizer.variables()`)."""
    shard_variables = []
    for shard in getattr(self, "_rudra_shards", None) or ():
      shard_variables += [shard.timestamp, shard.ledger]
      shard_variables += list(shard.accumulators)
    return _CallableList(self._hooks.variables() + shard_variables)

  def set_weights(self, weights):
    """Assigns `weights` (numpy arrays, in the order of `variables`).

    tf_keras's own assigns to the wrapper's private variable list, which
    holds none of this state; an .h5 model's optimizer state loads here.
    Raises ValueError, assigning nothing, when the values do not fit this
    strategy (another cluster size, ps count or protocol)."""
    if not getattr(self, "_built", False):
      raise ValueError(
          "set_weights() needs a built optimizer: call "
          "optimizer.build(model.trainable_variables) first.")
    variables = self.variables
    if len(weights) == 1 and len(variables) > 1 and not weights[0].shape:
      # Saved before its first step: the inner optimizer's step counter (0)
      # is all there is, and this fresh state is what it saved.
      return
    self._check_restorable(variables, weights)
    for variable, weight in zip(variables, weights):
      variable.assign(weight)
    # A restored ledger holds the tokens of the run that saved it; no
    # learner runs now, so each round restarts from its pending gradients.
    self._strategy.restore_exact_rounds()

  def load_own_variables(self, store):
    """Loads a .keras file's optimizer state (the order of `variables`)."""
    self.set_weights([store[str(i)] for i in range(len(store.keys()))])

  def _check_restorable(self, variables, weights):
    hint = ("load the model inside a RudraStrategy like the one that saved "
            "it, or with compile=False and compile it again")
    if len(weights) != len(variables):
      raise ValueError(
          f"The saved optimizer state has {len(weights)} arrays; this one has "
          f"{len(variables)} (inner optimizer state, then each parameter-"
          f"server shard's timestamp, ledger and accumulators): {hint}.")
    for variable, weight in zip(variables, weights):
      if tuple(variable.shape) != tuple(weight.shape):
        raise ValueError(
            f"Optimizer variable {variable.name} has shape {variable.shape}; "
            f"the saved value has shape {weight.shape}: {hint}.")
    ledgers = {id(shard.ledger): shard
               for shard in getattr(self, "_rudra_shards", None) or ()}
    protocol = self._strategy.protocol
    for variable, weight in zip(variables, weights):
      shard = ledgers.get(id(variable))
      if shard is None:
        continue
      pending = int(weight[ledger_lib.LedgerLayout.PENDING])
      if pending >= protocol.gradients_per_update:
        raise ValueError(
            f"The saved state of shard {shard.index} holds {pending} pending "
            f"gradients; {protocol.name} here updates after "
            f"c = {protocol.gradients_per_update}: {hint}.")

  # -------------------------------------------------------------- training
  def build(self, var_list):
    if getattr(self, "_built", False):
      return
    self._hooks.build(var_list)
    # The protocol state is built with the slots, so that a checkpoint
    # restored before training restores it too; tracked here, so that the
    # optimizer's checkpoints and saved models hold it.
    self._rudra_shards = self._strategy.build_shards()
    self._built = True

  def update_step(self, gradient, variable):
    raise NotImplementedError(
        "StalenessAwareOptimizer applies updates on the parameter-server "
        "shards; call apply_gradients inside a RudraStrategy training step.")

  def apply_gradients(self, grads_and_vars, name=None,
                      skip_gradients_aggregation=False, **kwargs):
    """Pushes this learner's gradients with the timestamps of its pull."""
    del name, skip_gradients_aggregation, kwargs
    grads_and_vars = list(grads_and_vars)
    refuse_mixed_kerases(self._optimizer, [v for _, v in grads_and_vars])
    return self._push(grads_and_vars)

  def _push(self, grads_and_vars):
    """apply_gradients for gradients already checked (the implicit
    wrapper's: a plain optimizer's, gathered by the strategy)."""
    pulled = variables_lib.current_pull()
    if pulled is None:
      raise ValueError(
          "StalenessAwareOptimizer.apply_gradients must run inside a "
          "RudraStrategy training step (model.fit, or strategy.run inside "
          "ClusterCoordinator.schedule), where the weights were pulled; an "
          "eager strategy.run runs on the chief, which is no learner.")
    # A Keras 3 model's variables wrap the strategy's tf.Variables.
    grads_and_vars = tf_hooks.filter_empty_gradients(
        [(gradient, tf_hooks.unwrap_keras3_variable(variable))
         for gradient, variable in grads_and_vars])
    if not grads_and_vars:
      return self.iterations
    grads, trainable_variables = zip(*grads_and_vars)
    with tf.init_scope():
      self.build(trainable_variables)
    if pulled.plan is not None:  # a probing trace: built, nothing pushed
      pulled.plan.pushed = True
      return self.iterations
    grads = self._hooks.clip(grads, trainable_variables)
    self._strategy.push_gradients(
        list(zip(grads, trainable_variables)), pulled, self._apply_update,
        self._policy)
    return self.iterations

  def _apply_update(self, mean_grads_and_vars, timestamp):
    """One update on one shard at `timestamp` (the shard clock's value
    before the update); run inside the shard's lock, except on the async
    fast path (`consistent_pulls=False`)."""
    learning_rate = (self._hooks.learning_rate_at(timestamp) *
                     self._policy.multiplier)
    for _, variable in mean_grads_and_vars:
      decay = self._hooks.weight_decay(variable)
      if decay:
        variable.assign_sub(variable.live_read() *
                            tf.cast(decay * learning_rate, variable.dtype))
    self._hooks.apply(mean_grads_and_vars, learning_rate, timestamp)
    for _, variable in mean_grads_and_vars:
      if variable.constraint is not None:
        variable.assign(variable.constraint(variable.live_read()))

  # --------------------------------------------------------- serialization
  def get_config(self):
    return {
        "name": self.name,
        "optimizer": tf_keras.optimizers.serialize(self._optimizer),
        "lr_policy": self._policy.name,
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


def refuse_mixed_kerases(optimizer, variables):
  """Raises ValueError if a tf_keras optimizer would train a Keras 3
  model's variables, or a Keras 3 optimizer a tf_keras model's."""
  keras3_optimizer = tf_hooks.is_keras3_optimizer(optimizer)
  for variable in variables:
    if tf_hooks.is_keras3_variable(variable) == keras3_optimizer:
      continue
    name = type(optimizer).__name__
    if keras3_optimizer:
      raise ValueError(
          f"A Keras 3 optimizer (keras.optimizers.{name}) cannot train the "
          f"tf_keras model variable {variable.name!r}: use "
          f"tf_keras.optimizers.{name} with a tf_keras model, or build the "
          "model with Keras 3 (import keras).")
    raise ValueError(
        f"A tf_keras optimizer ({name}) cannot train the Keras 3 model "
        f"variable {variable.path!r}: use keras.optimizers.{name} with a "
        "Keras 3 model, or build the model with tf_keras.")
