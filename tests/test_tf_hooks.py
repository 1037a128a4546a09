"""The private TensorFlow / tf_keras hooks rudra_tf relies on.

Every one is reached through an adapter of rudra_tf/tf_hooks.py, and no
other module reaches past TensorFlow's or tf_keras's public API (tested
below). tensorflow and tf-keras are pinned to 2.21.*; if an upgrade moves
one of these, this file fails first and names which: the adapters are run
on real objects, and the TensorFlow code they rely on is pinned by source.
"""

import inspect
import os
import subprocess
import sys

import numpy as np
import pytest

import tensorflow as tf
import tf_keras
from tensorflow.python.distribute import parameter_server_strategy_v2 as pss
from tensorflow.python.distribute import ps_values
from tensorflow.python.ops import critical_section_ops

from launch import tf_environment
from rudra_tf import strategy as strategy_lib
from rudra_tf import tf_hooks

_PACKAGE = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "rudra_tf")
# What only tf_hooks.py may write in rudra_tf/.
_REACHING_PAST_THE_PUBLIC_API = ("tensorflow.python", "keras.src",
                                 "tf.__internal__", "sys._getframe",
                                 "._extended", "._cluster")


def test_only_tf_hooks_reaches_past_the_public_apis():
  offenders = []
  for name in sorted(os.listdir(_PACKAGE)):
    if not name.endswith(".py") or name == "tf_hooks.py":
      continue
    with open(os.path.join(_PACKAGE, name), encoding="utf-8") as source:
      for number, line in enumerate(source, 1):
        offenders += [f"{name}:{number}: {marker}"
                      for marker in _REACHING_PAST_THE_PUBLIC_API
                      if marker in line]
  assert not offenders, offenders


def test_versions_are_the_pinned_ones():
  assert tf.__version__.startswith("2.21."), tf.__version__
  assert tf_keras.__version__.startswith("2.21."), tf_keras.__version__


def test_parameter_server_strategy_hooks():
  extended = pss.ParameterServerStrategyV2Extended
  # Every ps variable goes through _create_var_creator and is wrapped in a
  # CachingVariable, which RudraVariable subclasses.
  assert "CachingVariable" in inspect.getsource(extended._create_var_creator)
  assert "_create_var_creator" in inspect.getsource(extended._create_variable)
  for name in ("value", "read_value", "_dense_var_to_tensor", "get"):
    assert hasattr(ps_values.CachingVariable, name), name
  assert hasattr(extended, "_update")
  # RudraStrategy swaps in RudraExtended after PSS's constructor ran.
  assert issubclass(strategy_lib.RudraExtended, extended)
  assert "ParameterServerStrategyV2Extended(" in inspect.getsource(
      pss.ParameterServerStrategyV2.__init__)


def test_the_strategy_holds_its_one_coordinator():
  # tf_hooks.coordinator_of: ClusterCoordinator is one per strategy, kept on
  # the strategy (RudraStrategy asks it whether anything runs).
  from tensorflow.python.distribute.coordinator import cluster_coordinator  # pylint: disable=g-import-not-at-top
  source = inspect.getsource(cluster_coordinator.ClusterCoordinator.__new__)
  assert "strategy._cluster_coordinator = " in source
  assert tf_hooks.coordinator_of(tf.distribute.get_strategy()) is None


def test_critical_section_releases_after_returned_values_only():
  # The reason for shard_state._after_all_ops: the lock's release waits for
  # the returned tensors, not for every op the function created.
  source = inspect.getsource(critical_section_ops.CriticalSection.execute)
  assert "control_dependencies(r_flat)" in source


def test_tf_keras_optimizer_hooks():
  sgd = tf_keras.optimizers.SGD(0.1)
  for name in ("_learning_rate", "_iterations"):
    assert name in sgd.__dict__, name
  for name in ("_update_step", "_clip_gradients", "_use_weight_decay",
               "_var_key"):
    assert callable(getattr(sgd, name)), name
  legacy = tf_keras.optimizers.legacy.SGD(0.1)
  for name in ("_hyper", "_iterations"):
    assert name in legacy.__dict__, name
  for name in ("_create_all_weights", "_transform_gradients", "_prepare",
               "_resource_apply_dense",
               "_resource_apply_sparse_duplicate_indices"):
    assert callable(getattr(legacy, name)), name
  learning_rate_source = inspect.getsource(
      tf_keras.optimizers.Optimizer.learning_rate.fget)
  assert "self._learning_rate" in learning_rate_source
  assert "self.iterations" in inspect.getsource(tf_keras.optimizers.Adam
                                                .update_step)


