"""Every private TensorFlow, tf_keras and Keras 3 hook rudra_tf uses, by name.

tensorflow and tf-keras are pinned to 2.21.*, keras to 3.15.* (setup.py),
because rudra_tf reaches past their public APIs here, and nowhere else: no
other module imports `tensorflow.python`, `tf_keras.src` or `keras.src`, or
touches a private attribute of theirs. An upgrade is this one file to read, and
tests/test_tf_hooks.py, which pins each adapter against the installed
releases, fails first and names which.

ParameterServerStrategy
    `ParameterServerExtended` (the class RudraExtended extends, overriding
    `_create_var_creator`, `_create_variable`,
    `_distribute_datasets_from_function` and `_update`),
    `use_extended_class`, `distributed_datasets_from_function`,
    `being_scheduled`, `num_workers`, `coordinator_of`, `ShardedVariable`.
ClusterCoordinator
    `PerWorkerDatasetFromFunction`, `PerWorkerIterator`, `iterator_spec`,
    `set_type_spec`, `dataset_output_spec`, `scheduled_argument_specs`,
    `traced_dataset_function`, `cluster_workers`, `closure_queue`,
    `wrap_closure_failure`,
    `wrap_closure_queue`, `inflight_closures`, `pending_error`,
    `dispatching_worker_index`, `outside_closure_cancellation`.
Graphs
    `AutoTrackable`, `enclosing_graph_names`, `inside_while_loop`,
    `inside_autograph_trial`, `capture_at_dispatch`,
    `chief_cpu_device`, `colocated_with_nothing`, `autograph_converted`.
tf_keras
    `created_by_model_method`, `is_step_of`, `filter_empty_gradients`,
    `optimizer_hooks` (`KerasOptimizerHooks`, `LegacyOptimizerHooks`: build,
    clip, learning rate, weight decay, one update), `optimizer_of_update`,
    `unwrap_autocast`.
Keras 3 (keras 3.15.*, imported only where the user imported it)
    `Keras3OptimizerHooks` (the same surface, over `update_step` and
    `_clip_gradients`), `is_keras3_optimizer`, `unwrap_keras3_variable`,
    and TFOptimizer's update functions in `optimizer_of_update`.
Variables and data
    `CachingVariable`, `wrapped_variable`, `record_variable_read`,
    `sleep_transformation`.
"""

import contextlib
import functools
import importlib
import inspect
import sys
import threading

import tensorflow as tf
from tensorflow.python.autograph.core import ag_ctx
from tensorflow.python.autograph.impl import api as autograph
from tensorflow.python.data.experimental.ops import testing as tf_data_testing
from tensorflow.python.distribute import input_lib
from tensorflow.python.distribute import input_util
from tensorflow.python.distribute import parameter_server_strategy_v2 as pss
from tensorflow.python.distribute import ps_values
from tensorflow.python.distribute.coordinator import cluster_coordinator
from tensorflow.python.distribute.coordinator import coordinator_context
from tensorflow.python.distribute.coordinator import values as values_lib
from tensorflow.python.eager import cancellation
from tensorflow.python.eager import context
from tensorflow.python.eager import record
from tensorflow.python.framework import ops
from tensorflow.python.ops import resource_variable_ops

# pylint: disable=protected-access

# ------------------------------------------------- ParameterServerStrategy
ParameterServerExtended = pss.ParameterServerStrategyV2Extended
ShardedVariable = tf.__internal__.distribute.ShardedVariable


def use_extended_class(strategy, extended_class):
  """Makes `strategy.extended` an `extended_class` (a subclass of
  ParameterServerExtended with no state of its own), after
  ParameterServerStrategy's constructor built the extended object."""
  strategy._extended.__class__ = extended_class


def distributed_datasets_from_function(extended, dataset_fn, options,
                                       input_context):
  """What ParameterServerStrategy's `_distribute_datasets_from_function`
  builds, with `input_context` instead of TF's one context for all."""
  return input_util.get_distributed_datasets_from_function(
      dataset_fn, extended._input_workers_with_options(options),
      [input_context], extended._container_strategy(), options=options,
      build=ops.inside_function())


@contextlib.contextmanager
def being_scheduled(strategy):
  """The flag ClusterCoordinator.schedule sets while it traces a function
  (variables created meanwhile are per-worker, not ps variables)."""
  strategy.extended._being_scheduled = True
  try:
    yield
  finally:
    strategy.extended._being_scheduled = False


def num_workers(strategy):
  """The worker tasks of a (stock) ParameterServerStrategy."""
  return strategy._num_workers


