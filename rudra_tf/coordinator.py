"""RudraCoordinator: TF's ClusterCoordinator with learner inputs and push keys.

Learner inputs. TF's ParameterServerStrategy gives every worker's dataset
function the same `InputContext(num_input_pipelines=1, input_pipeline_id=0)`,
so learners cannot read disjoint shards. `RudraCoordinator` traces per-worker
dataset functions once per learner inside `learner_scope(i)`, and
`RudraExtended` then hands dataset functions
`InputContext(num_input_pipelines=λ, input_pipeline_id=i)`.

Push keys (idempotent pushes). TF runs a scheduled function at least once: if
its worker dies mid-closure, the closure runs again on another worker, and
the pushes its first run had already made would be applied a second time.
Every scheduled closure gets a key (k, k+1, ..., from a random base k) and a
limit, the number of pushes one run of it makes; each shard accepts at most
`limit` pushes per key and counts the rest as duplicates
(`StalenessReport.duplicates`). TF puts a closure back for a re-run at the
end of its queue, however many closures wait there; before it does, every
shard pins the closure's key (push_keys.py), so its re-run is checked
against what its earlier runs pushed however late it comes. So each
scheduled training step contributes exactly one gradient, whichever run
delivered it. The limit is 1 for a
function with one training step, the `steps_per_execution` argument for
tf_keras's multi-step train function, and -1 (no de-duplication) when it
cannot be known (several `strategy.run` calls, or one inside a loop of
unknown length).
"""

import contextlib
import inspect
import itertools
import random
import re
import threading
import weakref

import tensorflow as tf

from rudra_tf import tf_hooks

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


class _PerLearnerDataset(tf_hooks.PerWorkerDatasetFromFunction):
  """A per-worker dataset whose dataset function is traced once per learner."""

  def __init__(self, dataset_fn, coordinator):
    python_function = getattr(dataset_fn, "python_function", dataset_fn)
    self._learner_functions = []
    self._workers = tf_hooks.cluster_workers(coordinator)
    self._strategy = coordinator.strategy
    for index in range(len(self._workers)):
      with learner_scope(index):
        super().__init__(python_function, coordinator)
      self._learner_functions.append(tf_hooks.traced_dataset_function(self))

  def _create_per_learner(self, make_function, type_spec):
    values = tuple(
        worker.create_resource(make_function(function))
        for worker, function in zip(self._workers, self._learner_functions))
    for remote_value in values:
      tf_hooks.set_type_spec(remote_value, type_spec)
    return values

  def build(self):
    return tf.distribute.experimental.coordinator.PerWorkerValues(
        self._create_per_learner(
            lambda function: (lambda: function()),
            tf_hooks.dataset_output_spec(
                tf_hooks.traced_dataset_function(self))))

  def __iter__(self):
    if not tf.executing_eagerly():
      raise RuntimeError(
          "__iter__() is not supported inside of tf.function or in graph mode.")
    spec = tf_hooks.iterator_spec(
        self._strategy,
        tf_hooks.traced_dataset_function(self).structured_outputs)
    return tf_hooks.PerWorkerIterator(self._create_per_learner(
        lambda function: (lambda: iter(function())), spec))


class PushKey:
  """The key and limit tensors of one traced closure (see module doc)."""

  def __init__(self, key, limit):
    self.key = key
    self.limit = limit
    self.runs = 0  # strategy.run calls traced with this key
    self.in_loop = False  # one of them inside a while loop


def current_push_key():
  """The `PushKey` of the closure being traced, or None."""
  return getattr(_state, "push_key", None)


@contextlib.contextmanager
def push_key_scope(push_key):
  previous = current_push_key()
  _state.push_key = push_key
  try:
    yield push_key
  finally:
    _state.push_key = previous


