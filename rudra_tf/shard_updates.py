"""ShardUpdates: what a StalenessAwareOptimizer does, for either Keras.

The wrapper exists twice, because each Keras accepts only its own optimizer
class: `optimizer.StalenessAwareOptimizer` (a tf_keras optimizer) and
`keras3_optimizer.Keras3StalenessAwareOptimizer` (a Keras 3 one). Both hold
one `ShardUpdates` and hand it everything but the Keras surface:

    learner step                          parameter-server shard
    ------------                          ----------------------
    apply_gradients(grads_and_vars)
      -> push(): clip, send with the  ->  strategy.push_gradients: staleness,
         timestamps of the step's pull     w(σ), gather c gradients, then
                                           apply_update(mean, timestamp):
                                           weight decay, the inner rule at
                                           rate m · α(timestamp), constraints

With a compensation rule (compensation.py) the push also carries the pulled
weights θ_pulled, and the shard corrects each accepted gradient with the
rule (`_correct`, against its live weights θ_now) before weighing it.

The state both save: the inner optimizer's variables, then each shard's
timestamp, ledger and accumulators, then the rule's per-parameter state if
it keeps any (`variables`, `set_weights`).
"""

import tensorflow as tf

from rudra_tf import compensation as compensation_lib
from rudra_tf import ledger as ledger_lib
from rudra_tf import protocol as protocol_lib
from rudra_tf import strategy as strategy_lib
from rudra_tf import tf_hooks
from rudra_tf import variables as variables_lib


# compensation.py's operations on tensors.
_TENSOR_OPS = compensation_lib.Ops(tf.sqrt, tf.abs)


def checked_hooks(optimizer, wrapper_classes):
  """The inner optimizer's adapter (tf_hooks), or ValueError naming what
  the wrapper cannot wrap; `wrapper_classes`: both wrappers' classes."""
  if isinstance(optimizer, wrapper_classes):
    raise ValueError("StalenessAwareOptimizer cannot wrap another "
                     "StalenessAwareOptimizer.")
  hooks = tf_hooks.optimizer_hooks(optimizer)
  if hooks is None:
    raise ValueError(
        "StalenessAwareOptimizer wraps a tf_keras optimizer such as "
        "tf_keras.optimizers.SGD or Adam, a legacy one such as "
        "tf_keras.optimizers.legacy.SGD, or a Keras 3 one such as "
        f"keras.optimizers.SGD; got {optimizer!r}.")
  if hooks.uses_ema():
    raise ValueError("StalenessAwareOptimizer does not support an inner "
                     "optimizer with use_ema=True.")
  unsupported = hooks.unsupported()
  if unsupported:
    raise ValueError(f"StalenessAwareOptimizer does not support {unsupported}.")
  return hooks


def current_rudra_strategy(loader_hint):
  """The RudraStrategy in scope, or ValueError ending with `loader_hint`."""
  strategy = tf.distribute.get_strategy()
  if not isinstance(strategy, strategy_lib.RudraStrategy):
    raise ValueError(
        "StalenessAwareOptimizer must be created inside "
        "`with rudra_tf.RudraStrategy(...).scope():`; the current strategy "
        f"is {type(strategy).__name__}. To load a model saved with it "
        "for inference or evaluation without a cluster, pass "
        f"compile=False to {loader_hint}.")
  return strategy