def test_tf_keras_step_builders_are_recognized():
  model_class = tf_keras.Model
  for builder in ("make_test_function", "_make_test_function_exact",
                  "make_predict_function"):
    source = inspect.getsource(getattr(model_class, builder))
    assert "def run_step" in source and "strategy.run(run_step" in source, (
        builder)

  class FakeQualname:
    __qualname__ = "Model.make_test_function.<locals>.step_function.<locals>.run_step"

  assert strategy_lib._is_inference_step(FakeQualname)
  FakeQualname.__qualname__ = ("Model.make_train_function.<locals>."
                               "step_function.<locals>.run_step")
  assert not strategy_lib._is_inference_step(FakeQualname)
  assert "self.distribute_strategy._should_use_with_coordinator" in (
      inspect.getsource(model_class.fit))


def test_tf_keras_steps_per_execution_counter_hooks():
  # RudraStrategy places the counter made in this method on the chief: only
  # the chief reads it, before every scheduled closure.
  assert strategy_lib._CHIEF_COUNTER_BUILDERS == (
      "_configure_steps_per_execution",)
  builder = inspect.getsource(tf_keras.Model._configure_steps_per_execution)
  assert "self._steps_per_execution = self._create_counter_variable" in builder
  assert "tf.Variable(" in inspect.getsource(
      tf_keras.Model._create_counter_variable)
  from tf_keras.src.engine import data_adapter  # pylint: disable=g-import-not-at-top
  steps = inspect.getsource(data_adapter.DataHandler.steps)
  assert "self._steps_per_execution.numpy()" in steps
  # The scheduled multi-step function gets the value as an argument: no
  # learner reads the chief's variable.
  train_builder = inspect.getsource(tf_keras.Model.make_train_function)
  assert "args=(it, self._steps_per_execution.value())" in train_builder
  assert tf_keras.Model._configure_steps_per_execution.__module__.startswith(
      "tf_keras.")


def test_coordinator_hooks_for_per_learner_datasets():
  from tensorflow.python.distribute import input_util  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute.coordinator import cluster_coordinator  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute.coordinator import values  # pylint: disable=g-import-not-at-top
  from tf_keras.src.engine import data_adapter  # pylint: disable=g-import-not-at-top
  coordinator = cluster_coordinator.ClusterCoordinator
  # One coordinator per strategy: tf_keras's ClusterCoordinator(strategy)
  # returns the RudraCoordinator that RudraStrategy created first.
  assert "strategy._cluster_coordinator is None" in inspect.getsource(
      coordinator.__new__)
  assert "create_per_worker_dataset(" in inspect.getsource(
      data_adapter._ClusterCoordinatorDataHandler)
  per_worker = values.PerWorkerDatasetFromDatasetFunction
  init_source = inspect.getsource(per_worker.__init__)
  assert "get_concrete_function()" in init_source
  assert "self._dataset_fn = dataset_fn" in init_source
  assert hasattr(values, "PerWorkerDistributedIterator")
  assert "def create_resource(self, function" in inspect.getsource(
      cluster_coordinator.Worker)
  assert list(inspect.signature(
      input_util.get_distributed_datasets_from_function).parameters)[:4] == [
          "dataset_fn", "input_workers", "input_contexts", "strategy"]


def test_sleep_dataset_hook_delays_each_element():
  # datasets.with_step_time emulates compute with TensorFlow's SleepDataset,
  # whose Python wrapper is private. A sleep only lengthens a run: the lower
  # bound below is deterministic.
  import time  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from rudra_tf import datasets  # pylint: disable=g-import-not-at-top
  delayed = datasets.with_step_time(tf.data.Dataset.range(4).prefetch(2),
                                    0.05)
  from tensorflow.python.data.experimental.ops import testing  # pylint: disable=g-import-not-at-top
  assert list(inspect.signature(testing.sleep).parameters) == [
      "sleep_microseconds"]
  start = time.monotonic()
  assert list(delayed.as_numpy_iterator()) == [0, 1, 2, 3]
  assert time.monotonic() - start >= 4 * 0.05
  undelayed = tf.data.Dataset.range(2)
  assert datasets.with_step_time(undelayed, 0) is undelayed
  with pytest.raises(ValueError, match="must be >= 0 seconds, got -1"):
    datasets.with_step_time(undelayed, -1)


def test_tape_records_a_pulled_read_as_a_variable_read():
  # variables.RudraVariable records the pulled value as a ReadVariableOp of
  # the variable (TensorFlow's own private helpers), so that gradients reach
  # the variable without a second, live read.
  from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-import-not-at-top
  assert "record.record_operation(" in inspect.getsource(
      resource_variable_ops.BaseResourceVariable._read_variable_op)
  variable = tf.Variable([1.0, 2.0])
  snapshot = tf.constant([3.0, 5.0])

  @tf.function
  def gradient():
    with tf.GradientTape() as tape:
      value = tf.identity(snapshot)
      tf_hooks.record_variable_read(variable, value)
      loss = tf.reduce_sum(value * value)
    return tape.gradient(loss, variable)

  # d/dv Σ v² at the pulled value [3, 5], not at the live [1, 2].
  assert gradient().numpy().tolist() == [6.0, 10.0]


