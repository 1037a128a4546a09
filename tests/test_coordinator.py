"""rudra_tf/coordinator.py against real TensorFlow servers: every input kind,
each learner's input context, a learner whose data runs out, a failed
hardsync fit's leftovers, and re-run closures (push keys).

Every cluster runs in a fresh process (tests/support.py); the scenarios
each test runs are beside it, below the tests.
"""

import concurrent.futures
import re

import numpy as np
import pytest

from tests.cluster_fixtures import (compiled_mlp, connect_cluster,
                                    counting_weight, repeated_batches,
                                    report_as_dict, seeded_mlp,
                                    synthetic_data)
from tests.support import assert_invariants
from tests.support import run_in_fresh_process


def test_fit_evaluate_predict_with_every_input_kind():
  result = run_in_fresh_process(input_kinds)
  original, clone = result["round_trip"]
  assert original == clone and original[0] == "Adam"
  assert result["config"]["lr_policy"] == "divide_by_n"
  assert all(np.isfinite(loss) for losses in result["losses"]
             for loss in losses)
  assert result["report"]["gradients"] == 6 + 2 * 5 + 7
  assert_invariants(result["report"])
  for loss, accuracy in result["evaluate"]:
    assert np.isfinite(loss) and 0.0 <= accuracy <= 1.0
  assert result["predict_shapes"] == [(40, 3), (40, 3)]
  assert result["predict_matches_weights"]


@pytest.mark.parametrize("protocol,runs", [("async", 1), ("hardsync", 3)])
def test_a_learner_whose_data_runs_out_fails_as_on_stock_pss(protocol, runs):
  # The chief's error stays an OutOfRangeError, as on stock PSS, naming the
  # learner and the fix: tf_keras's fit takes it for the end of the data
  # (a warning) and then fails with CancelledError (or OutOfRangeError), as
  # it does on stock PSS (the stock run below); a custom loop's join raises
  # it as it is.
  # Hardsync: TF cancels the other closures and waits for them; without
  # RudraCoordinator opening the barriers meanwhile, a pull waiting for a
  # round a cancelled closure left short hung (2 of 9 such runs side by
  # side), and the opener's own calls must not be cancelled with the
  # closures (1 of 6 runs hung), so three run side by side here.
  with concurrent.futures.ThreadPoolExecutor(runs + 1) as pool:
    stock = pool.submit(run_in_fresh_process, exhausted_input,
                        protocol=None, timeout=150)
    results = list(pool.map(
        lambda _: run_in_fresh_process(exhausted_input,
                                       protocol=protocol, timeout=150),
        range(runs)))
  # What fit does next is a race of TF's, on stock as here: fit reads the
  # logs of the last closure it scheduled, which TF cancelled
  # (CancelledError), which ran out of data itself (OutOfRangeError; a CI
  # run saw it under hardsync), or which had finished before the failure
  # reached schedule() (a loaded CI machine saw it under async): then fit
  # returns early with tf_keras's "ran out of data" warning. Stock PSS
  # users' code meets all three.
  stock_errors = ("CancelledError", "OutOfRangeError")
  assert_stopped_as_on_stock(stock.result(), stock_errors)
  explanation = ("The dataset of learner 0 ran out of data. Under "
                 "RudraStrategy, as under TensorFlow's "
                 "ParameterServerStrategy, a learner's dataset must not end: "
                 "end the dataset (or dataset function) with .repeat() and "
                 "give fit steps_per_epoch.")
  for result in results:
    assert_stopped_as_on_stock(result, stock_errors)
    assert result["logged_explanation"], "TF did not log the explanation"
    assert result["join_error"] == ["LearnerDataExhaustedError", True,
                                    explanation]
    # The counters stay exact through the failed fit, and a new fit trains
    # on (hardsync: in exact rounds again, every new gradient fresh).
    assert_invariants(result["report"])
    retry = result["retry"]
    assert retry["gradients"] == result["report"]["gradients"] + 9
    assert_invariants(retry)
    if protocol == "hardsync":
      new = retry["histogram"] - result["report"]["histogram"]
      assert new[0] == 9 and new.sum() == 9