def coordinator_of(strategy):
  """The strategy's ClusterCoordinator (one per strategy), or None."""
  return getattr(strategy, "_cluster_coordinator", None)


# ------------------------------------------------------ ClusterCoordinator
PerWorkerDatasetFromFunction = values_lib.PerWorkerDatasetFromDatasetFunction
PerWorkerIterator = values_lib.PerWorkerDistributedIterator
iterator_spec = input_lib.get_iterator_spec_from_dataset


def set_type_spec(remote_value, type_spec):
  """A per-worker resource's spec, as TF's own per-worker dataset sets it."""
  remote_value._type_spec = type_spec


def dataset_output_spec(dataset_function):
  """The type spec of what a traced dataset function returns."""
  return dataset_function.structured_outputs._type_spec


def scheduled_argument_specs(structure):
  """Type specs of scheduled arguments, as the coordinator traces them."""
  return tf.nest.map_structure(
      cluster_coordinator._maybe_as_type_spec,
      cluster_coordinator._select_worker_slice(0, structure))


def cluster_workers(coordinator):
  """The coordinator's `Worker`s, in task order (`.worker_index`)."""
  return coordinator._cluster.workers


def closure_queue(coordinator):
  return coordinator._cluster.closure_queue


def wrap_closure_failure(worker, wrapper):
  """Calls `wrapper(closure, error, original)` where TF calls the worker's
  failure handler: a learner died mid-closure and TF puts it back."""
  original = worker._on_closure_failure

  def on_closure_failure(closure, error):
    return wrapper(closure, error, original)
  worker._on_closure_failure = on_closure_failure


def wrap_closure_queue(queue, *, put=None, put_back=None, mark_failed=None):
  """Replaces the queue's methods by `wrapper(original, *args)` for each
  wrapper given: `put(closure, tag)` (a scheduled closure is queued),
  `put_back(closure)` (a closure is queued again for a re-run) and
  `mark_failed(error)` (a closure failed for good)."""
  for name, wrapper in (("put", put), ("put_back", put_back),
                        ("mark_failed", mark_failed)):
    if wrapper is not None:
      setattr(queue, name, _calling(wrapper, getattr(queue, name)))


def _calling(wrapper, original):
  def call(*args, **kwargs):
    return wrapper(original, *args, **kwargs)
  return call


def inflight_closures(queue):
  return queue._inflight_closure_count


def pending_error(queue):
  """The failure the chief has yet to raise (None once it has: the queue
  was drained and the in-flight closures had ended)."""
  return queue._error


def dispatching_worker_index():
  """The index of the worker a closure is being dispatched to, or None."""
  dispatch = coordinator_context.get_current_dispatch_context()
  return dispatch.worker_index if dispatch else None


# ClusterCoordinator runs each closure under its queue's CancellationManager,
# and TF 2.21 keeps the active one in a process-wide global that every
# tf.function call reads (`Context.call_function`): a chief-side call made
# by another thread while a closure runs goes under that closure's manager,
# and once a failed fit cancels, it is "cancelled before it was started"
# (a hardsync fit's barrier opener was, and the fit hung).
_outside_cancellation = threading.local()
_cancellation_hook_lock = threading.Lock()
_closure_cancellation_context = None  # TF's reader, once the hook is in


def _install_cancellation_hook():
  global _closure_cancellation_context
  with _cancellation_hook_lock:
    if _closure_cancellation_context is not None:
      return
    _closure_cancellation_context = cancellation.context

    def context_unless_outside():
      if getattr(_outside_cancellation, "depth", 0):
        return None
      return _closure_cancellation_context()
    cancellation.context = context_unless_outside


@contextlib.contextmanager
def outside_closure_cancellation():
  """tf.function calls this thread makes inside run under no closure's
  cancellation (the chief's own control calls to the ps)."""
  _install_cancellation_hook()
  _outside_cancellation.depth = getattr(_outside_cancellation, "depth", 0) + 1
  try:
    yield
  finally:
    _outside_cancellation.depth -= 1


# ------------------------------------------------------------------ graphs
AutoTrackable = tf.__internal__.tracking.AutoTrackable


def enclosing_graph_names():
  """Names of the graph being traced and of each graph around it."""
  graph = ops.get_default_graph()
  while graph is not None:
    yield getattr(graph, "name", None) or ""
    graph = getattr(graph, "outer_graph", None)


def inside_while_loop():
  """True while tracing the body of a tf.while_loop (a multi-step loop)."""
  return any(name.startswith("while_body")
             for name in enclosing_graph_names())