def test_lookups_reach_a_variables_sparse_read_colocated_with_it():
  # RudraVariable.sparse_read serves embedding lookups from the pull; it is
  # reached because tf.gather (and so tf.nn.embedding_lookup) calls a
  # variable's sparse_read, and it clears the colocation with the variable
  # that embedding_lookup sets (else a pulled lookup would run on the ps).
  calls = []

  class Recording(ps_values.CachingVariable):

    def sparse_read(self, indices, name=None):
      from tensorflow.python.framework import ops  # pylint: disable=g-import-not-at-top
      calls.append(ops.get_default_graph()._colocation_stack.peek_objs())  # pylint: disable=protected-access
      return super().sparse_read(indices, name=name)

  variable = Recording(tf.Variable([[1.0], [2.0], [3.0]]))

  @tf.function
  def lookup(ids):
    return tf.nn.embedding_lookup(variable, ids)

  assert lookup(tf.constant([2, 0])).numpy().tolist() == [[3.0], [1.0]]
  assert len(calls) == 1 and calls[0], calls  # colocated with the variable
  # A row gradient through the tape is IndexedSlices (what the push sends).
  with tf.GradientTape() as tape:
    rows = tf.nn.embedding_lookup(variable.get(), tf.constant([2, 2]))
  assert isinstance(tape.gradient(rows, variable.get()), tf.IndexedSlices)


def test_coordinator_hooks_behind_push_keys():
  # RudraCoordinator traces a keyed wrapper the way Closure does, and reads
  # tf_keras's multi-step step count from this argument name.
  from tensorflow.python.distribute.coordinator import cluster_coordinator
  from tf_keras.src.engine import training
  for name in ("_maybe_as_type_spec", "_select_worker_slice"):
    assert hasattr(cluster_coordinator, name), name
  assert "_being_scheduled" in inspect.getsource(
      cluster_coordinator.ClusterCoordinator.schedule)
  source = inspect.getsource(training.Model.make_train_function)
  assert "def train_function(iterator, steps_per_execution)" in source
  assert "args=(it, self._steps_per_execution.value())" in source
  # A re-run closure is put back on the queue, same object, same arguments.
  assert "put_back(closure)" in inspect.getsource(
      cluster_coordinator.Worker._on_closure_failure)


def test_worker_failure_hook_behind_hardsync_token_release():
  # RudraCoordinator wraps Worker._on_closure_failure(closure, error), which
  # TF calls from _process_closure's failure handler before re-running it.
  from tensorflow.python.distribute.coordinator import cluster_coordinator
  worker = cluster_coordinator.Worker
  assert list(inspect.signature(worker._on_closure_failure).parameters) == [
      "self", "closure", "e"]
  assert "self._on_closure_failure(closure, e)" in inspect.getsource(
      worker._process_closure)
  assert "self.workers" in inspect.getsource(cluster_coordinator.Cluster)


def test_autocast_variable_hook_behind_mixed_bfloat16():
  # A mixed-precision layer's weights are AutoCastVariables around the
  # strategy's variables; a push unwraps them through `_variable`.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_keras.src.mixed_precision import autocast_variable  # pylint: disable=g-import-not-at-top
  inner = tf.Variable([1.0, 2.0])
  wrapped = autocast_variable.create_autocast_variable(inner)
  assert isinstance(wrapped, autocast_variable.AutoCastVariable)
  assert wrapped._variable is inner  # pylint: disable=protected-access


def test_closure_queue_hook_behind_the_exhausted_input_error():
  # RudraCoordinator wraps the closure queue's mark_failed(e): a failed
  # closure's error reaches it from _process_closure, and the first one
  # recorded is the error the chief raises.
  from tensorflow.python.distribute.coordinator import cluster_coordinator
  queue = cluster_coordinator._CoordinatedClosureQueue  # pylint: disable=protected-access
  assert list(inspect.signature(queue.mark_failed).parameters) == ["self", "e"]
  assert "if self._error is None:" in inspect.getsource(queue.mark_failed)
  assert "raise self._error" in inspect.getsource(queue._raise_if_error)  # pylint: disable=protected-access
  assert "self._cluster.closure_queue.mark_failed(e)" in inspect.getsource(
      cluster_coordinator.Worker._process_closure)
  assert "self.closure_queue = " in inspect.getsource(
      cluster_coordinator.Cluster.__init__)
  # A failed fit's cancellation waits for the inflight closures, counted in
  # _inflight_closure_count (read by the hardsync barrier opener).
  cancel = inspect.getsource(queue._cancel_all_closures)  # pylint: disable=protected-access
  assert "while self._inflight_closure_count > 0:" in cancel
  assert "self._error = None" in inspect.getsource(queue._raise_if_error)  # pylint: disable=protected-access