class ShardUpdates:
  """One wrapper's inner optimizer, policy and shards (see module doc)."""

  def __init__(self, hooks, lr_policy, strategy,
               compensation=compensation_lib.NONE, compensation_strength=None):
    self.hooks = hooks
    self.policy = protocol_lib.LearningRatePolicy.create(lr_policy,
                                                         strategy.protocol)
    self.compensation = compensation_lib.Compensation.create(
        compensation, compensation_strength)
    self.strategy = strategy
    self.shards = None
    # The rule's state of each model variable (by id): (mean square, count).
    self.compensation_state = {}

  def build(self, var_list):
    """Builds the inner optimizer's slots, the shards and the compensation
    rule's state; returns the shards (the wrapper tracks them, so that
    checkpoints hold them)."""
    if self.shards is None:
      self.hooks.build(var_list)
      self.shards = self.strategy.build_shards()
      if self.compensation.keeps_mean_square:
        self._build_compensation_state()
    return self.shards

  def _build_compensation_state(self):
    """ms (or v) and t of each shard variable, on its ps task."""
    with self.strategy.state_scope():
      for shard in self.shards:
        for index, variable in enumerate(shard.model_variables):
          with self.strategy.extended.colocate_vars_with(variable):
            self.compensation_state[id(variable)] = (
                tf.Variable(tf.zeros(variable.shape, variable.dtype),
                            trainable=False, name=(
                                f"rudra/shard_{shard.index}/"
                                f"{self.compensation.name}_mean_square_{index}")),
                tf.Variable(tf.zeros([], variable.dtype), trainable=False,
                            name=(f"rudra/shard_{shard.index}/"
                                  f"{self.compensation.name}_count_{index}")))

  def variables(self):
    """The inner optimizer's variables, then each shard's protocol state,
    then the compensation rule's (mean square and count per variable)."""
    shard_variables = []
    for shard in self.shards or ():
      shard_variables += [shard.timestamp, shard.ledger]
      shard_variables += list(shard.accumulators)
    return (self.hooks.variables() + shard_variables +
            self.compensation_variables())

  def compensation_variables(self):
    """The compensation rule's state, shard by shard: each variable's mean
    square, then its count (empty for "none" and "delay")."""
    state = []
    for shard in self.shards or ():
      for variable in shard.model_variables:
        state += list(self.compensation_state.get(id(variable), ()))
    return state

  def set_weights(self, weights):
    """Assigns `weights` (in the order of `variables`); ValueError, and
    nothing assigned, when they do not fit this strategy."""
    if self.shards is None:
      raise ValueError(
          "set_weights() needs a built optimizer: call "
          "optimizer.build(model.trainable_variables) first.")
    variables = self.variables()
    if len(weights) == 1 and len(variables) > 1 and not weights[0].shape:
      # Saved before its first step: the inner optimizer's step counter (0)
      # is all there is, and this fresh state is what it saved.
      return
    self._check_restorable(variables, weights)
    for variable, weight in zip(variables, weights):
      variable.assign(weight)
    # A restored ledger holds the tokens of the run that saved it; no
    # learner runs now, so each round restarts from its pending gradients.
    self.strategy.restore_exact_rounds()

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
    ledgers = {id(shard.ledger): shard for shard in self.shards}
    protocol = self.strategy.protocol
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

  def push(self, grads_and_vars, build):
    """Pushes this learner step's gradients (graph code); `build`: the
    wrapper's build, called once on the variables first seen here."""
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
      return
    grads, trainable_variables = zip(*grads_and_vars)
    with tf.init_scope():
      build(trainable_variables)
    if pulled.plan is not None:  # a probing trace: built, nothing pushed
      pulled.plan.pushed = True
      return
    grads = self.hooks.clip(grads, trainable_variables)
    self.strategy.push_gradients(
        list(zip(grads, trainable_variables)), pulled, self._apply_update,
        self.policy,
        correct=self._correct if self.compensation.enabled else None)

  def _correct(self, gradient, variable, pulled, timestamp):
    """One accepted gradient corrected by the compensation rule, on the
    shard inside its lock: θ_now is the variable's live value, θ_pulled
    what the learner computed on, α the step's rate m · α(timestamp)."""
    gradient = tf.convert_to_tensor(gradient)
    dtype = gradient.dtype
    mean_square, count = self.compensation_state.get(id(variable),
                                                     (None, None))
    step_size = None
    if self.compensation.name == compensation_lib.GAP_AWARE:
      step_size = tf.cast(self.hooks.learning_rate_at(timestamp) *
                          self.policy.multiplier, dtype)
    corrected, new_mean_square, new_count = self.compensation.correct(
        gradient, tf.cast(variable.live_read(), dtype), tf.cast(pulled, dtype),
        0.0 if mean_square is None else mean_square.live_read(),
        0.0 if count is None else count.live_read(), step_size,
        ops=_TENSOR_OPS)
    if mean_square is None:
      return corrected
    with tf.control_dependencies([mean_square.assign(new_mean_square),
                                  count.assign(new_count)]):
      return tf.identity(corrected)

  def _apply_update(self, mean_grads_and_vars, timestamp):
    """One update on one shard at `timestamp` (the shard clock's value
    before the update); run inside the shard's lock, except on the async
    fast path (`consistent_pulls=False`)."""
    learning_rate = (self.hooks.learning_rate_at(timestamp) *
                     self.policy.multiplier)
    for _, variable in mean_grads_and_vars:
      decay = self.hooks.weight_decay(variable)
      if decay:
        variable.assign_sub(variable.live_read() *
                            tf.cast(decay * learning_rate, variable.dtype))
    self.hooks.apply(mean_grads_and_vars, learning_rate, timestamp)
    for _, variable in mean_grads_and_vars:
      if variable.constraint is not None:
        variable.assign(variable.constraint(variable.live_read()))


