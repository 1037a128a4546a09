"""rudra_tf/strategy.py against real TensorFlow servers: the protocols'
exact counters, placement and transfers, misuse errors.

Every cluster runs in a fresh process (tests/support.py); the scenarios
each test runs are beside it, below the tests.
"""

import numpy as np
import pytest

from tests.cluster_fixtures import (compiled_mlp, connect_cluster,
                                    linear_updates, make_optimizer,
                                    repeated_batches, report_as_dict,
                                    seeded_mlp, step_transfers, synthetic_data)
from tests.support import assert_invariants
from tests.support import run_in_fresh_process


def test_steps_per_execution_counter_lives_on_the_chief():
  # tf_keras reads it on the chief before every closure; the weights and
  # the counter the steps increment stay on the ps tasks.
  result = run_in_fresh_process(counter_placement)
  devices = result["devices"]
  assert devices["steps_per_execution"].startswith("/job:chief/")
  assert devices["train_counter"].startswith("/job:ps/")
  assert {d.split("/device")[0] for d in devices["weights"]} == {
      "/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1"}
  # 7 steps at 3 per closure: 3 + 3 and a last closure of 1, which tf_keras
  # runs by setting the chief's counter to 1 and back to 3.
  assert result["report"]["gradients"] == 7
  assert result["train_counter"] == 7
  assert result["steps_per_execution"] == 3


def test_hardsync_staleness_is_zero_and_odd_step_counts_finish():
  # 2 epochs of 20 steps, an evaluate, then 7 more steps: 47 gradients,
  # never a multiple of λ = 3 at an epoch's end.
  report = run_in_fresh_process(
      fit_and_report, num_learners=3, protocol="hardsync",
      epochs=2, steps=20, evaluate_between=True, more_steps=7)
  assert report["gradients"] == 47
  assert report["histogram"][0] == 47 and report["max"] == 0
  assert report["timestamp"] == 47 // 3 and report["pending"] == 47 % 3
  assert_invariants(report)
  # Token conservation once every step finished: available + held +
  # pending == λ, none held (47 = 15 * 3 + 2 pending: 1 token available).
  assert report["tokens"] == [(1, [0, 0, 0])]


@pytest.mark.parametrize("num_learners,protocol,c", [
    (4, "1-softsync", 4),
    (4, "2-softsync", 2),
    (3, "3-softsync", 1),
    (4, "async", 1),
])
def test_softsync_exact_invariants(num_learners, protocol, c):
  report = run_in_fresh_process(fit_and_report,
                                num_learners=num_learners, protocol=protocol,
                                steps=42)
  print(f"{protocol} λ={num_learners}: mean staleness {report['mean']:.3f}, "
        f"histogram {report['histogram'][:report['max'] + 1].tolist()}")
  assert report["gradients_per_update"] == c
  assert report["gradients"] == 42
  assert_invariants(report)
  assert report["timestamp"] == 42 // c and report["pending"] == 42 % c


def test_unlocked_pulls_still_push_under_the_lock():
  # consistent_pulls=False trades pull consistency for speed; pushes and
  # updates stay locked, so the exact invariants still hold.
  report = run_in_fresh_process(fit_and_report, num_learners=3,
                                protocol="1-softsync", steps=30,
                                consistent_pulls=False)
  assert report["gradients"] == 30
  assert_invariants(report)


def test_max_staleness_drops_and_counts_stale_gradients():
  # async, λ = 4, max_staleness = 1: gradients with σ >= 2 are dropped and
  # counted; each accepted one moves w by -0.1.
  result = run_in_fresh_process(
      linear_updates, num_learners=4, protocol="async",
      lr_policy="none", steps=48, max_staleness=1)
  report = result["report"]
  assert report["dropped"] == report["histogram"][2:].sum()
  assert report["timestamp"] == 48 - report["dropped"]
  assert result["kernel"] == pytest.approx(-0.1 * report["timestamp"],
                                           rel=1e-5)
  assert_invariants(report)