class StepPlan:
  """What `RudraStrategy.run` does in the traces of one scheduled function.

  A scheduled function is traced twice before it first runs:

      probing --(first trace, thrown away)--> planned (pulls = pushed)

  The first trace (`probing`) pulls nothing: the step reads the live
  variables, and the optimizer builds its state but pushes nothing. A model
  built lazily (no Input) creates its variables there, so they exist, and
  become protocol variables, before the first step pulls; and the trace
  shows whether the function pushes at all (`pushed`). The function then
  scheduled is traced anew: its steps pull only if the first trace pushed
  (a function that trains nothing, as an evaluation or preprocessing step
  of a custom loop, pulls nothing, as under TF's own strategy: a hardsync
  pull without a push would hold a round's token forever).
  """

  def __init__(self):
    self.probing = True
    self.pushed = False


def current_step_plan():
  """The `StepPlan` of the scheduled function being traced, or None."""
  return getattr(_state, "step_plan", None)


@contextlib.contextmanager
def _step_plan_scope(plan):
  previous = current_step_plan()
  _state.step_plan = plan
  try:
    yield plan
  finally:
    _state.step_plan = previous


# tf_keras's multi-step train function takes its step count as this argument.
_STEPS_ARGUMENT = "steps_per_execution"
NO_DEDUPLICATION = -1


class _KeyedFunction:
  """A scheduled tf.function, traced with a push key and limit in front."""

  def __init__(self, function):
    # Converted as the scheduled tf.function would have been: tf_keras's
    # multi-step train function loops with `for _ in tf.range(...)`, and
    # autograph leaves Keras modules alone unless asked explicitly.
    self._python_function = tf.autograph.to_graph(function.python_function)
    parameters = list(
        inspect.signature(function.python_function).parameters)
    self._steps_index = (parameters.index(_STEPS_ARGUMENT)
                         if _STEPS_ARGUMENT in parameters else None)
    self.push_key = None
    self.plan = StepPlan()
    # The strategy's model_generation when traced: its model's, if it trains.
    self.generation = None

    def keyed(key, limit, *args, **kwargs):
      with push_key_scope(PushKey(key, limit)) as push_key, \
          _step_plan_scope(self.plan):
        self.push_key = push_key
        return self._python_function(*args, **kwargs)
    self._keyed = keyed
    self.function = None

  def trace(self, args, kwargs):
    """The probing trace, then the trace of the function scheduled
    (`StepPlan`)."""
    specs = (tf_hooks.scheduled_argument_specs(tuple(args or ())),
             tf_hooks.scheduled_argument_specs(dict(kwargs or {})))
    for _ in ("probing", "planned"):
      self.function = tf.function(self._keyed)
      self.function.get_concrete_function(
          tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.int64),
          *specs[0], **specs[1])
      self.plan.probing = False

  def limit(self, args):
    """Pushes one run of the closure makes, or NO_DEDUPLICATION."""
    traced = self.push_key
    if traced is None or traced.runs != 1:
      return NO_DEDUPLICATION
    if not traced.in_loop:
      return 1
    if self._steps_index is not None and self._steps_index < len(args):
      return int(args[self._steps_index])
    return NO_DEDUPLICATION


# How often a failed hardsync fit's barriers are opened until no closure
# runs: each opening costs an RPC per shard, and a cancelled closure's
# waiting pull is let through within this time.
BARRIER_OPEN_INTERVAL_S = 0.5


def first_push_key():
  """A random base k for one run's push keys (k, k+1, k+2, ...).

  A restored checkpoint remembers the keys its run had seen; a new run's
  keys start elsewhere (2^40 bases), so none of its pushes is refused.
  """
  return random.SystemRandom().getrandbits(40) + 1


class LearnerDataExhaustedError(tf.errors.OutOfRangeError):
  """A learner's dataset ended during training.

  An OutOfRangeError, as the error TF's ParameterServerStrategy gives, so
  code that catches that catches this; its message names the learner and
  the fix.
  """

  def __init__(self, cause):
    learner = re.search(r"/job:worker/replica:\d+/task:(\d+)", str(cause))
    which = f"learner {learner.group(1)}" if learner else "a learner"
    super().__init__(
        cause.node_def, cause.op,
        f"The dataset of {which} ran out of data. Under RudraStrategy, as "
        "under TensorFlow's ParameterServerStrategy, a learner's dataset "
        "must not end: end the dataset (or dataset function) with "
        ".repeat() and give fit steps_per_epoch.")
    self.__cause__ = cause