def test_call_time_captures_behind_learner_identity():
  # A step knows its learner and (hardsync) that learner's incarnation
  # through call-time captures, evaluated by the coordinator at dispatch.
  from tensorflow.python.distribute.coordinator import coordinator_context
  from tensorflow.python.framework import func_graph
  assert hasattr(func_graph.FuncGraph, "capture_call_time_value")
  assert hasattr(coordinator_context, "get_current_dispatch_context")
  assert "capture_call_time_value" in inspect.getsource(
      coordinator_context.get_current_worker_index)


_ALLOCATOR_PROBE = """
import sys
if sys.argv[1] == "launch":
  import launch.train  # applies launch.tf_environment's defaults
import tensorflow as tf
x = tf.random.normal([256, 256])
_ = (x @ x).numpy()
try:
  print("bfc", tf.config.experimental.get_memory_info("CPU:0")["peak"] > 0)
except ValueError:
  print("malloc")
"""


@pytest.mark.parametrize("how, setting, expected", [
    ("launch", None, "bfc True"),      # launch.train's default
    ("launch", "false", "malloc"),     # a user's opt-out is kept
    ("plain", None, "malloc"),         # TensorFlow's own default
    ("plain", "true", "bfc True"),     # the variable TensorFlow reads
])
def test_launch_selects_tensorflows_bfc_cpu_allocator(how, setting, expected):
  # launch.train sets TF_CPU_ALLOCATOR_USE_BFC (read by TensorFlow's C++
  # ProcessState); only a BFC allocator has memory stats on CPU, so this
  # fails if an upgrade renames the variable or changes its meaning.
  variable = tf_environment.CPU_ALLOCATOR_VARIABLE
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  environment = {k: v for k, v in os.environ.items() if k != variable}
  if setting is not None:
    environment[variable] = setting
  environment["TF_CPP_MIN_LOG_LEVEL"] = "3"
  # With oneDNN's CPU ops (on by default on some x86 CPUs, e.g. AMD EPYC
  # with AVX-512), the CPU device reports memory stats whatever the
  # allocator: the probe reads the allocator's own stats only without them.
  environment["TF_ENABLE_ONEDNN_OPTS"] = "0"
  out = subprocess.run([sys.executable, "-c", _ALLOCATOR_PROBE, how],
                       cwd=repo, env=environment, text=True,
                       capture_output=True, timeout=120, check=True)
  assert out.stdout.strip().splitlines()[-1] == expected, out.stderr[-2000:]


_INTRA_OP_PROBE = """
import os, time
import portpicker
import tensorflow as tf
ports = [portpicker.pick_unused_port() for _ in range(2)]
spec = tf.train.ClusterSpec({"worker": [f"127.0.0.1:{ports[0]}"],
                             "chief": [f"127.0.0.1:{ports[1]}"]})
server = tf.distribute.Server(spec, job_name="worker", task_index=0)
tf.config.experimental_connect_to_cluster(spec, job_name="chief")

@tf.function
def products(x):
  for _ in range(10):
    x = tf.matmul(x, x) / 1200.0
  return tf.reduce_sum(x)

with tf.device("/job:worker/replica:0/task:0/device:CPU:0"):
  x = tf.random.normal([1200, 1200])
  products(x).numpy()
  wall, cpu = time.monotonic(), time.process_time()
  for _ in range(3):
    products(x).numpy()
print("cores", (time.process_time() - cpu) / (time.monotonic() - wall))
"""