# Autograph stages one trial iteration of a loop whose variables are not
# defined before it (tf_keras's multi-step train function: `outputs`) in a
# throw-away graph of this name, before the real loop; a strategy.run traced
# there never runs.
AUTOGRAPH_TRIAL_GRAPH = "tmp"


def inside_autograph_trial():
  """True while autograph stages its trial loop iteration (see above)."""
  return AUTOGRAPH_TRIAL_GRAPH in enclosing_graph_names()


def capture_at_dispatch(value_fn, spec):
  """A tensor whose value `value_fn()` gives each time the traced function
  is called (dispatched), not when it is traced."""
  return ops.get_default_graph().capture_call_time_value(value_fn, spec)


def chief_cpu_device():
  """This process's (the chief's) CPU, as a device name."""
  return context.context().host_address_space() + "/device:CPU:0"


def colocated_with_nothing():
  """A scope where ops are placed by device scopes alone, not next to the
  variables they read."""
  return ops.colocate_with(None, ignore_existing=True)


def autograph_converted(fn):
  """`fn` converted by autograph as the current context converts code."""
  return autograph.tf_convert(fn, ag_ctx.control_status_ctx())


# ----------------------------------------------------------------- tf_keras
# Enough frames to reach a tf_keras Model method from a variable creator.
_FRAMES_TO_SEARCH = 16


def created_by_model_method(method_names):
  """True while one of tf_keras's methods `method_names` runs (searched
  up the Python stack from the caller)."""
  frame = sys._getframe(1)
  for _ in range(_FRAMES_TO_SEARCH):
    if frame is None:
      return False
    if (frame.f_code.co_name in method_names and
        frame.f_globals.get("__name__", "").startswith("tf_keras.")):
      return True
    frame = frame.f_back
  return False


def is_step_of(fn, builder_names):
  """True for a step function that one of the Model methods
  `builder_names` defined (by its qualified name)."""
  qualname = getattr(fn, "__qualname__", "")
  return any(f"{name}.<locals>" in qualname for name in builder_names)


def filter_empty_gradients(grads_and_vars):
  from tf_keras.src.optimizers import utils  # pylint: disable=g-import-not-at-top
  return utils.filter_empty_gradients(grads_and_vars)


def optimizer_hooks(optimizer):
  """The private update path of a tf_keras optimizer, new or legacy
  (`KerasOptimizerHooks`, `LegacyOptimizerHooks`), or of a Keras 3 one
  (`Keras3OptimizerHooks`); None for anything else."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  if isinstance(optimizer, tf_keras.optimizers.Optimizer):
    return KerasOptimizerHooks(optimizer)
  if isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer):
    return LegacyOptimizerHooks(optimizer)
  if is_keras3_optimizer(optimizer):
    return Keras3OptimizerHooks(optimizer)
  return None


def _keras3():
  """Keras 3 if this process imported it (a Keras 3 object can only come
  from there; rudra_tf does not import it for tf_keras users)."""
  return sys.modules.get("keras")


def is_keras3_optimizer(optimizer):
  keras = _keras3()
  return (keras is not None and hasattr(keras, "optimizers") and
          isinstance(optimizer, keras.optimizers.Optimizer))


def is_keras3_variable(variable):
  keras = _keras3()
  return (keras is not None and hasattr(keras, "Variable") and
          isinstance(variable, keras.Variable))


def keras3_optimizer_built_on(optimizer):
  """The variables a Keras 3 optimizer was built on, as it was given them."""
  return list(getattr(optimizer, "_trainable_variables", None) or ())


def unwrap_keras3_variable(variable):
  """The tf.Variable (the strategy's) inside a Keras 3 Variable; any other
  variable as it is."""
  return variable.value if is_keras3_variable(variable) else variable


# Keras 3's TensorFlow trainer (keras/src/backend/tensorflow/trainer.py),
# whose fit, evaluate and predict RudraStrategy models take from
# rudra_tf/keras3_training.py; pinned to keras 3.15.*.
_KERAS3_TRAINER = "keras.src.backend.tensorflow.trainer"
_KERAS3_ROUTED = ("fit", "evaluate", "predict")


def install_keras3_training(applies, **replacements):
  """Routes Keras 3's `TensorFlowTrainer` methods (fit, evaluate,
  predict) to `replacements[name](model, ...)` for a model where
  `applies(model)`; any other model keeps Keras 3's own. Idempotent."""
  trainer = importlib.import_module(_KERAS3_TRAINER).TensorFlowTrainer
  for name in _KERAS3_ROUTED:
    original = getattr(trainer, name)
    original = getattr(original, "_rudra_original", original)

    def routed(model, *args, _original=original,
               _replacement=replacements[name], **kwargs):
      if applies(model):
        return _replacement(model, *args, **kwargs)
      return _original(model, *args, **kwargs)
    routed._rudra_original = original  # pylint: disable=protected-access
    functools.update_wrapper(routed, original)
    setattr(trainer, name, routed)


