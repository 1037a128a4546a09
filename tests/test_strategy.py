"""RudraStrategy + StalenessAwareOptimizer against real TensorFlow servers.

Every test runs its cluster in a fresh process (tests/support.py).
"""

import concurrent.futures

import numpy as np
import pytest

from tests import scenarios
from tests.support import assert_invariants
from tests.support import run_in_fresh_process


# ------------------------------------------------------------------ oracle
@pytest.mark.parametrize("optimizer", [
    "sgd_momentum", "adam", "sgd_schedule", "sgd_weight_decay_clipnorm",
    "adamw_global_clipnorm"])
def test_one_learner_async_equals_plain_keras(optimizer):
  result = run_in_fresh_process(scenarios.one_learner_matches_plain,
                                optimizer=optimizer)
  assert result["report"]["timestamp"] == 30
  assert result["report"]["max"] == 0
  for rudra, plain in zip(result["rudra"], result["plain"]):
    np.testing.assert_allclose(rudra, plain, rtol=1e-5, atol=1e-7)
  # And training moved the weights: the comparison is not vacuous.
  initial = scenarios._mlp().get_weights()  # pylint: disable=protected-access
  assert not np.allclose(result["plain"][0], initial[0], atol=1e-3)


def test_mixed_bfloat16_one_learner_equals_plain_keras():
  # bfloat16 compute on the learner, float32 weights and updates on the ps
  # (mixed_float16 needs loss scaling, which tf_keras refuses under any
  # parameter-server strategy).
  result = run_in_fresh_process(scenarios.one_learner_matches_plain,
                                optimizer="sgd_momentum",
                                dtype_policy="mixed_bfloat16")
  assert result["compute_dtype"] == "bfloat16"
  assert result["report"]["timestamp"] == 30
  for rudra, plain in zip(result["rudra"], result["plain"]):
    assert rudra.dtype == np.float32
    np.testing.assert_allclose(rudra, plain, rtol=1e-5, atol=1e-7)


def test_steps_per_execution_counter_lives_on_the_chief():
  # tf_keras reads it on the chief before every closure; the weights and
  # the counter the steps increment stay on the ps tasks.
  result = run_in_fresh_process(scenarios.counter_placement)
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


# ---------------------------------------------------------------- hardsync
def test_hardsync_staleness_is_zero_and_odd_step_counts_finish():
  # 2 epochs of 20 steps, an evaluate, then 7 more steps: 47 gradients,
  # never a multiple of λ = 3 at an epoch's end.
  report = run_in_fresh_process(
      scenarios.fit_and_report, num_learners=3, protocol="hardsync",
      epochs=2, steps=20, evaluate_between=True, more_steps=7)
  assert report["gradients"] == 47
  assert report["histogram"][0] == 47 and report["max"] == 0
  assert report["timestamp"] == 47 // 3 and report["pending"] == 47 % 3
  assert_invariants(report)
  # Token conservation once every step finished: available + held +
  # pending == λ, none held (47 = 15 * 3 + 2 pending: 1 token available).
  assert report["tokens"] == [(1, [0, 0, 0])]