def test_intra_op_threads_variable_reaches_a_servers_devices():
  # launch.local_cluster gives each learner a share of the cores through
  # TF_NUM_INTRAOP_THREADS; a learner's steps run on its tf.distribute.Server's
  # device, whose intra-op pool must follow it: with one thread, big matmuls
  # there cannot use more than one core (TensorFlow's default uses them all).
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=repo)
  environment[tf_environment.INTRA_OP_THREADS_VARIABLE] = "1"
  result = subprocess.run([sys.executable, "-c", _INTRA_OP_PROBE],
                          capture_output=True, text=True, timeout=300,
                          env=environment, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  cores = float(result.stdout.split()[-1])
  assert cores < 1.2, cores


def test_closure_queue_hooks_behind_push_key_pins():
  # RudraCoordinator wraps the closure queue's put(closure, tag=None), where
  # Cluster.schedule queues each closure, and put_back(closure), through
  # which both re-run paths go (a learner's death, a transient error).
  from tensorflow.python.distribute.coordinator import cluster_coordinator
  queue_class = cluster_coordinator._CoordinatedClosureQueue  # pylint: disable=protected-access
  assert list(inspect.signature(queue_class.put).parameters) == [
      "self", "closure", "tag"]
  assert list(inspect.signature(queue_class.put_back).parameters) == [
      "self", "closure"]
  assert "self.closure_queue.put(closure)" in inspect.getsource(
      cluster_coordinator.Cluster.schedule)
  process = inspect.getsource(cluster_coordinator.Worker._process_closure)
  assert "lambda: self._cluster.closure_queue.put_back(closure)" in process
  # Why the pins exist: a put-back closure runs AFTER every closure queued
  # before it, however many (a FIFO queue, not the front).
  queue = queue_class()
  first, second, third = (cluster_coordinator.Closure(
      lambda: None, queue._cancellation_mgr) for _ in range(3))  # pylint: disable=protected-access
  queue.put(first)
  queue.put(second)
  assert queue.get() is first
  queue.put(third)
  queue.put_back(first)
  assert [queue.get(), queue.get(), queue.get()] == [second, third, first]
  queue.stop()


def test_autograph_trial_iteration_graph_behind_push_limits():
  # tf_hooks.inside_autograph_trial: autograph stages a trial iteration of
  # a loop with variables undefined before it in FuncGraph("tmp").
  from tensorflow.python.autograph.operators import control_flow
  source = inspect.getsource(control_flow._try_handling_undefineds)  # pylint: disable=protected-access
  assert f"FuncGraph('{tf_hooks.AUTOGRAPH_TRIAL_GRAPH}')" in source


# ------------------------------------------------ the adapters themselves
def test_optimizer_adapters_on_a_real_sgd():
  sgd = tf_keras.optimizers.SGD(0.1, clipnorm=1.0)
  hooks = tf_hooks.optimizer_hooks(sgd)
  assert not hooks.is_legacy
  variable = tf.Variable([1.0, 1.0])
  hooks.build([variable])
  assert float(hooks.base_learning_rate()) == pytest.approx(0.1)
  # clipnorm 1: [3, 4] (norm 5) becomes [0.6, 0.8].
  clipped, = hooks.clip([tf.constant([3.0, 4.0])], [variable])
  assert clipped.numpy() == pytest.approx([0.6, 0.8])
  hooks.apply([(tf.constant([1.0, 2.0]), variable)], tf.constant(0.5),
              tf.constant(7, tf.int64))
  assert variable.numpy() == pytest.approx([0.5, 0.0])  # 1 - 0.5·[1, 2]
  assert float(sgd.learning_rate) == pytest.approx(0.1)
  assert int(sgd.iterations) == 0  # the swap leaves the real counter alone
  assert len(hooks.variables()) == len(sgd.variables)
  kept = tf_hooks.filter_empty_gradients([(None, variable),
                                          (tf.constant([1.0, 1.0]), variable)])
  assert len(kept) == 1
  adamw = tf_keras.optimizers.AdamW(0.1, weight_decay=0.1)
  adamw.exclude_from_weight_decay(var_names=["no_decay"])
  adamw.build([variable])
  adamw_hooks = tf_hooks.optimizer_hooks(adamw)
  assert adamw_hooks.weight_decay(variable) == pytest.approx(0.1)
  assert adamw_hooks.weight_decay(tf.Variable(1.0, name="no_decay")) is None
  assert tf_hooks.optimizer_hooks("sgd") is None


def test_legacy_optimizer_adapters_on_a_real_legacy_sgd():
  # Legacy SGD, momentum 0.5, decay 0.1, clipvalue 1. One update at
  # step 3 with rate 0.2: the decayed rate is 0.2 / (1 + 0.1·3) = 0.2/1.3;
  # the gradient [3, -0.5] is clipped to [1, -0.5]; momentum starts at 0:
  # m = -lr·g, w = 1 + m = [1 - 0.2/1.3, 1 + 0.1/1.3].
  sgd = tf_keras.optimizers.legacy.SGD(0.1, momentum=0.5, decay=0.1,
                                       clipvalue=1.0)
  hooks = tf_hooks.optimizer_hooks(sgd)
  assert hooks.is_legacy and hooks.weight_decay(None) is None
  variable = tf.Variable([1.0, 1.0])
  hooks.build([variable])
  assert float(hooks.base_learning_rate()) == pytest.approx(0.1)
  clipped, = hooks.clip([tf.constant([3.0, -0.5])], [variable])
  assert clipped.numpy() == pytest.approx([1.0, -0.5])
  hooks.apply([(clipped, variable)], tf.constant(0.2),
              tf.constant(3, tf.int64))
  lr = 0.2 / 1.3
  assert variable.numpy() == pytest.approx([1 - lr, 1 + 0.5 * lr])
  assert float(sgd.learning_rate) == pytest.approx(0.1)  # swapped back
  assert int(sgd.iterations) == 0
  # Its slots (momentum) and its counter and hyper-parameters.
  assert len(hooks.variables()) == len(sgd.variables()) >= 2
  # A rate given as a function is read when asked for.
  callable_rate = tf_keras.optimizers.legacy.SGD(lambda: 0.25)
  assert float(tf_hooks.optimizer_hooks(callable_rate)
               .base_learning_rate()) == 0.25
  source = inspect.getsource(tf_keras.optimizers.legacy.Optimizer._decayed_lr)
  assert "self.iterations" in source and '_get_hyper("learning_rate"' in source


def _update_functions_seen(monkeypatch, apply):
  """What `apply()` hands RudraExtended._update, as optimizer_of_update
  reads it."""
  seen = []
  extended = tf.distribute.get_strategy().extended
  original = extended._update

  def recording_update(var, fn, args, kwargs, group):
    seen.append(tf_hooks.optimizer_of_update(fn))
    return original(var, fn, args, kwargs, group)

  monkeypatch.setattr(extended, "_update", recording_update)
  apply()
  return seen


def test_the_update_functions_of_tf_keras_optimizers_are_recognized(
    monkeypatch):
  # What a plain optimizer hands RudraExtended._update, for each kind.
  variable = tf.Variable([1.0])
  new = tf_keras.optimizers.SGD(0.1, weight_decay=0.01)
  legacy = tf_keras.optimizers.legacy.SGD(0.1)

  def apply():
    new.apply_gradients([(tf.constant([1.0]), variable)])
    legacy.apply_gradients([(tf.constant([1.0]), variable)])

  seen = _update_functions_seen(monkeypatch, apply)
  assert (new, "weight_decay") in seen and (new, "gradient") in seen
  assert (legacy, "gradient") in seen
  assert tf_hooks.optimizer_of_update(lambda v, g: None) == (None, None)


def test_the_update_functions_of_keras3_optimizers_are_recognized(
    monkeypatch):
  import keras  # pylint: disable=g-import-not-at-top
  variable = keras.Variable([1.0])
  adamw = keras.optimizers.AdamW(0.1, weight_decay=0.01)
  seen = _update_functions_seen(
      monkeypatch,
      lambda: adamw.apply_gradients([(tf.constant([1.0]), variable)]))
  assert (adamw, "weight_decay") in seen and (adamw, "gradient") in seen


def test_keras3_is_the_pinned_release():
  import keras  # pylint: disable=g-import-not-at-top
  assert keras.__version__.startswith("3.15."), keras.__version__


def test_keras3_optimizer_adapters_on_a_real_sgd():
  # Keras 3 SGD, momentum 0.5, clipnorm 1. One update at step 3 with rate
  # 0.2 on a Keras 3 Variable's tf.Variable (as a shard applies it): the
  # gradient [3, 4] is clipped to [0.6, 0.8]; momentum starts at 0:
  # m = -0.2·g, w = 1 + m = [0.88, 0.84].
  import keras  # pylint: disable=g-import-not-at-top
  sgd = keras.optimizers.SGD(0.1, momentum=0.5, clipnorm=1.0)
  hooks = tf_hooks.optimizer_hooks(sgd)
  assert not hooks.is_legacy and hooks.unsupported() is None
  variable = keras.Variable([1.0, 1.0])
  hooks.build([variable])
  assert float(hooks.learning_rate_at(tf.constant(3, tf.int64))) == (
      pytest.approx(0.1))
  clipped, = hooks.clip([tf.constant([3.0, 4.0])], [variable])
  assert clipped.numpy() == pytest.approx([0.6, 0.8])
  strategy_variable = tf_hooks.unwrap_keras3_variable(variable)
  assert isinstance(strategy_variable, tf.Variable)
  hooks.apply([(clipped, strategy_variable)], tf.constant(0.2),
              tf.constant(3, tf.int64))
  assert variable.numpy() == pytest.approx([0.88, 0.84])
  assert int(sgd.iterations) == 0  # the swap leaves the real counter alone
  assert len(hooks.variables()) == len(sgd.variables)
  # A schedule at the shard's step; AdamW's decoupled decay per variable.
  scheduled = keras.optimizers.SGD(
      keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5))
  assert float(tf_hooks.optimizer_hooks(scheduled).learning_rate_at(
      tf.constant(4, tf.int64))) == pytest.approx(0.025)
  adamw = keras.optimizers.AdamW(0.1, weight_decay=0.1)
  adamw.build([variable])
  assert tf_hooks.optimizer_hooks(adamw).weight_decay(variable) == (
      pytest.approx(0.1))
  accumulating = keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)
  assert "gradient_accumulation_steps" in (
      tf_hooks.optimizer_hooks(accumulating).unsupported())