def install_compile_check(check):
  """Runs `check(model, optimizer)` before each compile, in tf_keras and
  Keras 3 (`Model.compile`, `Trainer.compile`). Idempotent."""
  for module, owner in (("tf_keras.src.engine.training", "Model"),
                        ("keras.src.trainers.trainer", "Trainer")):
    cls = getattr(importlib.import_module(module), owner)
    original = cls.compile
    original = getattr(original, "_rudra_original", original)

    def checked(model, *args, _original=original, **kwargs):
      optimizer = kwargs.get("optimizer", args[0] if args else None)
      check(model, optimizer)
      return _original(model, *args, **kwargs)
    checked._rudra_original = original  # pylint: disable=protected-access
    functools.update_wrapper(checked, original)
    cls.compile = checked


def is_keras3_model(model):
  keras = _keras3()
  return (keras is not None and hasattr(keras, "Model") and
          isinstance(model, keras.Model))


def install_keras3_atomic_accumulation(applies):
  """Makes a Keras 3 Variable's assign_add / assign_sub one atomic update
  of its tf.Variable where `applies(tf_variable)`.

  Keras 3 writes them as `assign(self + value)`: a read, then a write. A
  metric's total on a ps task, updated by several learners at once, then
  loses the updates that land between another learner's read and write
  (measured: 320 of 480 rows counted with 3 learners). tf_keras's are
  the tf.Variable's own atomic ops. Idempotent."""
  core = importlib.import_module("keras.src.backend.tensorflow.core")
  stateless = importlib.import_module("keras.src.backend.common."
                                      "stateless_scope")
  for name, atomic_name in (("assign_add", "assign_add"),
                            ("assign_sub", "assign_sub")):
    original = getattr(core.Variable, name)
    original = getattr(original, "_rudra_original", original)

    def accumulate(variable, value, _original=original,
                   _atomic_name=atomic_name):
      tf_variable = variable._value
      if stateless.in_stateless_scope() or not applies(tf_variable):
        return _original(variable, value)
      return getattr(tf_variable, _atomic_name)(
          tf.cast(value, tf_variable.dtype))
    accumulate._rudra_original = original  # pylint: disable=protected-access
    functools.update_wrapper(accumulate, original)
    setattr(core.Variable, name, accumulate)


def keras3_routed_methods():
  """{name: (the method now, Keras 3's own)} of the routed trainer."""
  trainer = importlib.import_module(_KERAS3_TRAINER).TensorFlowTrainer
  return {name: (getattr(trainer, name),
                 getattr(getattr(trainer, name), "_rudra_original", None))
          for name in _KERAS3_ROUTED}


def keras3_assert_compiled(model, method_name):
  """Keras 3's own error for fit/evaluate before compile."""
  model._assert_compile_called(method_name)


def keras3_symbolic_build(model, data_spec):
  """Builds the model, its compiled loss and metrics and its optimizer
  from the spec of one batch (what Keras 3 does with its first batch)."""
  model._symbolic_build(data_batch=data_spec)


def keras3_metrics_in_order(model, logs):
  """evaluate's list result: the logs in the model's metrics order."""
  return model._flatten_metrics_in_order(logs)


def keras_callback_overrides(callback, hook):
  """Whether a callback (Keras 3 or tf_keras) implements `hook` itself:
  both mark the base class's empty hooks `_is_default`."""
  method = getattr(callback, hook, None)
  return method is not None and not getattr(method, "_is_default", False)


def accepts_remote_logs(callback):
  """tf_keras's mark on a callback whose batch hooks take remote values."""
  return bool(getattr(callback, "_supports_tf_logs", False))


def keras3_tensorboard_profiles(callback):
  """Whether a Keras 3 TensorBoard callback profiles a batch."""
  return callback._start_batch > 0


