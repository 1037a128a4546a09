"""Exactly-once pushes across re-runs (rudra_tf/push_keys.py).

The pure tests step a ledger by hand through push_keys' state machine (no
cluster). The cluster tests make TensorFlow's own failure handling re-run a
closure that had already pushed, with more than a thousand closures queued
behind it, as a learner killed early in a long epoch does.
"""

import os

import numpy as np
import pytest

from tests.support import assert_invariants
from tests.support import run_in_fresh_process

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


# ------------------------------------------------------------- pure ledger
class _Shard:
  """One shard's ledger stepped eagerly through push_keys' transitions."""

  def __init__(self, num_learners=2, pinned_slots=2):
    from rudra_tf import ledger  # pylint: disable=g-import-not-at-top
    self.layout = ledger.LedgerLayout(bins=4, num_learners=num_learners,
                                      pinned_slots=pinned_slots)
    self.value = self.layout.initial()

  def push(self, key, learner, limit=1):
    """True if the push is taken (fresh), as ShardState._record decides."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from rudra_tf import ledger, push_keys  # pylint: disable=g-import-not-at-top
    changes = ledger.Changes(self.value)
    key, learner = tf.constant(key, tf.int64), tf.constant(learner, tf.int64)
    seen = push_keys.seen(self.layout, self.value, key, learner)
    delivered = push_keys.fresh(seen, tf.constant(limit, tf.int64))
    push_keys.record(changes, self.layout, key, learner, seen, delivered)
    self.value = changes.new_value()
    return bool(delivered)

  def pin(self, key):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from rudra_tf import ledger, push_keys  # pylint: disable=g-import-not-at-top
    changes = ledger.Changes(self.value)
    new = push_keys.pin(changes, self.layout, tf.constant(key, tf.int64))
    self.value = changes.new_value()
    return bool(new)

  def pins(self):
    layout, value = self.layout, self.value.numpy()
    return (value[layout.pinned_keys:layout.pinned_key_pushes].tolist(),
            value[layout.pinned_key_pushes:layout.size].tolist())


def test_a_run_takes_limit_pushes_and_its_rerun_after_a_pin_none():
  shard = _Shard()
  # Key 7 (limit 1) on learner 0: UNSEEN -> RUNNING(0, 1); a second push of
  # the same run is refused (as a re-run's would be while L holds it).
  assert shard.push(7, learner=0)
  assert not shard.push(7, learner=0)
  # Learner 0 moves on to keys 8..12: key 7 is FINISHED, forgotten, and
  # nothing else is remembered of it. Learner 1 runs 13.
  for key in range(8, 13):
    assert shard.push(key, learner=0)
  assert shard.push(13, learner=1)
  # TF puts 13 back (learner 1 died after its push): PINNED(1). However many
  # closures follow, its re-run on learner 0 is refused.
  assert shard.pin(13)
  assert shard.pins() == ([13, -1], [1, 0])
  for key in range(14, 1100):
    assert shard.push(key, learner=0)
  assert not shard.push(13, learner=0)
  # And the dead run's own push, arriving late (a zombie), is refused too.
  assert not shard.push(13, learner=1)


def test_a_pin_counts_pushes_of_a_multi_step_closure_across_runs():
  shard = _Shard()
  # Key 5, limit 3: the first run (learner 1) delivers 2 pushes and dies.
  assert shard.push(5, learner=1, limit=3) and shard.push(5, learner=1, limit=3)
  assert shard.pin(5)
  assert shard.pins() == ([5, -1], [2, 0])
  # Its re-run (learner 0) may deliver one more, then nothing.
  assert shard.push(5, learner=0, limit=3)
  assert not shard.push(5, learner=0, limit=3)
  assert not shard.push(5, learner=0, limit=3)
  assert shard.pins() == ([5, -1], [3, 0])
  # Put back again (the re-run died too): the pin keeps its count.
  assert not shard.pin(5)
  assert not shard.push(5, learner=1, limit=3)


def test_a_key_pinned_before_any_push_takes_the_reruns_pushes():
  shard = _Shard()
  # The first run died before pushing: PINNED(0); the re-run delivers.
  assert shard.pin(9)
  assert shard.pins() == ([9, -1], [0, 0])
  assert shard.push(9, learner=1)
  assert not shard.push(9, learner=0)  # a late zombie of the first run


def test_pins_are_overwritten_oldest_first_after_the_slots_run_out():
  shard = _Shard(pinned_slots=2)
  for key in (1, 2, 3):
    assert shard.push(key, learner=0)
  assert shard.pin(1) and shard.pin(2)
  assert shard.pins() == ([1, 2], [0, 0])  # learner 0's record moved to 3
  assert shard.pin(3)  # the cursor wraps: 3 replaces 1
  assert shard.pins() == ([3, 2], [1, 0])
  assert not shard.push(3, learner=1)


def test_no_deduplication_with_an_unknown_limit():
  shard = _Shard()
  assert all(shard.push(4, learner=0, limit=-1) for _ in range(3))


# --------------------------------------------------------- on a cluster
def _rerun_far_behind(protocol, closures, steps_per_closure, learning_rate):
  """TF re-runs closure 1 after it pushed, behind `closures - 1` others.

  Closure 1's first run raises once its pushes are in and every closure is
  queued: TF's coordinator takes that for a learner failure
  (TF_PS_HANDLE_UNKNOWN_ERROR=1, TF's own switch for a "Graph execution
  error"), calls `_on_closure_failure` and puts the closure back at the end
  of the queue, behind all the others. (The cluster is in this process, so
  the step's py_function can wait for the scheduling loop.) Loss = w, plain
  SGD: each update moves w by exactly -learning_rate.
  """
  import threading  # pylint: disable=g-import-not-at-top
  os.environ["TF_PS_HANDLE_UNKNOWN_ERROR"] = "1"
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from rudra_tf import tf_hooks  # pylint: disable=g-import-not-at-top
  from tests import cluster_fixtures  # pylint: disable=g-import-not-at-top
  strategy, coordinator, w, replica_step = cluster_fixtures.counting_weight(
      protocol, learning_rate)
  failures, all_queued = [], threading.Event()

  def fail_first_run(marker):
    if int(marker) == 1 and not failures:
      failures.append(1)
      all_queued.wait()
      raise tf.errors.UnavailableError(None, None, "injected after the push")
    return np.int64(0)

  @tf.function
  def closure(marker, steps_per_execution):
    for _ in tf.range(steps_per_execution):
      strategy.run(replica_step)
    with tf.control_dependencies([w.read_value()]):
      return tf.py_function(fail_first_run, [marker], tf.int64)

  steps = tf.constant(steps_per_closure, tf.int64)
  coordinator.schedule(closure, args=(tf.constant(1, tf.int64), steps))
  # What every shard and the chief hold as the learners' incarnations when
  # TF puts the failed closure back (the failed learner's next closure is
  # dispatched after that).
  incarnations_at_put_back = []

  def put_back_observed(put_back, closure):
    incarnations_at_put_back.append(
        [list(strategy._incarnations)] +  # pylint: disable=protected-access
        [[int(i) for i in shard._incarnations.numpy()]  # pylint: disable=protected-access
         for shard in strategy.build_shards()])
    return put_back(closure)
  tf_hooks.wrap_closure_queue(tf_hooks.closure_queue(coordinator),
                              put_back=put_back_observed)
  for _ in range(closures - 1):
    coordinator.schedule(closure, args=(tf.constant(0, tf.int64), steps))
  all_queued.set()
  coordinator.join()
  from tests.cluster_fixtures import report_as_dict  # pylint: disable=g-import-not-at-top
  return {"w": float(np.asarray(w.read_value())), "failures": len(failures),
          "report": report_as_dict(strategy),
          "incarnations_at_put_back": incarnations_at_put_back}


@pytest.mark.parametrize("protocol,closures,steps_per_closure", [
    ("async", 1100, 1), ("1-softsync", 1100, 1), ("hardsync", 1100, 1),
    ("async", 400, 3)])
def test_a_closure_rerun_behind_a_thousand_others_is_refused(
    protocol, closures, steps_per_closure):
  # Before pins, a shard remembered the last 1,024 keys: this re-run came
  # 1,099 closures later and was applied again (gradients 1101, duplicates
  # 0, as 2 of 5 random-time kills showed on a real cluster).
  result = run_in_fresh_process(
      _rerun_far_behind, protocol=protocol, closures=closures,
      steps_per_closure=steps_per_closure, learning_rate=0.001)
  report = result["report"]
  assert result["failures"] == 1
  if protocol == "hardsync":
    # The failed learner has a new incarnation on the chief and on every
    # shard before it can run another closure. A shard that heard of it
    # later (the release ran in a thread of its own) took that closure for
    # a dead incarnation's: a CI run lost its gradient (gradients 1,099,
    # duplicates 2).
    (chief, *shards), = result["incarnations_at_put_back"]
    assert sorted(chief) == [0, 1]
    assert all(shard == chief for shard in shards), (chief, shards)
  assert report["gradients"] == closures * steps_per_closure, report
  assert report["duplicates"] == steps_per_closure, report
  assert_invariants(report)
  assert result["w"] == pytest.approx(-0.001 * report["timestamp"], rel=1e-4)


def _fit_limits(steps_per_execution):
  """The push limit RudraCoordinator gives tf_keras's train function."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tests import cluster_fixtures  # pylint: disable=g-import-not-at-top
  _, strategy = cluster_fixtures.connect_cluster(1, 2, "async")
  model = cluster_fixtures.compiled_mlp(
      strategy, "sgd_momentum", "none",
      steps_per_execution=steps_per_execution)
  x, y = cluster_fixtures.synthetic_data()
  model.fit(cluster_fixtures.repeated_batches(x, y, 8), epochs=1, verbose=0,
            steps_per_epoch=2 * steps_per_execution)
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
      strategy)
  keyed, = coordinator._keyed_functions.values()  # pylint: disable=protected-access
  args = (None, tf.constant(steps_per_execution, tf.int64))
  return {"runs": keyed.push_key.runs, "limit": keyed.limit(args),
          "gradients": strategy.staleness_report().gradients}


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_tf_keras_train_function_gets_its_step_count_as_limit(
    steps_per_execution):
  # tf_keras's multi-step train function assigns `outputs` only inside its
  # loop, so autograph first stages a trial iteration in a throw-away graph:
  # a strategy.run traced there must not count, or the limit is unknown
  # (-1) and no push is de-duplicated. (Found by tests/test_chaos.py:
  # hardsync, steps_per_execution 3, 1,206 gradients for 1,200 steps.)
  result = run_in_fresh_process(_fit_limits,
                                steps_per_execution=steps_per_execution)
  assert result == {"runs": 1, "limit": steps_per_execution,
                    "gradients": 2 * steps_per_execution}