# ---------------------------------------------------------------- softsync
@pytest.mark.parametrize("num_learners,protocol,c", [
    (4, "1-softsync", 4),
    (4, "2-softsync", 2),
    (3, "3-softsync", 1),
    (4, "async", 1),
])
def test_softsync_exact_invariants(num_learners, protocol, c):
  report = run_in_fresh_process(scenarios.fit_and_report,
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
  report = run_in_fresh_process(scenarios.fit_and_report, num_learners=3,
                                protocol="1-softsync", steps=30,
                                consistent_pulls=False)
  assert report["gradients"] == 30
  assert_invariants(report)


# -------------------------------------------------------- lr_policy values
def test_divide_by_n_update_matches_hand_computation():
  # λ = 4, 2-softsync: c = 2, α = 0.1 / 2. Each update is
  # w -= 0.05 * (1/2) * (1 + 1) = 0.05; 30 gradients make 15 updates.
  result = run_in_fresh_process(
      scenarios.linear_updates, num_learners=4, protocol="2-softsync",
      lr_policy="divide_by_n", steps=30)
  report = result["report"]
  assert report["timestamp"] == 15 and report["pending"] == 0
  assert result["kernel"] == pytest.approx(-0.75, rel=1e-6)
  assert result["bias"] == pytest.approx(-0.75, rel=1e-6)


def test_divide_by_staleness_update_matches_hand_computation():
  # async (c = 1), α0 = 0.1: each gradient of staleness σ moves w by
  # -0.1 / max(σ, 1); the recorded histogram says how many had each σ.
  result = run_in_fresh_process(
      scenarios.linear_updates, num_learners=3, protocol="async",
      lr_policy="divide_by_staleness", steps=36)
  histogram = result["report"]["histogram"]
  assert histogram.sum() == 36
  expected = -0.1 * sum(count / max(sigma, 1)
                        for sigma, count in enumerate(histogram))
  print("histogram", histogram[:6].tolist(), "expected w", expected)
  assert result["kernel"] == pytest.approx(expected, rel=1e-5)


def test_schedule_is_multiplied_by_the_policy():
  # async with λ = 2, divide_by_n: α(t) = schedule(t) / 2 with schedule
  # 0.1 for t <= 4, 0.05 for 4 < t <= 8, 0.02 after; 16 updates:
  # w = -(5 * 0.1 + 4 * 0.05 + 7 * 0.02) / 2 = -0.42.
  result = run_in_fresh_process(
      scenarios.linear_updates, num_learners=2, protocol="async",
      lr_policy="divide_by_n", steps=16,
      schedule=([4, 8], [0.1, 0.05, 0.02]))
  assert result["report"]["timestamp"] == 16
  assert result["kernel"] == pytest.approx(-0.42, rel=1e-6)


def test_a_learning_rate_callback_reaches_the_ps_updates():
  # tf_keras's LearningRateScheduler sets the wrapper's rate between epochs;
  # async, λ = 2, divide_by_n: 6 updates at 0.1 / 2, then 6 at 0.04 / 2:
  # w = -(6 * 0.05 + 6 * 0.02) = -0.42.
  result = run_in_fresh_process(
      scenarios.linear_updates, num_learners=2, protocol="async",
      lr_policy="divide_by_n", steps=6, epoch_learning_rates=[0.1, 0.04])
  assert result["report"]["timestamp"] == 12
  assert result["logged_rates"] == pytest.approx([0.1, 0.04])
  assert result["kernel"] == pytest.approx(-0.42, rel=1e-6)


def test_max_staleness_drops_and_counts_stale_gradients():
  # async, λ = 4, max_staleness = 1: gradients with σ >= 2 are dropped and
  # counted; each accepted one moves w by -0.1.
  result = run_in_fresh_process(
      scenarios.linear_updates, num_learners=4, protocol="async",
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
      scenarios.linear_updates, num_learners=4, protocol="async",
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


# --------------------------------------------------------------- placement
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
  sent = run_in_fresh_process(scenarios.step_transfers, protocol=protocol,
                              num_learners=num_learners)
  assert len(sent["to_learner"]) == 1, sent
  assert len(sent["to_ps"]) == 2 + metadata_to_pull, sent


def test_two_ps_tasks_spread_and_partitioned_variables_match(tmp_path):
  plain = run_in_fresh_process(scenarios.two_ps_training, partitioned=False,
                               export_dir=str(tmp_path / "plain"))
  sharded = run_in_fresh_process(scenarios.two_ps_training, partitioned=True,
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


# ------------------------------------------------------------------ stress
def test_concurrent_pushes_keep_exact_invariants():
  # λ = 4 learners push 400 gradients to two shards (kernel on ps:0, bias on
  # ps:1) with 2-softsync. Every update moves each weight by exactly
  # -0.001 * (1/2) * (1 + 1), so the weights count the applied updates: a
  # lost or doubled update would show in them.
  result = run_in_fresh_process(
      scenarios.linear_updates, num_learners=4, protocol="2-softsync",
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


# --------------------------------------------------------------- callbacks
def test_fit_with_validation_data_and_epoch_callbacks(tmp_path):
  result = run_in_fresh_process(scenarios.standard_callbacks,
                                directory=str(tmp_path))
  history = result["history"]
  assert sorted(history) == ["accuracy", "loss", "lr", "val_accuracy",
                             "val_loss"]
  assert all(len(values) == 3 for values in history.values())
  assert all(np.isfinite(v) for v in history["val_loss"])
  # ReduceLROnPlateau: the first epoch sets its best loss, every later one
  # is a plateau and halves the rate (logged before the halving).
  assert history["lr"] == pytest.approx([0.05, 0.05, 0.025])
  assert result["learning_rate"] == pytest.approx(0.0125)
  assert result["report"]["gradients"] == 3 * 4
  assert {"epoch_1.keras", "epoch_2.keras", "epoch_3.keras",
          "best.weights.h5", "log.csv", "tb"} <= set(result["files"])
  with open(tmp_path / "log.csv") as log:
    assert len(log.read().strip().splitlines()) == 1 + 3


@pytest.mark.parametrize("protocol", ["hardsync", "async"])
def test_staleness_logger_adds_each_epochs_counters(tmp_path, protocol):
  result = run_in_fresh_process(scenarios.staleness_logged,
                                directory=str(tmp_path), protocol=protocol)
  history, report = result["history"], result["report"]
  assert history["gradients"] == [10, 10, 10]
  assert sum(history["updates"]) == report["timestamp"]
  assert history["dropped"] == [0, 0, 0]
  # The epochs' staleness adds up to the whole run's (histogram below its
  # overflow bin: every mean is exact).
  total = sum(m * g for m, g in zip(history["staleness_mean"],
                                    history["gradients"]))
  assert total == pytest.approx(report["mean"] * report["gradients"])
  assert max(history["staleness_max"]) == report["max"]
  if protocol == "hardsync":
    assert report["max"] == 0 and history["updates"] == [3, 3, 4]
  else:  # c = 1 with 3 learners: some gradients are stale
    assert history["updates"] == [10, 10, 10] and report["max"] > 0
  with open(tmp_path / "log.csv") as log:
    header = log.readline().strip().split(",")
  assert {"staleness_mean", "staleness_max", "updates"} <= set(header)


# -------------------------------------------------------------- checkpoint
def test_checkpoint_restores_weights_slots_timestamp_and_histogram(tmp_path):
  path = str(tmp_path / "ckpt")
  saved = run_in_fresh_process(scenarios.checkpoint_round, path=path,
                               restore=False)
  restored = run_in_fresh_process(scenarios.checkpoint_round, path=path,
                                  restore=True)
  assert saved["report"]["pending"] == 1  # 7 gradients, c = 2
  for key in ("weights", "slots", "accumulators"):
    assert len(saved[key]) == len(restored[key]) > 0
    for a, b in zip(saved[key], restored[key]):
      np.testing.assert_array_equal(a, b)
  assert np.abs(saved["accumulators"][0]).sum() > 0  # a pending gradient
  for field in ("timestamp", "gradients", "pending", "max", "mean"):
    assert saved["report"][field] == restored["report"][field]
  np.testing.assert_array_equal(saved["report"]["histogram"],
                                restored["report"]["histogram"])
  after = restored["after_more_training"]
  assert after["gradients"] == 14 and after["timestamp"] == 7
  assert_invariants(after)


# ------------------------------------------------------------------ inputs
def test_fit_evaluate_predict_with_every_input_kind():
  result = run_in_fresh_process(scenarios.input_kinds)
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


def test_misuse_inside_a_live_strategy_gets_clear_errors():
  messages = run_in_fresh_process(scenarios.errors_with_cluster)
  expected = {
      "inner_created_outside_scope": "inside `with strategy.scope():`",
      "wraps_itself": "cannot wrap another",
      "legacy_optimizer": "wraps a tf_keras optimizer",
      "bad_lr_policy": "'divide_by_two'",
      "plain_optimizer_fit": "StalenessAwareOptimizer(your_optimizer)",
      "fit_without_steps": "specify the number of steps",
      "fit_numpy_without_steps": "`steps_per_epoch`",
      "evaluate_without_steps": "specify the number of steps",
      "apply_outside_step": "must run inside a RudraStrategy training step",
  }
  for name, fragment in expected.items():
    assert messages[name] is not None, f"{name}: no error raised"
    assert fragment in messages[name], f"{name}: {messages[name]}"


@pytest.mark.parametrize("protocol,runs", [("async", 1), ("hardsync", 3)])
def test_a_learner_whose_data_runs_out_gets_a_clear_error(protocol, runs):
  # TF alone ends such a fit with a bare CancelledError (stock PSS too).
  # Hardsync: TF cancels the other closures and waits for them; without
  # RudraCoordinator opening the barriers meanwhile, a pull waiting for a
  # round a cancelled closure left short hung (2 of 9 such runs side by
  # side), so three run side by side here.
  with concurrent.futures.ThreadPoolExecutor(runs) as pool:
    results = list(pool.map(
        lambda _: run_in_fresh_process(scenarios.exhausted_input,
                                       protocol=protocol, timeout=150),
        range(runs)))
  for result in results:
    assert result["error"] is not None, "fit did not fail"
    assert result["error"].startswith(
        "The dataset of learner 0 ran out of data.")
    assert "with .repeat() and give fit steps_per_epoch" in result["error"]
    # The counters stay exact through the failed fit, and a new fit trains
    # on (hardsync: in exact rounds again, every new gradient fresh).
    assert_invariants(result["report"])
    retry = result["retry"]
    assert retry["gradients"] == result["report"]["gradients"] + 9
    assert_invariants(retry)
    if protocol == "hardsync":
      new = retry["histogram"] - result["report"]["histogram"]
      assert new[0] == 9 and new.sum() == 9


def test_a_leftover_pull_of_a_failed_fit_takes_nothing_from_the_next():
  # λ = 2: learners 0 and 1 hold the round's two tokens; a third pull
  # (learner 0, incarnation 0) waits on the ps, as a step of a failed fit
  # that TF's cancellation did not reach can. Restoring the barriers gives
  # every learner a new incarnation, refills 2 tokens and rings 2 wake-ups:
  # the leftover wakes, sees its incarnation is dead, takes nothing and
  # passes its wake-up on. The next round (2 steps, lr 0.5, loss = w) then
  # completes: one update, w = -0.5, both gradients fresh.
  result = run_in_fresh_process(scenarios.leftover_pull_after_failed_fit,
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
  result = run_in_fresh_process(scenarios.leftover_pull_after_failed_fit,
                                retire=False, round_wait_s=15, timeout=200)
  assert result["leftover_ended"]
  assert result["after"] == (1, [1, 0])
  assert not result["round_finished"]


def test_each_learner_gets_its_own_input_context():
  result = run_in_fresh_process(scenarios.learner_input_contexts,
                                num_learners=3)
  assert sorted(result["contexts"]) == [(3, 0), (3, 1), (3, 2)]
  assert result["finite"] and result["report"]["gradients"] == 12


# ------------------------------------------------------ idempotent pushes
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
      scenarios.rerun_closures, protocol=protocol,
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
      scenarios.rerun_closures, steps=2, runs_per_step=3, reruns=(2,))
  report = result["report"]
  assert result["limit"] == 3
  assert report["gradients"] == 6 and report["duplicates"] == 3
  assert result["w"] == pytest.approx(-0.6, rel=1e-6)


def test_a_closure_of_unknown_step_count_is_not_deduplicated():
  # Two strategy.run calls per closure: the limit cannot be known, so no
  # push is refused (documented): the re-run's 2 gradients are applied.
  result = run_in_fresh_process(
      scenarios.rerun_closures, steps=2, runs_per_step="two_runs",
      reruns=(2,))
  report = result["report"]
  assert result["limit"] == -1
  assert report["gradients"] == 6 and report["duplicates"] == 0
  assert result["w"] == pytest.approx(-0.6, rel=1e-6)


def test_hardsync_on_two_shards_is_never_stale_and_exact():
  # Each ps task runs its own rounds; learners take their tokens in shard
  # order (taken in any order, this deadlocked). 4 learners, 2 ps tasks,
  # 41 steps: every shard ends at 41 = 10 * 4 + 1 gradients, all σ = 0.
  report = run_in_fresh_process(
      scenarios.fit_and_report, num_learners=4, num_ps=2,
      protocol="hardsync", steps=41, timeout=300)
  assert len(report["shards"]) == 2
  for shard in report["shards"]:
    assert shard["gradients"] == 41 and shard["max"] == 0
    assert shard["timestamp"] == 10 and shard["pending"] == 1
  assert report["tokens"] == [(3, [0, 0, 0, 0])] * 2
  assert_invariants(report)


# ------------------------------------------------------------- save, load
@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp("saved_models"))
  saved = run_in_fresh_process(scenarios.saved_model_round,
                               directory=directory)
  # 7 hardsync gradients at c = 2: 3 updates and one pending gradient,
  # whose accumulator the saved state must carry.
  assert saved["report"]["timestamp"] == 3
  assert saved["report"]["pending"] == 1
  return directory, saved


def load_saved(directory, load_format):
  """Loads what `saved_models` saved, in a new cluster, and trains on."""
  loaded = run_in_fresh_process(scenarios.saved_model_round,
                                directory=directory, load_format=load_format)
  assert "error" not in loaded, loaded.get("error")
  return loaded


@pytest.mark.parametrize("save_format", ["keras", "h5"])
def test_a_saved_model_resumes_in_a_new_cluster(saved_models, save_format):
  directory, saved = saved_models
  loaded = load_saved(directory, save_format)
  assert loaded["optimizer_class"] == "StalenessAwareOptimizer"
  for key in ("weights", "optimizer"):
    assert len(loaded[key]) == len(saved[key]) > 0
    for a, b in zip(saved[key], loaded[key]):
      np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(loaded["predictions"], saved["predictions"],
                             atol=1e-6)
  for field in ("timestamp", "gradients", "pending", "mean", "max"):
    assert loaded["report"][field] == saved["report"][field], field
  # 3 more hardsync gradients: the pending one completes a round, and the
  # barrier's tokens were refilled for the loaded state (no deadlock).
  after = loaded["after_more_training"]
  assert after["gradients"] == 10 and after["timestamp"] == 5
  assert after["max"] == 0
  assert_invariants(after)


def test_a_savedmodel_keeps_the_weights_and_a_fresh_optimizer(saved_models):
  # As in plain tf_keras, the SavedModel format restores no optimizer state.
  directory, saved = saved_models
  loaded = load_saved(directory, "savedmodel")
  assert loaded["optimizer_class"] == "StalenessAwareOptimizer"
  for a, b in zip(saved["weights"], loaded["weights"]):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(loaded["predictions"], saved["predictions"],
                             atol=1e-6)
  assert loaded["report"]["gradients"] == loaded["report"]["timestamp"] == 0
  after = loaded["after_more_training"]
  assert after["gradients"] == 3 and after["timestamp"] == 1
  assert_invariants(after)


def test_a_model_saved_before_training_loads_and_trains(saved_models):
  # Its optimizer was never built: nothing to restore, nothing refused.
  directory, _ = saved_models
  loaded = load_saved(directory, "untrained")
  for a, b in zip(loaded["weights"], scenarios._mlp().get_weights()):  # pylint: disable=protected-access
    np.testing.assert_array_equal(a, b)
  assert loaded["report"]["gradients"] == 0
  after = loaded["after_more_training"]
  assert after["gradients"] == 3 and after["timestamp"] == 1
  assert_invariants(after)


def test_a_saved_model_refuses_a_protocol_it_does_not_fit(saved_models):
  directory, _ = saved_models
  result = run_in_fresh_process(scenarios.saved_model_round,
                                directory=directory, load_format="keras",
                                protocol="async")
  assert "holds 1 pending gradients; async here updates after c = 1" in \
      result["error"]
  assert "compile=False" in result["error"]


def test_a_saved_model_loads_without_a_cluster_for_inference(saved_models):
  directory, saved = saved_models
  for name in scenarios.SAVE_FORMATS.values():
    path = f"{directory}/{name}"
    loaded = run_in_fresh_process(scenarios.load_without_cluster, path=path,
                                  compile_model=False)
    np.testing.assert_allclose(loaded["predictions"], saved["predictions"],
                               atol=1e-6)
  refused = run_in_fresh_process(scenarios.load_without_cluster,
                                 path=f"{directory}/model.keras",
                                 compile_model=True)
  assert "pass compile=False to tf_keras.models.load_model" in \
      refused["error"]