class WrapperSurface:
  """What both wrapper classes show of their inner optimizer and
  ShardUpdates (listed first among a wrapper's bases, so that these
  properties stand over the Keras optimizer's own). A wrapper sets
  `_optimizer`, `_updates` and, once built, `_rudra_shards`."""

  @property
  def inner_optimizer(self):
    return self._optimizer

  @property
  def lr_policy(self):
    return self._updates.policy.name

  @property
  def compensation(self):
    """The compensation rule's name (compensation.py)."""
    return self._updates.compensation.name

  @property
  def compensation_strength(self):
    """λ_dc ("delay") or λ0 ("delay_adaptive"); None for the others."""
    return self._updates.compensation.strength

  @property
  def learning_rate_multiplier(self):
    """m: the constant factor on the inner learning rate."""
    return self._updates.policy.multiplier

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

  def set_weights(self, weights):
    """Assigns `weights` (numpy arrays, in the order of `variables`).

    The Keras optimizers' own assign to the wrapper's private variable
    list, which holds none of this state; an .h5 model's optimizer state
    loads here. Raises ValueError, assigning nothing, when the values do
    not fit this strategy (another cluster size, ps count or protocol)."""
    self._updates.set_weights(weights)

  def load_own_variables(self, store):
    """Loads a .keras file's optimizer state (the order of `variables`)."""
    self.set_weights([store[str(i)] for i in range(len(store.keys()))])

  def apply_gradients_checked(self, grads_and_vars):
    """apply_gradients: refuses the other Keras's variables, then pushes."""
    grads_and_vars = list(grads_and_vars)
    refuse_mixed_kerases(self._optimizer, [v for _, v in grads_and_vars])
    return self._push(grads_and_vars)

  def _push(self, grads_and_vars):
    """apply_gradients for gradients already checked (the implicit
    wrapper's: a plain optimizer's, gathered by the strategy)."""
    self._updates.push(grads_and_vars, self.build)
    return self.iterations


def refuse_mixed_kerases(optimizer, variables):
  """Raises ValueError if a tf_keras optimizer would train a Keras 3
  model's variables, or a Keras 3 optimizer a tf_keras model's."""
  keras3_optimizer = tf_hooks.is_keras3_optimizer(optimizer)
  for variable in variables:
    if tf_hooks.is_keras3_variable(variable) != keras3_optimizer:
      raise _mixing_error(
          optimizer, keras3_optimizer,
          f"model variable {getattr(variable, 'path', variable.name)!r}")


def refuse_mixed_compile(model, optimizer):
  """At compile under a RudraStrategy: ValueError if `optimizer` (wrapped
  or plain) is of the other Keras than `model`; strings and None pass."""
  if not isinstance(model.distribute_strategy, strategy_lib.RudraStrategy):
    return
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  if tf_hooks.optimizer_hooks(inner) is None:
    return
  keras3_optimizer = tf_hooks.is_keras3_optimizer(inner)
  if tf_hooks.is_keras3_model(model) != keras3_optimizer:
    raise _mixing_error(inner, keras3_optimizer, f"model {model.name!r}")


def _mixing_error(optimizer, keras3_optimizer, what):
  name = type(optimizer).__name__
  if keras3_optimizer:
    return ValueError(
        f"A Keras 3 optimizer (keras.optimizers.{name}) cannot train the "
        f"tf_keras {what}: use tf_keras.optimizers.{name} with a tf_keras "
        "model, or build the model with Keras 3 (import keras).")
  return ValueError(
      f"A tf_keras optimizer ({name}) cannot train the Keras 3 {what}: use "
      f"keras.optimizers.{name} with a Keras 3 model, or build the model "
      "with tf_keras.")