def test_async_fast_path_applies_outside_the_lock_with_exact_counters():
  # consistent_pulls=False: async updates run outside the shard lock; the
  # clock and the counters are still kept under it. Every gradient is 1 and
  # plain SGD adds -α·w(σ) per accepted gradient (an atomic assign_add), so
  # the sum is exact whatever the interleaving: divide_by_staleness with
  # max_staleness = 2 gives w = -0.1 · Σ_{σ<=2} count(σ) / max(σ, 1).
  result = run_in_fresh_process(
      linear_updates, num_learners=4, protocol="async",
      lr_policy="divide_by_staleness", steps=48, max_staleness=2,
      consistent_pulls=False)
  report = result["report"]
  histogram = report["histogram"]
  assert report["gradients"] == 48
  assert report["dropped"] == histogram[3:].sum()
  assert report["timestamp"] == 48 - report["dropped"]
  assert_invariants(report)
  expected = -0.1 * sum(histogram[s] / max(s, 1) for s in range(3))
  assert result["kernel"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("protocol,num_learners,metadata_to_pull", [
    ("async", 1, 0),
    # Hardsync's pull takes a token with the learner and its incarnation.
    ("hardsync", 2, 2)])
def test_a_step_crosses_between_learner_and_ps_in_packed_transfers(
    protocol, num_learners, metadata_to_pull):
  # The MLP has 4 variables on one shard. Unpacked, a step sent each weight
  # to the learner and each gradient, the pulled timestamp and the learner
  # index back (11 transfers); packed: the weights as one tensor, the
  # gradients as one, the push's int64 metadata as one.
  sent = run_in_fresh_process(step_transfers, protocol=protocol,
                              num_learners=num_learners)
  assert len(sent["to_learner"]) == 1, sent
  assert len(sent["to_ps"]) == 2 + metadata_to_pull, sent


def test_two_ps_tasks_spread_and_partitioned_variables_match(tmp_path):
  plain = run_in_fresh_process(two_ps_training, partitioned=False,
                               export_dir=str(tmp_path / "plain"))
  sharded = run_in_fresh_process(two_ps_training, partitioned=True,
                                 export_dir=str(tmp_path / "sharded"))
  plain_tasks = {d.split("/task:")[1][0] for ds in plain["placement"]
                 for d in ds}
  assert plain_tasks == {"0", "1"}, plain["placement"]
  # Slots sit next to their variables.
  assert sorted(plain["slot_devices"]) == sorted(
      d for ds in plain["placement"] for d in ds)
  # The chief holds nothing a learner needs per step: weights, slots,
  # learning rate, counters and protocol state all live on ps tasks.
  for result in (plain, sharded):
    assert all(d.startswith("/job:ps/") for d in result["all_devices"]), (
        result["all_devices"])
  # With the partitioner the first kernel has two parts on different tasks.
  first_kernel = sharded["placement"][0]
  assert len(first_kernel) == 2 and len(set(first_kernel)) == 2
  for a, b in zip(plain["weights"], sharded["weights"]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  assert len(sharded["report"]["shards"]) == 2
  for shard in sharded["report"]["shards"]:
    assert shard["gradients"] == 20 and shard["timestamp"] == 20
  # tf.saved_model.save exports either (tf_keras's .keras and .h5 writers
  # cannot store a partitioned variable, under stock PSS too).
  for result in (plain, sharded):
    np.testing.assert_allclose(result["served"], result["predicted"],
                               atol=1e-6)


def test_concurrent_pushes_keep_exact_invariants():
  # λ = 4 learners push 400 gradients to two shards (kernel on ps:0, bias on
  # ps:1) with 2-softsync. Every update moves each weight by exactly
  # -0.001 * (1/2) * (1 + 1), so the weights count the applied updates: a
  # lost or doubled update would show in them.
  result = run_in_fresh_process(
      linear_updates, num_learners=4, protocol="2-softsync",
      lr_policy="none", steps=400, learning_rate=0.001, num_ps=2)
  report = result["report"]
  assert len({d for d in result["devices"]}) == 2
  for shard in report["shards"]:
    assert shard["gradients"] == 400
  assert_invariants(report)
  kernel_shard, bias_shard = report["shards"]
  assert result["kernel"] == pytest.approx(
      -0.001 * kernel_shard["timestamp"], rel=1e-4)
  assert result["bias"] == pytest.approx(
      -0.001 * bias_shard["timestamp"], rel=1e-4)


def test_misuse_inside_a_live_strategy_gets_clear_errors():
  messages = run_in_fresh_process(errors_with_cluster)
  expected = {
      "wraps_itself": "cannot wrap another",
      "not_an_optimizer": "wraps a tf_keras optimizer such as "
                          "tf_keras.optimizers.SGD or Adam, a legacy one such "
                          "as tf_keras.optimizers.legacy.SGD, or a Keras 3 "
                          "one such as keras.optimizers.SGD; got 'sgd'",
      "bad_lr_policy": "'divide_by_two'",
      "two_optimizers_in_a_step": "Two optimizers applied gradients in one "
                                  "training step",
      "plain_apply_outside_step": "only a tf_keras optimizer's "
                                  "apply_gradients inside a training step",
      "eager_run_that_trains": "an eager strategy.run runs on the chief, "
                               "which is no learner",
      "fit_without_steps": "specify the number of steps",
      "fit_numpy_without_steps": "`steps_per_epoch`",
      "evaluate_without_steps": "specify the number of steps",
      "apply_outside_step": "must run inside a RudraStrategy training step",
  }
  for name, fragment in expected.items():
    assert messages[name] is not None, f"{name}: no error raised"
    assert fragment in messages[name], f"{name}: {messages[name]}"


def test_hardsync_on_two_shards_is_never_stale_and_exact():
  # Each ps task runs its own rounds; learners take their tokens in shard
  # order (taken in any order, this deadlocked). 4 learners, 2 ps tasks,
  # 41 steps: every shard ends at 41 = 10 * 4 + 1 gradients, all σ = 0.
  report = run_in_fresh_process(
      fit_and_report, num_learners=4, num_ps=2,
      protocol="hardsync", steps=41, timeout=300)
  assert len(report["shards"]) == 2
  for shard in report["shards"]:
    assert shard["gradients"] == 41 and shard["max"] == 0
    assert shard["timestamp"] == 10 and shard["pending"] == 1
  assert report["tokens"] == [(3, [0, 0, 0, 0])] * 2
  assert_invariants(report)


def test_backup_hardsync_drops_the_stragglers_late_gradients():
  # λ = 3, "1-backup-hardsync" (c = 2), learner 0 sleeping 0.4 s a step,
  # the others not at all: rounds complete with the two fast learners, and
  # every gradient that lands after its version's round is dropped and
  # counted. Accepted gradients all have σ = 0.
  report = run_in_fresh_process(backup_round_with_a_straggler, steps=30,
                                timeout=300)
  (shard,) = report["shards"]
  assert shard["gradients"] == 30
  assert report["gradients_per_update"] == 2
  assert shard["dropped"] > 0
  assert shard["dropped"] == shard["histogram"][1:].sum()
  assert shard["histogram"][0] == 30 - shard["dropped"]
  assert_invariants(report)
  # The straggler sent few of the 30. At most λ = 3 gradients of a version
  # are delivered and its round takes c = 2, so at most one per completed
  # round is dropped. (Whose depends on who came first: a fast learner may
  # take a token the straggler has not claimed yet, barrier.py.)
  assert shard["learner_gradients"][0] < 10
  assert shard["dropped"] <= shard["timestamp"]
  # Tokens: available + held (a late learner keeps its own) + pending == λ.
  ((available, held),) = report["tokens"]
  assert available + sum(held) + shard["pending"] == 3


def test_strategy_run_variants_run_as_on_stock():
  # tf_keras's own PS tests call strategy.run these ways; stock runs both.
  result = run_in_fresh_process(strategy_run_variants)
  # A tf.function that updates a Mean with 1.0 then reads result() in
  # replica context, scheduled once: 1.0.
  assert result["metric_result"] == 1.0
  # Eagerly on the chief: fn runs there, reading the live weight.
  assert result["eager_on_chief"] == pytest.approx(1.0 + result["kernel_00"])
  # Neither pushed anything.
  assert result["report"]["gradients"] == 0


def test_a_new_model_on_the_strategy_trains_on_shards_of_its_own():
  # Hardsync, λ = 2 (c = 2). Model A: 4 steps, 2 updates. Then model B is
  # built on the same strategy: its 6 steps make a report of its own (6
  # gradients, 3 updates, all σ = 0), and A's weights, retired from the
  # protocol, are left as A's training left them.
  result = run_in_fresh_process(two_models_on_one_strategy)
  assert result["a"]["gradients"] == 4 and result["a"]["timestamp"] == 2
  b = result["b"]
  assert b["gradients"] == 6 and b["timestamp"] == 3
  assert b["histogram"][0] == 6
  assert_invariants(b)
  assert result["a_unchanged_by_b"]
  # Training A again is refused, through its wrapper or a plain optimizer.
  for name in ("a_again_wrapped", "a_again_plain"):
    assert "belongs to a model this RudraStrategy trained before" in \
        result[name], result[name]


# ------------------------------------------------------------- scenarios
def two_models_on_one_strategy():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  _, strategy = connect_cluster(1, 2, "hardsync")
  x, y = synthetic_data()
  model_a = compiled_mlp(strategy, "sgd_momentum", "none")
  model_a.fit(repeated_batches(x, y, 4), epochs=1, steps_per_epoch=4,
              verbose=0)
  result = {"a": report_as_dict(strategy)}
  weights_a = model_a.get_weights()
  model_b = compiled_mlp(strategy, "sgd_momentum", "none", handed="plain")
  model_b.fit(repeated_batches(x, y, 4), epochs=1, steps_per_epoch=6,
              verbose=0)
  result["b"] = report_as_dict(strategy)
  result["a_unchanged_by_b"] = all(
      np.array_equal(before, after)
      for before, after in zip(weights_a, model_a.get_weights()))

  def error_of(fn):
    try:
      fn()
    except (ValueError, tf.errors.OpError) as error:
      return str(error)
    return "no error"

  result["a_again_wrapped"] = error_of(lambda: model_a.fit(
      repeated_batches(x, y, 4), epochs=1, steps_per_epoch=2, verbose=0))
  with strategy.scope():
    model_a.compile(optimizer=tf_keras.optimizers.SGD(0.1),
                    loss="sparse_categorical_crossentropy")
  result["a_again_plain"] = error_of(lambda: model_a.fit(
      repeated_batches(x, y, 4), epochs=1, steps_per_epoch=2, verbose=0))
  return result


def strategy_run_variants():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  _, strategy = connect_cluster(1, 2, "hardsync")
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
      strategy)
  with strategy.scope():
    model = seeded_mlp()
    metric = tf_keras.metrics.Mean()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
  kernel = model.trainable_variables[0]

  @tf.function
  def replica_fn():
    metric.update_state(1.0)
    return metric.result()

  @tf.function
  def worker_fn():
    return strategy.run(replica_fn)

  metric_result = coordinator.schedule(worker_fn)
  coordinator.join()
  eager = strategy.run(lambda: tf.constant(1.0) + kernel[0, 0])
  return {"metric_result": float(metric_result.fetch()),
          "eager_on_chief": float(eager),
          "kernel_00": float(kernel[0, 0]),
          "report": report_as_dict(strategy)}


def counter_placement(steps=7, steps_per_execution=3):
  """Where tf_keras's counters and the weights live; a multi-step fit."""
  _, strategy = connect_cluster(2, 1, "async")
  x, y = synthetic_data()
  model = compiled_mlp(strategy, "sgd_momentum", "none",
                        steps_per_execution=steps_per_execution)
  devices = {"steps_per_execution": model._steps_per_execution.device,  # pylint: disable=protected-access
             "train_counter": model._train_counter.device,  # pylint: disable=protected-access
             "weights": [w.device for w in model.trainable_weights]}
  model.fit(repeated_batches(x, y, 4), epochs=1, steps_per_epoch=steps, verbose=0)
  return {"devices": devices, "report": report_as_dict(strategy),
          "train_counter": int(model._train_counter.numpy()),  # pylint: disable=protected-access
          "steps_per_execution": int(model._steps_per_execution.numpy())}  # pylint: disable=protected-access


def fit_and_report(num_learners, protocol, epochs=1, steps=40, num_ps=1,
                   evaluate_between=False, more_steps=0,
                   consistent_pulls=True):
  """Fits the MLP and returns the staleness report."""
  _, strategy = connect_cluster(num_ps, num_learners, protocol,
                         consistent_pulls=consistent_pulls)
  x, y = synthetic_data()
  model = compiled_mlp(strategy, "sgd_momentum", "divide_by_n")
  dataset = repeated_batches(x, y, 4)
  model.fit(dataset, epochs=epochs, steps_per_epoch=steps, verbose=0)
  if evaluate_between:
    model.evaluate(dataset, steps=5, verbose=0)
  if more_steps:
    model.fit(dataset, epochs=1, steps_per_epoch=more_steps, verbose=0)
  result = report_as_dict(strategy)
  if strategy.protocol.barrier:
    result["tokens"] = [shard.token_counts() for shard in strategy._shards]  # pylint: disable=protected-access
  return result


def backup_round_with_a_straggler(steps):
  """λ = 3 with one backup; learner 0's input sleeps 0.4 s a batch."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from rudra_tf import datasets  # pylint: disable=g-import-not-at-top
  _, strategy = connect_cluster(1, 3, "1-backup-hardsync")
  x, y = synthetic_data()
  model = compiled_mlp(strategy, "sgd_momentum", "none")

  def dataset_fn(context):
    return datasets.with_step_time(
        repeated_batches(x, y, 4).prefetch(1),
        0.4 if context.input_pipeline_id == 0 else 0.0)
  dataset = tf_keras_dataset_creator(dataset_fn)
  model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
  result = report_as_dict(strategy)
  result["tokens"] = [shard.token_counts() for shard in strategy._shards]  # pylint: disable=protected-access
  return result


def tf_keras_dataset_creator(dataset_fn):
  import tf_keras  # pylint: disable=g-import-not-at-top
  return tf_keras.utils.experimental.DatasetCreator(dataset_fn)


def two_ps_training(partitioned, export_dir, steps=20):
  """One learner, two ps tasks, with or without a variable partitioner;
  exports the model with tf.saved_model.save and serves it back."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  partitioner = (tf.distribute.experimental.partitioners.FixedShardsPartitioner(2)
                 if partitioned else None)
  _, strategy = connect_cluster(2, 1, "async", variable_partitioner=partitioner)
  x, y = synthetic_data(features=32)
  with strategy.scope():
    model = seeded_mlp(features=32, hidden=64)
    model.compile(
        optimizer=rudra_tf.StalenessAwareOptimizer(
            make_optimizer("sgd_momentum")),
        loss="sparse_categorical_crossentropy")
  model.fit(repeated_batches(x, y, 8), epochs=1, steps_per_epoch=steps, verbose=0)
  placement = []  # devices of each layer variable's parts
  for layer in model.layers:
    for variable in (layer.kernel, layer.bias):
      if isinstance(variable, tf.__internal__.distribute.ShardedVariable):
        placement.append([part.device for part in variable.variables])
      else:
        placement.append([variable.device])
  slot_devices = [v.device for v in model.optimizer.inner_optimizer.variables
                  if v.name.startswith("m/")]
  optimizer = model.optimizer
  every_variable = (list(model.variables) + list(optimizer.variables)
                    + [optimizer.inner_optimizer.iterations,
                       optimizer.inner_optimizer._learning_rate])  # pylint: disable=protected-access
  full_weights = [tf.convert_to_tensor(v).numpy() for layer in model.layers
                  for v in (layer.kernel, layer.bias)]
  tf.saved_model.save(model, export_dir)
  served = tf.saved_model.load(export_dir)(x[:16]).numpy()
  return {"weights": full_weights, "placement": placement,
          "served": served, "predicted": model.predict(x[:16], verbose=0),
          "slot_devices": slot_devices, "report": report_as_dict(strategy),
          "all_devices": sorted({
              part.device for v in every_variable for part in (
                  v.variables if isinstance(
                      v, tf.__internal__.distribute.ShardedVariable)
                  else [v])})}


