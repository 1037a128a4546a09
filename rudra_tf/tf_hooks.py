"""Every private TensorFlow and tf_keras hook rudra_tf uses, by name.

tensorflow and tf-keras are pinned to 2.21.* (setup.py) because rudra_tf
reaches past their public APIs here, and nowhere else: no other module
imports `tensorflow.python` or `tf_keras.src`, or touches a private
attribute of theirs. An upgrade is this one file to read, and
tests/test_tf_hooks.py, which pins each adapter against the installed
releases, fails first and names which.

ParameterServerStrategy
    `ParameterServerExtended` (the class RudraExtended extends, overriding
    `_create_var_creator`, `_create_variable`,
    `_distribute_datasets_from_function` and `_update`),
    `use_extended_class`, `distributed_datasets_from_function`,
    `being_scheduled`, `num_workers`, `ShardedVariable`.
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
    `clip_gradients`, `uses_weight_decay`, `update_step`,
    `base_learning_rate`, `learning_rate_and_step_set_to`,
    `strategy_of_optimizer`, `unwrap_autocast`.
Variables and data
    `CachingVariable`, `wrapped_variable`, `record_variable_read`,
    `sleep_transformation`.
"""

import contextlib
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


def clip_gradients(optimizer, gradients):
  """The optimizer's clipnorm / clipvalue / global_clipnorm."""
  return optimizer._clip_gradients(gradients)


def uses_weight_decay(optimizer, variable):
  return optimizer._use_weight_decay(variable)


def update_step(optimizer, gradient, variable):
  """The optimizer's update rule for one variable (and its slots)."""
  optimizer._update_step(gradient, variable)


def base_learning_rate(optimizer):
  """The optimizer's rate: a variable, or a LearningRateSchedule."""
  return optimizer._learning_rate


@contextlib.contextmanager
def learning_rate_and_step_set_to(optimizer, learning_rate, step):
  """While tracing: the optimizer's update rule sees `learning_rate` and
  the step `step` (Adam's bias correction), with no Trackable bookkeeping."""
  values = {"_learning_rate": learning_rate, "_iterations": step}
  saved = {name: optimizer.__dict__[name] for name in values}
  try:
    for name, value in values.items():
      object.__setattr__(optimizer, name, value)
    yield
  finally:
    for name, value in saved.items():
      object.__setattr__(optimizer, name, value)


def strategy_of_optimizer(optimizer):
  """The strategy whose scope the optimizer was created in."""
  return getattr(optimizer, "_distribution_strategy", None)


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