def assert_stopped_as_on_stock(result, stock_errors):
  """fit raised one of stock's errors, or stopped early with its warning."""
  if result["fit_error"] is None:
    assert result["ran_out_warning"], (
        "fit neither failed nor warned that its input ran out")
  else:
    assert result["fit_error"] in stock_errors


def test_a_leftover_pull_of_a_failed_fit_takes_nothing_from_the_next():
  # λ = 2: learners 0 and 1 hold the round's two tokens; a third pull
  # (learner 0, incarnation 0) waits on the ps, as a step of a failed fit
  # that TF's cancellation did not reach can. Restoring the barriers gives
  # every learner a new incarnation, refills 2 tokens and rings 2 wake-ups:
  # the leftover wakes, sees its incarnation is dead, takes nothing and
  # passes its wake-up on. The next round (2 steps, lr 0.5, loss = w) then
  # completes: one update, w = -0.5, both gradients fresh.
  result = run_in_fresh_process(leftover_pull_after_failed_fit,
                                timeout=200)
  assert result["before"] == (0, [1, 1])
  assert result["waited"], "the third pull did not wait for a round"
  assert result["leftover_ended"]
  assert result["after"] == (2, [0, 0])
  assert result["round_finished"], "the next fit's first round hung"
  assert result["w"] == -0.5
  report = result["report"]
  assert (report["gradients"], report["timestamp"]) == (2, 1)
  assert report["histogram"][0] == 2
  assert_invariants(report)


def test_without_new_incarnations_the_leftover_pull_takes_a_token():
  # The same, refilling the tokens alone (before the fix): the leftover
  # takes one of the next round's two tokens, so that round cannot finish.
  result = run_in_fresh_process(leftover_pull_after_failed_fit,
                                retire=False, round_wait_s=15, timeout=200)
  assert result["leftover_ended"]
  assert result["after"] == (1, [1, 0])
  assert not result["round_finished"]


def test_each_learner_gets_its_own_input_context():
  result = run_in_fresh_process(learner_input_contexts,
                                num_learners=3)
  assert sorted(result["contexts"]) == [(3, 0), (3, 1), (3, 2)]
  assert result["finite"] and result["report"]["gradients"] == 12


@pytest.mark.parametrize("protocol,consistent_pulls", [
    ("async", True), ("async", False), ("1-softsync", True)])
def test_a_rerun_closure_applies_nothing_twice(protocol, consistent_pulls):
  # 3 closures of one step each (keys k, k+1, k+2), then closure 3 runs
  # again, as TF re-runs the closure a learner was running when it died
  # after its push (the last one that learner ran; TF runs one at a time
  # per learner): the shard refuses it and counts a duplicate. Each accepted
  # gradient moves w by -0.1 (1-softsync, λ = 2: c = 2, so 3 gradients = 1
  # update + 1 pending). Behind 1,099 queued closures: test_push_keys.py.
  result = run_in_fresh_process(
      rerun_closures, protocol=protocol,
      consistent_pulls=consistent_pulls, steps=3, reruns=(3,))
  report = result["report"]
  assert result["limit"] == 1
  assert report["duplicates"] == 1 and report["gradients"] == 3
  assert_invariants(report)
  expected_updates = 3 if protocol == "async" else 1
  assert report["timestamp"] == expected_updates
  assert result["w"] == pytest.approx(-0.1 * expected_updates, rel=1e-6)


def test_a_rerun_multi_step_closure_is_refused_up_to_its_step_count():
  # tf_keras's multi-step convention: 3 steps per closure (limit 3).
  # Closures 1 and 2 deliver 6 gradients; running closure 2 again (its
  # learner's last) delivers nothing new: its 3 pushes are refused.
  result = run_in_fresh_process(
      rerun_closures, steps=2, runs_per_step=3, reruns=(2,))
  report = result["report"]
  assert result["limit"] == 3
  assert report["gradients"] == 6 and report["duplicates"] == 3
  assert result["w"] == pytest.approx(-0.6, rel=1e-6)