def test_autocast_adapter_unwraps_a_mixed_precision_weight():
  layer = tf_keras.layers.Dense(2, dtype="mixed_bfloat16")
  layer.build((None, 3))
  kernel = tf_hooks.unwrap_autocast(layer.kernel)
  assert type(kernel).__name__ != "AutoCastVariable"
  assert kernel.dtype == tf.float32
  plain = tf.Variable(1.0)
  assert tf_hooks.unwrap_autocast(plain) is plain


def test_graph_adapters_see_while_bodies_and_dispatch():
  seen = {}

  @tf.function
  def loop():
    seen["outside"] = tf_hooks.inside_while_loop()

    def body(i):
      seen["body"] = tf_hooks.inside_while_loop()
      seen["names"] = list(tf_hooks.enclosing_graph_names())
      return (i + 1,)
    return tf.while_loop(lambda i: i < 3, body, (tf.constant(0),))

  assert int(loop()[0]) == 3
  assert seen["outside"] is False and seen["body"] is True
  assert seen["names"][0].startswith("while_body")
  assert not tf_hooks.inside_autograph_trial()
  assert tf_hooks.dispatching_worker_index() is None  # nothing dispatches
  assert tf_hooks.chief_cpu_device().endswith("/device:CPU:0")


def test_tf_keras_frame_and_qualname_adapters():
  namespace = {"__name__": "tf_keras.src.engine.fake", "tf_hooks": tf_hooks}
  exec("def _configure_steps_per_execution():\n"  # pylint: disable=exec-used
       "  return tf_hooks.created_by_model_method("
       "('_configure_steps_per_execution',))", namespace)
  assert namespace["_configure_steps_per_execution"]()
  namespace["__name__"] = "not_tf_keras"
  exec("def _configure_steps_per_execution():\n"  # pylint: disable=exec-used
       "  return tf_hooks.created_by_model_method("
       "('_configure_steps_per_execution',))", namespace)
  assert not namespace["_configure_steps_per_execution"]()

  class Step:
    __qualname__ = "Model.make_predict_function.<locals>.run_step"
  assert tf_hooks.is_step_of(Step, ("make_predict_function",))
  assert not tf_hooks.is_step_of(Step, ("make_train_function",))