class RudraCoordinator(tf.distribute.experimental.coordinator.ClusterCoordinator):
  """ClusterCoordinator with per-learner inputs and keyed, idempotent pushes."""

  def schedule(self, fn, args=None, kwargs=None):
    """Schedules `fn` with a fresh push key (see the module docstring)."""
    if not hasattr(fn, "python_function"):  # a ConcreteFunction: no keys
      return super().schedule(fn, args=args, kwargs=kwargs)
    # ClusterCoordinator.__init__ runs again each time tf_keras "creates" the
    # (singleton) coordinator, so this state is made lazily.
    if not hasattr(self, "_keyed_functions"):
      self._keyed_functions = {}
      self._first_key = first_push_key()
      self._next_key = itertools.count(self._first_key)
      self._watch_learner_failures()
      self._pin_keys_of_closures_put_back()
      self._explain_exhausted_inputs()
    if getattr(self, "_barrier_opener", None) is not None and \
        self._nothing_runs():
      self._restore_barriers()
    keyed = self._keyed_functions.get(fn)
    if keyed is None:
      keyed = self._keyed_functions[fn] = _KeyedFunction(fn)
      with self.strategy.scope(), tf_hooks.being_scheduled(self.strategy):
        keyed.trace(args, kwargs)
      keyed.generation = self.strategy.model_generation
    if keyed.plan.pushed:  # it trains: the model this strategy trains now?
      self.strategy.refuse_retired_model(keyed.generation)
    return self._schedule_keyed(keyed, next(self._next_key), args, kwargs)

  def _watch_learner_failures(self):
    """Retires a dead learner's incarnation before TF re-runs its closure.

    TF calls `Worker._on_closure_failure` when a learner fails mid-closure,
    then puts the closure back on the queue. Before that, on the learner's
    closure thread, the strategy gives the learner a new incarnation on the
    chief and on every shard and gives back the barrier tokens it held, so
    the re-run can pull. Done in line, not in a thread: the learner's next
    closure carries its new incarnation, and a shard that had not heard of
    it yet took that closure's pull and push for a dead incarnation's (a
    hardsync CI run lost a gradient so, counted as a duplicate).
    """
    for worker in tf_hooks.cluster_workers(self):

      def on_closure_failure(closure, error, put_back, worker=worker):
        self.strategy._learner_failed(worker.worker_index)  # pylint: disable=protected-access
        put_back(closure, error)
      tf_hooks.wrap_closure_failure(worker, on_closure_failure)

  def _pin_keys_of_closures_put_back(self):
    """Pins a keyed closure's push key on every shard before TF re-runs it.

    Every re-run goes through `closure_queue.put_back`: after a learner's
    death (`_on_closure_failure`) and after a transient error (straight from
    the learner's closure thread). The pin runs inside it, so it is recorded
    before the closure can run again and before that learner gets its next
    closure (push_keys.py says why both matter). The keys of scheduled
    closures are noted as TF queues them (`closure_queue.put`).
    """
    key_of = weakref.WeakKeyDictionary()

    def put_noting_key(put, closure, tag=None):
      key = getattr(_state, "scheduling_key", None)
      if key is not None and tag is None:
        key_of[closure] = key
      return put(closure, tag)

    def put_back_pinned(put_back, closure):
      key = key_of.get(closure)
      if key is not None:
        self.strategy._pin_push_key(key)  # pylint: disable=protected-access
      return put_back(closure)
    tf_hooks.wrap_closure_queue(tf_hooks.closure_queue(self),
                                put=put_noting_key, put_back=put_back_pinned)

  def _open_barriers_while_cancelling(self):
    """Keeps a failed hardsync fit's cancellation from waiting forever.

    After a closure fails for good, TF cancels the others and waits until no
    closure runs. One cancelled after its pull and before its push leaves
    its round short, so a learner waiting at the barrier would never wake,
    and neither would the chief. Until the failed fit is over
    (`_nothing_runs`), every shard's barrier is opened every
    BARRIER_OPEN_INTERVAL_S; the first schedule call after that restores
    exact rounds (`_restore_barriers`). Gradients pushed meanwhile may be
    stale.

    "No closure in flight" alone is not the end: until the chief raises the
    error, TF's learners go on taking queued closures (`closure_queue.get`
    does not look at the error), so the count can touch 0 between two of
    them while more are still to come and to wait at a barrier (CI saw
    that hang: one of three side-by-side runs).
    """
    if not self.strategy.protocol.barrier or getattr(
        self, "_barrier_opener", None) is not None:
      return
    stop = self._barrier_opener = threading.Event()

    def open_until_the_fit_is_over():
      while not stop.is_set() and not self._nothing_runs():
        if not self.strategy._open_barriers():  # pylint: disable=protected-access
          return
        stop.wait(BARRIER_OPEN_INTERVAL_S)
    threading.Thread(target=open_until_the_fit_is_over, daemon=True,
                     name="rudra-open-barriers").start()

  def idle(self):
    """Nothing scheduled runs (always, before the first schedule)."""
    return not hasattr(self, "_keyed_functions") or self._nothing_runs()

  def _nothing_runs(self):
    """No closure runs and no failure waits to be raised: a failed fit is
    over (schedule calls of the failing fit itself come before that)."""
    queue = tf_hooks.closure_queue(self)
    return (tf_hooks.inflight_closures(queue) == 0 and
            tf_hooks.pending_error(queue) is None)

  def _restore_barriers(self):
    """After a failed fit: exact hardsync rounds before the next closure."""
    opener, self._barrier_opener = self._barrier_opener, None
    opener.set()
    self.strategy._restore_barriers_after_failure()  # pylint: disable=protected-access

  def _explain_exhausted_inputs(self):
    """Makes a learner's end of input say which learner, and the fix.

    A closure whose learner's dataset has ended fails with OutOfRangeError;
    TF cancels every other closure and the chief raises the first error
    (TF logs it as it starts cancelling). It stays an OutOfRangeError
    (`LearnerDataExhaustedError`), so everything that catches that under
    TF's ParameterServerStrategy still does: tf_keras's fit takes it for the
    end of the data (a warning; fit then fails with CancelledError, or the
    closure's own OutOfRangeError when fit reads its logs, as on
    stock PSS), and so do custom loops.
    """
    def explained(mark_failed, error):
      self._open_barriers_while_cancelling()
      if isinstance(error, tf.errors.OutOfRangeError) and not isinstance(
          error, LearnerDataExhaustedError):
        error = LearnerDataExhaustedError(error)
      return mark_failed(error)
    tf_hooks.wrap_closure_queue(tf_hooks.closure_queue(self),
                                mark_failed=explained)

  def _schedule_keyed(self, keyed, key, args, kwargs):
    """Schedules a keyed function; the key of a re-run equals the first's."""
    limit = keyed.limit(tuple(args or ()))
    _state.scheduling_key = key  # for put_noting_key
    try:
      return super().schedule(
          keyed.function, args=(tf.constant(key, tf.int64),
                                tf.constant(limit, tf.int64)) +
          tuple(args or ()), kwargs=kwargs)
    finally:
      _state.scheduling_key = None

  def _keyed_function(self, fn):
    """The keyed wrapper of a function scheduled before (tests)."""
    return self._keyed_functions[fn]

  def create_per_worker_dataset(self, dataset_fn):
    if callable(dataset_fn) and not isinstance(
        dataset_fn, tf.types.experimental.ConcreteFunction):
      return _PerLearnerDataset(dataset_fn, self)
    return super().create_per_worker_dataset(dataset_fn)