def test_a_closure_of_unknown_step_count_is_not_deduplicated():
  # Two strategy.run calls per closure: the limit cannot be known, so no
  # push is refused (documented): the re-run's 2 gradients are applied.
  result = run_in_fresh_process(
      rerun_closures, steps=2, runs_per_step="two_runs",
      reruns=(2,))
  report = result["report"]
  assert result["limit"] == -1
  assert report["gradients"] == 6 and report["duplicates"] == 0
  assert result["w"] == pytest.approx(-0.6, rel=1e-6)


@pytest.mark.parametrize("protocol,steps_per_execution", [
    ("hardsync", 1), ("hardsync", 3), ("async", 1), ("1-softsync", 3)])
def test_a_lazily_built_model_trains_from_its_first_step(protocol,
                                                         steps_per_execution):
  # Sequential without Input, as in TF's tutorial: the variables appear in
  # the first (probing) trace, then become protocol variables; every step
  # of 2 epochs x 6 is one gradient, counted, and hardsync's all fresh.
  result = run_in_fresh_process(lazily_built_model, protocol=protocol,
                                steps_per_execution=steps_per_execution)
  assert result["variables"] == [(6, 8), (8,), (8, 3), (3,)]
  report = result["report"]
  assert report["gradients"] == 12 and report["dropped"] == 0
  assert report["timestamp"] == 12 // report["gradients_per_update"]
  assert_invariants(report)
  if protocol == "hardsync":
    assert report["histogram"][0] == 12
  assert all(np.isfinite(loss) for loss in result["losses"])
  assert result["moved"], "training did not change the weights"


def test_a_function_that_trains_nothing_pulls_nothing():
  # Scheduled functions that push no gradient (a computation with no model
  # yet; a read of the weights under hardsync, λ = 2, six times) run as on
  # TF's own strategy: no "no trainable variables" error, no hardsync token
  # taken (six such pulls would have held three rounds' tokens and hung).
  # Then 4 training steps (lr 0.5, loss = w): two updates, w = -1.
  result = run_in_fresh_process(functions_that_train_nothing)
  assert result["no_model_yet"] == [2, 2]
  assert result["tokens_before"] == result["tokens_after"] == (2, [0, 0])
  assert result["reads"] == [0.0] * 6
  assert result["w"] == -1.0
  assert result["report"]["gradients"] == 4
  assert_invariants(result["report"])