def test_variable_adapters():
  inner = tf.Variable([1.0, 2.0])
  caching = tf_hooks.CachingVariable(inner)
  assert tf_hooks.wrapped_variable(caching) is inner


def test_closure_queue_adapters_wrap_a_real_queue():
  from tensorflow.python.distribute.coordinator import cluster_coordinator  # pylint: disable=g-import-not-at-top
  queue = cluster_coordinator._CoordinatedClosureQueue()  # pylint: disable=protected-access
  calls = []

  def put(original, closure, tag=None):
    calls.append(("put", tag))
    return original(closure, tag)

  def put_back(original, closure):
    calls.append(("put_back",))
    return original(closure)

  def mark_failed(original, error):
    calls.append(("mark_failed", str(error)))
    return original(error)
  tf_hooks.wrap_closure_queue(queue, put=put, put_back=put_back,
                              mark_failed=mark_failed)
  closure = cluster_coordinator.Closure(lambda: None,
                                        queue._cancellation_mgr)  # pylint: disable=protected-access
  queue.put(closure)
  assert tf_hooks.inflight_closures(queue) == 0
  assert queue.get() is closure
  assert tf_hooks.inflight_closures(queue) == 1
  queue.put_back(closure)
  assert queue.get() is closure
  queue.mark_failed(ValueError("boom"))
  assert str(tf_hooks.pending_error(queue)) == "boom"
  assert tf_hooks.inflight_closures(queue) == 0
  assert calls == [("put", None), ("put_back",), ("mark_failed", "boom")]
  queue.stop()


def test_chief_calls_outside_a_cancelled_closures_cancellation():
  # TF 2.21 keeps the running closure's CancellationManager in a global that
  # every tf.function call reads, whichever thread makes it: once a failed
  # fit cancels, a chief-side call made while a closure runs is cancelled
  # too. tf_hooks.outside_closure_cancellation exempts the calling thread.
  import threading  # pylint: disable=g-import-not-at-top
  from tensorflow.python.eager import cancellation  # pylint: disable=g-import-not-at-top
  add_one = tf.function(lambda x: x + 1)
  add_one(tf.constant(1))
  manager = cancellation.CancellationManager()
  manager.start_cancel()
  entered, leave = threading.Event(), threading.Event()

  def a_running_closure():
    with cancellation.CancellationManagerContext(manager):
      entered.set()
      leave.wait(30)
  closure = threading.Thread(target=a_running_closure)
  closure.start()
  try:
    entered.wait(30)
    with pytest.raises(tf.errors.CancelledError):
      add_one(tf.constant(1))  # TF's behaviour: the reason for the hook
    with tf_hooks.outside_closure_cancellation():
      with tf_hooks.outside_closure_cancellation():  # nests
        assert int(add_one(tf.constant(1))) == 2
      assert int(add_one(tf.constant(2))) == 3
    with pytest.raises(tf.errors.CancelledError):
      add_one(tf.constant(1))  # only inside the block
    # Another thread's block exempts only that thread.
    results = []

    def exempt():
      with tf_hooks.outside_closure_cancellation():
        results.append(int(add_one(tf.constant(4))))
    other = threading.Thread(target=exempt)
    other.start()
    other.join(30)
    assert results == [5]
  finally:
    leave.set()
    closure.join(30)
  assert int(add_one(tf.constant(6))) == 7  # no closure runs: no manager


