"""A ClusterCoordinator that tells each learner's input pipeline who it is.

TF's ParameterServerStrategy gives every worker's dataset function the same
`InputContext(num_input_pipelines=1, input_pipeline_id=0)`, so learners cannot
read disjoint shards. `RudraCoordinator` traces per-worker dataset functions once
per learner inside `learner_scope(i)`, and `RudraExtended` then hands dataset
functions `InputContext(num_input_pipelines=λ, input_pipeline_id=i)`.
"""

import contextlib
import threading

import tensorflow as tf
from tensorflow.python.distribute import input_lib
from tensorflow.python.distribute.coordinator import cluster_coordinator
from tensorflow.python.distribute.coordinator import values as values_lib

_state = threading.local()


def current_learner():
  """The learner index whose per-worker function is being traced, or None."""
  return getattr(_state, "learner", None)


@contextlib.contextmanager
def learner_scope(index):
  previous = current_learner()
  _state.learner = index
  try:
    yield
  finally:
    _state.learner = previous


class _PerLearnerDataset(values_lib.PerWorkerDatasetFromDatasetFunction):
  """A per-worker dataset whose dataset function is traced once per learner."""

  def __init__(self, dataset_fn, coordinator):
    python_function = getattr(dataset_fn, "python_function", dataset_fn)
    self._learner_functions = []
    for index in range(len(coordinator._cluster.workers)):  # pylint: disable=protected-access
      with learner_scope(index):
        super().__init__(python_function, coordinator)
      self._learner_functions.append(self._dataset_fn)

  def _create_per_learner(self, make_function, type_spec):
    workers = self._coordinator._cluster.workers  # pylint: disable=protected-access
    values = tuple(
        worker.create_resource(make_function(function))
        for worker, function in zip(workers, self._learner_functions))
    for remote_value in values:
      remote_value._type_spec = type_spec  # pylint: disable=protected-access
    return values

  def build(self):
    return cluster_coordinator.PerWorkerValues(self._create_per_learner(
        lambda function: (lambda: function()),
        self._dataset_fn.structured_outputs._type_spec))  # pylint: disable=protected-access

  def __iter__(self):
    if not tf.executing_eagerly():
      raise RuntimeError(
          "__iter__() is not supported inside of tf.function or in graph mode.")
    spec = input_lib.get_iterator_spec_from_dataset(
        self._coordinator.strategy, self._dataset_fn.structured_outputs)
    return values_lib.PerWorkerDistributedIterator(self._create_per_learner(
        lambda function: (lambda: iter(function())), spec))


class RudraCoordinator(cluster_coordinator.ClusterCoordinator):
  """ClusterCoordinator whose dataset functions are traced per learner."""

  def create_per_worker_dataset(self, dataset_fn):
    if callable(dataset_fn) and not isinstance(
        dataset_fn, tf.types.experimental.ConcreteFunction):
      return _PerLearnerDataset(dataset_fn, self)
    return super().create_per_worker_dataset(dataset_fn)