class _OptimizerHooks:
  """What every adapter shares: the optimizer, nothing it refuses, and the
  rate at a shard's step from `base_learning_rate` (a tf_keras schedule's
  value there)."""

  def __init__(self, optimizer):
    self._optimizer = optimizer

  def unsupported(self):
    """What the wrapper cannot apply on a shard, or None."""
    return None

  def learning_rate_at(self, step):
    """The (scheduled) learning rate at update `step`, a tensor."""
    import tf_keras  # pylint: disable=g-import-not-at-top
    rate = self.base_learning_rate()
    if isinstance(rate, tf_keras.optimizers.schedules.LearningRateSchedule):
      rate = rate(step)
    return tf.convert_to_tensor(rate)


class KerasOptimizerHooks(_OptimizerHooks):
  """tf_keras.optimizers.Optimizer (SGD, Adam, ...): what the wrapper uses
  to build it, clip, and apply one update on a shard."""

  is_legacy = False

  def build(self, var_list):
    self._optimizer.build(var_list)

  def variables(self):
    return list(self._optimizer.variables)

  def uses_ema(self):
    return bool(self._optimizer.use_ema)

  def clip(self, gradients, variables):
    """The optimizer's clipnorm / clipvalue / global_clipnorm."""
    del variables
    return self._optimizer._clip_gradients(gradients)

  def base_learning_rate(self):
    """A variable, or a LearningRateSchedule."""
    return self._optimizer._learning_rate

  def weight_decay(self, variable):
    """The decoupled weight decay for `variable`, or None."""
    optimizer = self._optimizer
    if optimizer.weight_decay and optimizer._use_weight_decay(variable):
      return optimizer.weight_decay
    return None

  def apply(self, grads_and_vars, learning_rate, step):
    """The update rule for each (gradient, variable) and its slots, as if
    the rate were `learning_rate` and the step counter `step`."""
    with _attributes_set_to(self._optimizer, _learning_rate=learning_rate,
                            _iterations=step):
      for gradient, variable in grads_and_vars:
        self._optimizer._update_step(gradient, variable)


class LegacyOptimizerHooks(_OptimizerHooks):
  """tf_keras.optimizers.legacy.* (OptimizerV2): the same surface as
  `KerasOptimizerHooks`, over its hyper-parameter dict, `_prepare` and
  `_resource_apply_*` (its `decay` then counts the shard's updates)."""

  is_legacy = True

  def build(self, var_list):
    self._optimizer._create_all_weights(var_list)

  def variables(self):
    return list(self._optimizer.variables())

  def uses_ema(self):
    return False

  def clip(self, gradients, variables):
    pairs = self._optimizer._transform_gradients(
        list(zip(gradients, variables)))
    return [gradient for gradient, _ in pairs]

  def base_learning_rate(self):
    import tf_keras  # pylint: disable=g-import-not-at-top
    rate = self._optimizer._hyper["learning_rate"]
    schedule = tf_keras.optimizers.schedules.LearningRateSchedule
    if callable(rate) and not isinstance(rate, (schedule, tf.Variable)):
      rate = rate()
    return rate

  def weight_decay(self, variable):
    del variable
    return None

  def apply(self, grads_and_vars, learning_rate, step):
    optimizer = self._optimizer
    hyper = dict(optimizer._hyper, learning_rate=learning_rate)
    with _attributes_set_to(optimizer, _hyper=hyper, _iterations=step):
      apply_state = optimizer._prepare([v for _, v in grads_and_vars])
      for gradient, variable in grads_and_vars:
        if isinstance(gradient, tf.IndexedSlices):
          optimizer._resource_apply_sparse_duplicate_indices(
              gradient.values, variable, gradient.indices,
              **self._apply_state_argument(optimizer._sparse_apply_args,
                                           apply_state))
        else:
          optimizer._resource_apply_dense(
              gradient, variable,
              **self._apply_state_argument(optimizer._dense_apply_args,
                                           apply_state))

  @staticmethod
  def _apply_state_argument(accepted, apply_state):
    return {"apply_state": apply_state} if "apply_state" in accepted else {}