def test_keras3_trainer_hooks():
  # keras3_training takes fit, evaluate and predict from Keras 3's
  # TensorFlow trainer (routed per model), builds a model from a batch's
  # spec as its fit does, and reads the names and order of its metrics.
  import keras  # pylint: disable=g-import-not-at-top
  from keras.src.backend.tensorflow import trainer  # pylint: disable=g-import-not-at-top
  assert issubclass(keras.Model, trainer.TensorFlowTrainer)
  for name in ("fit", "evaluate", "predict"):
    assert name in vars(trainer.TensorFlowTrainer), name
  build = inspect.signature(keras.Model._symbolic_build).parameters
  assert "data_batch" in build
  assert "to_symbolic_input" in inspect.getsource(keras.Model._symbolic_build)
  model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
  with pytest.raises(ValueError, match="compile"):
    tf_hooks.keras3_assert_compiled(model, "fit")
  model.compile("sgd", "mse", metrics=["mae"])
  tf_hooks.keras3_symbolic_build(
      model, (tf.TensorSpec((None, 2)), tf.TensorSpec((None, 1))))
  assert model.optimizer.built and model.compiled_metrics is not None
  assert tf_hooks.keras3_metrics_in_order(
      model, {"mae": 2.0, "loss": 1.0}) == [1.0, 2.0]
  class PerBatch(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
      pass
  assert tf_hooks.keras_callback_overrides(PerBatch(), "on_train_batch_end")
  for plain in (keras.callbacks.Callback(), tf_keras.callbacks.Callback()):
    assert not tf_hooks.keras_callback_overrides(plain, "on_train_batch_end")
  assert not tf_hooks.keras3_tensorboard_profiles(
      keras.callbacks.TensorBoard("/tmp/unused"))
  assert tf_hooks.keras3_tensorboard_profiles(
      keras.callbacks.TensorBoard("/tmp/unused", profile_batch=3))


def test_routing_keras3_training_keeps_every_other_model_on_keras3():
  import keras  # pylint: disable=g-import-not-at-top
  calls = []
  tf_hooks.install_keras3_training(
      applies=lambda model: model.name == "routed",
      fit=lambda model, *a, **k: calls.append(("fit", model.name)),
      evaluate=lambda model, *a, **k: calls.append(("evaluate", model.name)),
      predict=lambda model, *a, **k: calls.append(("predict", model.name)))
  try:
    routed = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)],
                              name="routed")
    routed.fit(np.ones((4, 2)), np.ones((4, 1)))
    routed.evaluate(np.ones((4, 2)))
    routed.predict(np.ones((4, 2)))
    assert calls == [("fit", "routed"), ("evaluate", "routed"),
                     ("predict", "routed")]
    plain = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    plain.compile("sgd", "mse")
    plain.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
    assert plain.predict(np.ones((4, 2)), verbose=0).shape == (4, 1)
    assert len(calls) == 3
  finally:
    from keras.src.backend.tensorflow import trainer  # pylint: disable=g-import-not-at-top
    for name, (_, original) in tf_hooks.keras3_routed_methods().items():
      setattr(trainer.TensorFlowTrainer, name, original)


def test_compile_check_runs_in_both_kerases():
  import keras  # pylint: disable=g-import-not-at-top
  from keras.src.trainers import trainer  # pylint: disable=g-import-not-at-top
  from tf_keras.src.engine import training  # pylint: disable=g-import-not-at-top
  originals = (trainer.Trainer.compile, training.Model.compile)
  seen = []
  tf_hooks.install_compile_check(
      lambda model, optimizer: seen.append((type(model).__module__.split(
          ".")[0], optimizer)))
  try:
    keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]).compile(
        "sgd", "mse")
    tf_keras.Sequential([tf_keras.Input((2,)),
                         tf_keras.layers.Dense(1)]).compile(
                             optimizer="adam", loss="mse")
    assert seen == [("keras", "sgd"), ("tf_keras", "adam")]
  finally:
    trainer.Trainer.compile, training.Model.compile = originals


def test_keras3_accumulation_is_made_atomic_where_asked():
  # Keras 3 adds by reading and then writing; on a ps variable several
  # learners then lose updates, so the hook calls the tf.Variable's own
  # assign_add / assign_sub for the variables `applies` names.
  import keras  # pylint: disable=g-import-not-at-top
  from keras.src.backend.common import variables as common  # pylint: disable=g-import-not-at-top
  from keras.src.backend.tensorflow import core  # pylint: disable=g-import-not-at-top
  assert "self.assign(self + value)" in inspect.getsource(
      common.Variable.assign_add)
  originals = (core.Variable.assign_add, core.Variable.assign_sub)
  atomic = []
  tf_hooks.install_keras3_atomic_accumulation(
      applies=lambda tf_variable: atomic.append(tf_variable.name) or
      tf_variable.name.startswith("chosen"))
  try:
    chosen, other = keras.Variable(1.0, name="chosen"), keras.Variable(1.0)
    chosen.assign_add(2.0)
    chosen.assign_sub(0.5)
    other.assign_add(2.0)
    assert float(chosen.numpy()) == 2.5 and float(other.numpy()) == 3.0
    assert len(atomic) == 3
  finally:
    core.Variable.assign_add, core.Variable.assign_sub = originals