def errors_with_cluster():
  """Misuse that needs a live strategy: each returns its error message."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  _, strategy = connect_cluster(1, 1, "async")
  x, y = synthetic_data()
  messages = {}

  def capture(name, fn):
    try:
      fn()
      messages[name] = None
    except (ValueError, TypeError, RuntimeError) as error:
      messages[name] = f"{type(error).__name__}: {error}"

  with strategy.scope():
    plain_model = seeded_mlp()
    plain_model.compile(optimizer=tf_keras.optimizers.SGD(0.1),
                        loss="sparse_categorical_crossentropy")
    capture("wraps_itself", lambda: rudra_tf.StalenessAwareOptimizer(
        rudra_tf.StalenessAwareOptimizer(tf_keras.optimizers.SGD(0.1))))
    capture("not_an_optimizer",
            lambda: rudra_tf.StalenessAwareOptimizer("sgd"))
    capture("bad_lr_policy", lambda: rudra_tf.StalenessAwareOptimizer(
        tf_keras.optimizers.SGD(0.1), lr_policy="divide_by_two"))
    wrapper = rudra_tf.StalenessAwareOptimizer(tf_keras.optimizers.SGD(0.1))
    first, second = tf_keras.optimizers.SGD(0.1), tf_keras.optimizers.Adam()
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
      strategy)
  kernel, bias = plain_model.trainable_variables[:2]

  @tf.function
  def two_optimizers():
    def step():
      first.apply_gradients([(tf.ones_like(kernel), kernel)])
      second.apply_gradients([(tf.ones_like(bias), bias)])
    strategy.run(step)

  capture("fit_without_steps", lambda: plain_model.fit(
      repeated_batches(x, y, 4), epochs=1, verbose=0))
  capture("fit_numpy_without_steps", lambda: plain_model.fit(
      x, y, batch_size=4, epochs=1, verbose=0))
  capture("evaluate_without_steps", lambda: plain_model.evaluate(
      repeated_batches(x, y, 4), verbose=0))
  variable = plain_model.trainable_variables[0]
  capture("apply_outside_step", lambda: wrapper.apply_gradients(
      [(tf.zeros(variable.shape), variable)]))
  capture("plain_apply_outside_step", lambda: first.apply_gradients(
      [(tf.ones_like(kernel), kernel)]))
  capture("eager_run_that_trains", lambda: strategy.run(
      lambda: first.apply_gradients([(tf.ones_like(kernel), kernel)])))

  def schedule_and_join():
    coordinator.schedule(two_optimizers)
    coordinator.join()

  capture("two_optimizers_in_a_step", schedule_and_join)
  return messages