class Keras3OptimizerHooks(KerasOptimizerHooks):
  """keras.optimizers.Optimizer (Keras 3, TensorFlow backend): the same
  surface as `KerasOptimizerHooks` (whose variables, use_ema, rate and
  weight decay attributes Keras 3 shares). Its update rule is
  `update_step` (TFOptimizer applies it through `extended.update`, as
  tf_keras does); its slots are keyed by the tf.Variable inside each Keras
  Variable (`TFOptimizer._var_key`), so a shard's update finds them from
  the strategy's variable. Pinned to keras 3.15.*."""

  def build(self, var_list):
    if not self._optimizer.built:
      self._optimizer.build(list(var_list))

  def unsupported(self):
    """What the wrapper cannot apply on a shard, or None."""
    if self._optimizer.gradient_accumulation_steps:
      return ("gradient_accumulation_steps (each learner step pushes one "
              "gradient; raise the minibatch or the protocol's c instead)")
    return None

  def clip(self, gradients, variables):
    del variables
    return self._optimizer._clip_gradients(list(gradients))

  def learning_rate_at(self, step):
    keras = _keras3()
    rate = self.base_learning_rate()
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
      return tf.convert_to_tensor(rate(step))
    if callable(rate) and not isinstance(rate, keras.Variable):
      return tf.convert_to_tensor(rate())
    return tf.convert_to_tensor(rate)

  def apply(self, grads_and_vars, learning_rate, step):
    with _attributes_set_to(self._optimizer, _iterations=step):
      for gradient, variable in grads_and_vars:
        self._optimizer.update_step(gradient, variable, learning_rate)


@contextlib.contextmanager
def _attributes_set_to(optimizer, **values):
  """While tracing: the optimizer's attributes `values`, with no Trackable
  bookkeeping (tf_keras tracks what is set through setattr)."""
  saved = {name: optimizer.__dict__[name] for name in values}
  try:
    for name, value in values.items():
      object.__setattr__(optimizer, name, value)
    yield
  finally:
    for name, value in saved.items():
      object.__setattr__(optimizer, name, value)


# The update functions tf_keras optimizers hand to `extended.update`, by
# qualified name: a plain optimizer's apply_gradients reaches the strategy
# only through them (RudraExtended._update), one variable at a time.
_UPDATE_FUNCTIONS = (
    "Optimizer._distributed_apply_gradients_fn.<locals>."
    "apply_grad_to_update_var",
    "OptimizerV2._distributed_apply.<locals>.apply_grad_to_update_var",
    # Keras 3 (keras/src/backend/tensorflow/optimizer.py).
    "TFOptimizer._distributed_tf_update_step.<locals>."
    "apply_grad_to_update_var",
)
_WEIGHT_DECAY_FUNCTIONS = (
    "Optimizer._apply_weight_decay.<locals>.distributed_apply_weight_decay."
    "<locals>.weight_decay_fn",
    "TFOptimizer._apply_weight_decay.<locals>."
    "distributed_apply_weight_decay.<locals>.weight_decay_fn",
)


def optimizer_of_update(update_fn):
  """For an update function a tf_keras optimizer passed to
  `extended.update`: (the optimizer, "gradient" or "weight_decay");
  (None, None) for any other function."""
  # `extended.update` hands `_update` the function autograph-wrapped.
  update_fn = inspect.unwrap(update_fn)
  qualname = getattr(update_fn, "__qualname__", "")
  kind = ("gradient" if qualname in _UPDATE_FUNCTIONS else
          "weight_decay" if qualname in _WEIGHT_DECAY_FUNCTIONS else None)
  if kind is None:
    return None, None
  cells = dict(zip(update_fn.__code__.co_freevars,
                   update_fn.__closure__ or ()))
  if "self" not in cells or optimizer_hooks(cells["self"].cell_contents) is None:
    return None, None
  return cells["self"].cell_contents, kind


def unwrap_autocast(variable):
  """The strategy's variable inside a mixed-precision AutoCastVariable."""
  from tf_keras.src.mixed_precision import autocast_variable  # pylint: disable=g-import-not-at-top
  if isinstance(variable, autocast_variable.AutoCastVariable):
    return variable._variable
  return variable


# ------------------------------------------------------ variables and data
CachingVariable = ps_values.CachingVariable


def wrapped_variable(caching_variable):
  """The resource variable a CachingVariable wraps."""
  return caching_variable._v


def record_variable_read(variable, value):
  """Records `value` on the gradient tape as a read of `variable`, exactly
  as TensorFlow records its own reads (ReadVariableOp, identity gradient)."""
  resource_variable_ops.variable_accessed(variable)
  record.record_operation("ReadVariableOp", [value], [variable.handle],
                          backward_function=lambda gradient: [gradient],
                          forward_function=lambda value: [value])


def sleep_transformation(microseconds):
  """A tf.data transformation that delays each element."""
  return tf_data_testing.sleep(microseconds)


def traced_dataset_function(per_worker_dataset):
  """The tf.function a PerWorkerDatasetFromFunction traced its dataset
  function into (set by its constructor)."""
  return per_worker_dataset._dataset_fn