# ------------------------------------------------------------- scenarios
def input_kinds():
  """fit/evaluate/predict with numpy, tf.data and DatasetCreator input."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  _, strategy = connect_cluster(1, 2, "2-softsync")
  x, y = synthetic_data()
  model = compiled_mlp(strategy, "adam", "divide_by_n",
                        metrics=["accuracy"])
  with strategy.scope():
    config = model.optimizer.get_config()
    clone = rudra_tf.StalenessAwareOptimizer.from_config(config)
  results = {
      "config": config,
      "round_trip": [(type(o.inner_optimizer).__name__,
                      o.inner_optimizer.get_config(), o.lr_policy, o.name)
                     for o in (model.optimizer, clone)]}

  def dataset_fn(context):
    return (tf.data.Dataset.from_tensor_slices((x, y))
            .shard(context.num_input_pipelines, context.input_pipeline_id)
            .repeat().batch(4))

  history = [
      model.fit(x, y, batch_size=4, epochs=1, steps_per_epoch=6, verbose=0),
      model.fit(repeated_batches(x, y, 4), epochs=2, steps_per_epoch=5, verbose=0),
      model.fit(tf_keras.utils.experimental.DatasetCreator(dataset_fn),
                epochs=1, steps_per_epoch=7, verbose=0)]
  results["losses"] = [h.history["loss"] for h in history]
  results["evaluate"] = [
      model.evaluate(repeated_batches(x, y, 8), steps=4, verbose=0),
      model.evaluate(tf_keras.utils.experimental.DatasetCreator(dataset_fn),
                     steps=4, verbose=0)]
  results["predict_shapes"] = [
      model.predict(x[:40], batch_size=8, verbose=0).shape,
      model.predict(tf.data.Dataset.from_tensor_slices(x[:40]).batch(8),
                    steps=5, verbose=0).shape]
  expected = model.predict(x[:16], batch_size=8, verbose=0)
  results["predict_matches_weights"] = bool(np.allclose(
      expected, _mlp_forward(model.get_weights(), x[:16]), atol=1e-5))
  results["report"] = report_as_dict(strategy)
  return results


def _mlp_forward(weights, x):
  import numpy as np  # pylint: disable=g-import-not-at-top
  kernel1, bias1, kernel2, bias2 = weights
  logits = np.tanh(x @ kernel1 + bias1) @ kernel2 + bias2
  exp = np.exp(logits - logits.max(1, keepdims=True))
  return exp / exp.sum(1, keepdims=True)


def exhausted_input(protocol, num_learners=3):
  """Learner 0's dataset holds 3 batches and ends; the others repeat.

  `protocol` None: the same fit on TF's own ParameterServerStrategy, where
  every learner's dataset is learner 0's (all end).
  """
  import logging  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  x, y = synthetic_data()
  if protocol is None:
    cluster = rudra_tf.LocalCluster(num_ps=1, num_learners=num_learners)
    strategy = tf.distribute.ParameterServerStrategy(cluster.resolver)
    with strategy.scope():
      model = seeded_mlp()
      model.compile(tf_keras.optimizers.SGD(0.05, momentum=0.9),
                    "sparse_categorical_crossentropy")
  else:
    _, strategy = connect_cluster(1, num_learners, protocol)
    model = compiled_mlp(strategy, "sgd_momentum", "divide_by_n")
  logged = []

  class Collect(logging.Handler):
    def emit(self, record):
      logged.append(record.getMessage())
  logging.getLogger("tensorflow").addHandler(Collect())

  def dataset_fn(context):
    dataset = tf.data.Dataset.from_tensor_slices((x[:12], y[:12])).batch(4)
    return dataset if context.input_pipeline_id == 0 else dataset.repeat()
  try:
    model.fit(tf_keras.utils.experimental.DatasetCreator(dataset_fn),
              epochs=2, steps_per_epoch=30, verbose=0)
    fit_error = None
  except tf.errors.OpError as raised:
    fit_error = type(raised).__name__
  ran_out_warning = any(line.startswith("Your input ran out of data")
                        for line in logged)
  if protocol is None:
    return {"fit_error": fit_error, "ran_out_warning": ran_out_warning}
  report = report_as_dict(strategy)
  # The same model trains on once its data repeats.
  model.fit(repeated_batches(x, y, 4), epochs=1, steps_per_epoch=9, verbose=0)
  result = {"fit_error": fit_error, "ran_out_warning": ran_out_warning,
            "report": report,
            "retry": report_as_dict(strategy),
            "logged_explanation": any(
                "LearnerDataExhaustedError(): The dataset of learner 0 ran "
                "out of data." in line for line in logged)}
  # A custom loop whose every learner has 2 batches: 3λ + 3 steps, join.
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
      strategy)
  iterator = iter(coordinator.create_per_worker_dataset(
      lambda: strategy.distribute_datasets_from_function(
          lambda context: tf.data.Dataset.from_tensor_slices(
              (x[:8], y[:8])).batch(4))))

  @tf.function
  def train_step(iterator):
    def replica_step(features, labels):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(
            labels, model(features)))
      gradients = tape.gradient(loss, model.trainable_variables)
      model.optimizer.apply_gradients(zip(gradients,
                                          model.trainable_variables))
    strategy.run(replica_step, args=next(iterator))
  try:
    for _ in range(3 * num_learners + 3):
      coordinator.schedule(train_step, args=(iterator,))
    coordinator.join()
    result["join_error"] = None
  except tf.errors.OutOfRangeError as raised:
    result["join_error"] = [type(raised).__name__, isinstance(
        raised, rudra_tf.coordinator.LearnerDataExhaustedError),
                            re.sub(r"learner \d", "learner 0", str(raised))]
  return result


def leftover_pull_after_failed_fit(retire=True, round_wait_s=60):
  """A pull of a failed hardsync fit that TF's cancellation did not reach.

  λ = 2, one shard. The chief takes both tokens of the round as learners 0
  and 1 (incarnation 0), then a third pull of learner 0 waits on the ps:
  the leftover. The failed fit is then over: the barriers are restored
  (`retire=False`: tokens refilled only, as before the fix). Returns the
  tokens once the leftover's wait has ended, and a round trained after it.
  """
  import threading  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  strategy, coordinator, w, replica_step = counting_weight("hardsync", 0.5)
  shard, = strategy.build_shards()

  @tf.function
  def take(learner):
    with tf.device(shard.device):
      return shard._take_token(learner, tf.constant(0, tf.int64))  # pylint: disable=protected-access
  take(tf.constant(0, tf.int64))
  take(tf.constant(1, tf.int64))
  before = shard.token_counts()
  leftover = threading.Thread(target=take, args=(tf.constant(0, tf.int64),))
  leftover.start()
  leftover.join(2)
  waited = leftover.is_alive()
  if retire:
    strategy._restore_barriers_after_failure()  # pylint: disable=protected-access
  else:
    strategy.restore_exact_rounds()
  leftover.join(60)
  after = shard.token_counts()

  @tf.function
  def closure():
    strategy.run(replica_step)
  for _ in range(2):  # one round of the next fit
    coordinator.schedule(closure)
  finished = threading.Event()
  threading.Thread(target=lambda: (coordinator.join(), finished.set()),
                   daemon=True).start()
  return {"before": before, "waited": waited,
          "leftover_ended": not leftover.is_alive(), "after": after,
          "round_finished": finished.wait(round_wait_s),
          "w": float(np.asarray(w.read_value())),
          "report": report_as_dict(strategy)}


def learner_input_contexts(num_learners=3, steps=12):
  """Which InputContext each learner's dataset function was traced with."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  from rudra_tf import datasets  # pylint: disable=g-import-not-at-top
  _, strategy = connect_cluster(1, num_learners, "async")
  data = datasets.load_synthetic(train_size=90, test_size=9,
                                 image_shape=(4, 4, 1), num_classes=3)
  seen = []

  def dataset_fn(context):
    seen.append((context.num_input_pipelines, context.input_pipeline_id))
    return data.learner_dataset(context, batch_size=2)

  with strategy.scope():
    model = tf_keras.Sequential([
        tf_keras.layers.Input((4, 4, 1)), tf_keras.layers.Flatten(),
        tf_keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=rudra_tf.StalenessAwareOptimizer(
        tf_keras.optimizers.SGD(0.1)), loss="sparse_categorical_crossentropy")
  history = model.fit(tf_keras.utils.experimental.DatasetCreator(dataset_fn),
                      epochs=1, steps_per_epoch=steps, verbose=0)
  return {"contexts": seen, "loss": history.history["loss"],
          "report": report_as_dict(strategy), "finite": bool(np.isfinite(
              history.history["loss"][0]))}


def rerun_closures(protocol="async", consistent_pulls=True, steps=3,
                   runs_per_step=1, reruns=(2,), learning_rate=0.1):
  """Schedules `steps` keyed closures, then runs some again with their key.

  Loss = mean(w·x) with x = 1, plain SGD: every accepted gradient moves w by
  exactly -learning_rate, so w counts the applied gradients. A closure runs
  `runs_per_step` training steps: 1 (one strategy.run), k > 1 (tf_keras's
  convention: a tf.range loop over a `steps_per_execution` argument), or
  "two_runs" (two strategy.run calls: the limit cannot be known).
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  strategy, coordinator, w, replica_step = counting_weight(
      protocol, learning_rate, consistent_pulls=consistent_pulls)
  if runs_per_step == "two_runs":
    @tf.function
    def closure(dummy):
      del dummy
      strategy.run(replica_step)
      strategy.run(replica_step)
    args = (tf.constant(0),)
  elif runs_per_step == 1:
    @tf.function
    def closure(dummy):
      del dummy
      strategy.run(replica_step)
    args = (tf.constant(0),)
  else:
    @tf.function
    def closure(dummy, steps_per_execution):
      del dummy
      for _ in tf.range(steps_per_execution):
        strategy.run(replica_step)
    args = (tf.constant(0), tf.constant(runs_per_step, tf.int64))
  for _ in range(steps):
    coordinator.schedule(closure, args=args)
  coordinator.join()
  keyed = coordinator._keyed_function(closure)  # pylint: disable=protected-access
  first_key = coordinator._first_key  # pylint: disable=protected-access
  for closure_number in reruns:
    # As TF's put_back does after a worker failure (with RudraCoordinator's
    # hook): pin the key on every shard, then queue the closure again.
    key = first_key + closure_number - 1
    strategy._pin_push_key(key)  # pylint: disable=protected-access
    coordinator._schedule_keyed(keyed, key, args, None)  # pylint: disable=protected-access
  coordinator.join()
  return {"w": float(np.asarray(w.read_value())), "report": report_as_dict(strategy),
          "limit": keyed.limit(args)}


def lazily_built_model(protocol, steps_per_execution):
  """A model with no Input (built by its first step) fits 2 epochs x 6."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  _, strategy = connect_cluster(1, 2, protocol)
  x, y = synthetic_data()
  with strategy.scope():
    model = tf_keras.Sequential([
        tf_keras.layers.Dense(8, activation="tanh"),
        tf_keras.layers.Dense(3, activation="softmax")])
    model.compile(rudra_tf.StalenessAwareOptimizer(
        tf_keras.optimizers.SGD(0.05)), "sparse_categorical_crossentropy",
                  steps_per_execution=steps_per_execution)
  history = model.fit(repeated_batches(x, y, 8), epochs=1, steps_per_epoch=6,
                      verbose=0)
  after_one = [w.copy() for w in model.get_weights()]
  history2 = model.fit(repeated_batches(x, y, 8), epochs=1, steps_per_epoch=6,
                       verbose=0)
  return {"variables": [tuple(v.shape) for v in model.trainable_variables],
          "losses": history.history["loss"] + history2.history["loss"],
          "moved": any(not np.array_equal(a, b) for a, b in
                       zip(after_one, model.get_weights())),
          "report": report_as_dict(strategy)}


def functions_that_train_nothing():
  """λ = 2 hardsync: functions that push nothing, then 4 training steps."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  _, strategy = connect_cluster(1, 2, "hardsync")
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
      strategy)

  @tf.function
  def plus_one(x):
    return strategy.run(lambda value: value + 1, args=(x,))
  no_model_yet = [coordinator.schedule(plus_one, args=(tf.constant(1),))
                  for _ in range(2)]
  coordinator.join()
  with strategy.scope():
    w = tf.Variable(0.0)
    optimizer = rudra_tf.StalenessAwareOptimizer(
        tf_keras.optimizers.SGD(0.5))
    optimizer.build([w])
  shard, = strategy.build_shards()
  tokens_before = shard.token_counts()

  @tf.function
  def read_weight():
    return strategy.run(lambda: w * 1.0)
  reads = [coordinator.schedule(read_weight) for _ in range(6)]
  coordinator.join()
  tokens_after = shard.token_counts()

  def replica_step():
    with tf.GradientTape() as tape:
      loss = w * 1.0
    optimizer.apply_gradients([(tape.gradient(loss, w), w)])

  @tf.function
  def train():
    strategy.run(replica_step)
  for _ in range(4):
    coordinator.schedule(train)
  coordinator.join()
  return {"no_model_yet": [int(v.fetch()) for v in no_model_yet],
          "tokens_before": tokens_before, "tokens_after": tokens_after,
          "reads": [float(v.fetch()) for v in reads],
          "w": float(w.numpy()), "report": report_as_dict(strategy)}
