"""The simulator: protocol trajectories by hand, invariants, and an oracle."""

import numpy as np
import pytest

from rudra_tf import protocol as protocol_lib
from rudra_tf import simulate


def server(protocol, num_learners, **kwargs):
  return simulate.ProtocolServer(
      protocol_lib.parse_protocol(protocol, num_learners), **kwargs)


def staleness(pushes):
  return [s for _, _, s in pushes]


def tiny_problem(train_size):
  """Synthetic 8x8 images in 4 classes, and a small MLP builder."""
  import models  # pylint: disable=g-import-not-at-top
  from rudra_tf import datasets  # pylint: disable=g-import-not-at-top
  data = datasets.load_synthetic(train_size=train_size, test_size=32,
                                 image_shape=(8, 8, 1), num_classes=4)
  return data, lambda: models.build_model("mlp", (8, 8, 1), 4, hidden=16)


def plain_sgd(model_fn, seed, learning_rate, x, y, batch_size):
  """Plain tf_keras SGD(momentum 0.9) over x, y in order, initialized as the
  simulator initializes its master model (the first model built)."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  tf_keras.utils.set_random_seed(seed)
  reference = model_fn()
  model_fn()  # the simulator builds its worker copy second
  reference.compile(
      optimizer=tf_keras.optimizers.SGD(learning_rate, momentum=0.9),
      loss="sparse_categorical_crossentropy")
  reference.fit(x, y, batch_size=batch_size, shuffle=False, epochs=1,
                verbose=0)
  return reference


def assert_same_weights(simulated_weights, reference, atol):
  for simulated, plain in zip(simulated_weights, reference.get_weights()):
    np.testing.assert_allclose(simulated, plain, rtol=1e-5, atol=atol)


def test_two_softsync_trajectory_by_hand():
  # Worked out in simulate.py's docstring: versions 0,0,0,0 pulled at t=0;
  # pushes at t=1 have σ = 0,0,1,1; from t=2 on, σ = 2,1,2,1.
  ps = server("2-softsync", 4)
  pushes = simulate.run_protocol(ps, 16)
  assert staleness(pushes) == [0, 0, 1, 1] + [2, 1, 2, 1] * 3
  assert [learner for _, learner, _ in pushes[:8]] == [0, 1, 2, 3] * 2
  assert (ps.timestamp, ps.pending, ps.received) == (8, 0, 16)


def test_hardsync_is_never_stale_and_ends_with_a_partial_round():
  ps = server("hardsync", 3)
  pushes = simulate.run_protocol(ps, 10)
  assert staleness(pushes) == [0] * 10
  assert (ps.timestamp, ps.pending) == (3, 1)  # 10 = 3 * 3 + 1
  assert ps.tokens == 3 - 1 - 2  # one pending pull, two waiting learners


def test_async_staleness_settles_at_lambda_minus_one():
  pushes = simulate.run_protocol(server("async", 4), 12)
  assert staleness(pushes) == [0, 1, 2, 3] + [3] * 8


def test_a_gap_between_push_and_pull_lowers_staleness():
  # async, λ = 2, steps of 1 and a gap of 0.5 after each push. Both pull v0
  # at t=0; at t=1 learner 0 pushes (σ=0, v1), learner 1 (σ=1, v2); both
  # pull v2 at t=1.5 and push at t=2.5 with σ = 0 and 1 again. Without the
  # gap learner 0 pulls v1 at t=1 and every later push has σ = 1.
  gapped = simulate.run_protocol(server("async", 2), 6,
                                 simulate.SpeedModel(gap=0.5))
  assert staleness(gapped) == [0, 1] * 3
  assert [t for t, _, _ in gapped] == [1.0, 1.0, 2.5, 2.5, 4.0, 4.0]
  assert staleness(simulate.run_protocol(server("async", 2), 6)) == [
      0, 1, 1, 1, 1, 1]


def test_speed_model_from_step_times():
  assert simulate.SpeedModel.from_step_times([100, 100, 100]).kind == "equal"
  straggler = simulate.SpeedModel.from_step_times([400, 100, 100], gap=0.1)
  assert (straggler.kind, straggler.straggler_factor, straggler.gap) == (
      "straggler", 4.0, 0.1)
  with pytest.raises(ValueError, match="neither equal nor one straggler"):
    simulate.SpeedModel.from_step_times([100, 200, 300])
  with pytest.raises(ValueError, match="must be > 0"):
    simulate.SpeedModel.from_step_times([0, 100])


# A traced async run of λ = 2 (push_trace.py lines; times in s): both pull
# version 0 at 0; learner 1 pushes at 0.5 (σ 0) and pulls again at 1.0,
# learner 0 pushes at 1.0 (σ 1) and pulls at once; learner 1 pushes at 1.5
# (σ 0), learner 0 at 2.0 (σ 1). Steps: learner 0 (1.0, gap 0), (1.0, -);
# learner 1 (0.5, gap 0.5), (0.5, -); the median step is 0.75 s.
TRACE_LAMBDA_2 = """pull 0 0 0.0
pull 1 0 0.0
push 1 0 0 1 0.5
push 0 0 1 1 1.0
pull 0 2 1.0
pull 1 2 1.0
push 1 2 0 1 1.5
push 0 2 1 1 2.0
"""


def traced(kind, text=TRACE_LAMBDA_2, seed=0):
  from rudra_tf import push_trace  # pylint: disable=g-import-not-at-top
  return simulate.SpeedModel.from_trace(
      push_trace.parse(text.splitlines()), kind, seed=seed)


def test_replay_plays_the_traced_steps_in_median_step_units():
  speed = traced("replay")
  flat = [[value for pair in learner for value in pair]
          for learner in speed.traced_steps]
  assert flat[0] == pytest.approx([4 / 3, 0.0, 4 / 3, 0.0])
  assert flat[1] == pytest.approx([2 / 3, 2 / 3, 2 / 3, 0.0])
  assert speed.traced_starts == (0.0, 0.0)
  # The same pushes as traced, in the same order, at time / 0.75; the
  # replay then starts over with each learner's first step.
  pushes = simulate.run_protocol(server("async", 2), 4, speed)
  assert [(learner, s) for _, learner, s in pushes] == [
      (1, 0), (0, 1), (1, 0), (0, 1)]
  assert [t for t, _, _ in pushes] == pytest.approx(
      [0.5 / 0.75, 1.0 / 0.75, 1.5 / 0.75, 2.0 / 0.75])


def test_replay_starts_each_learner_at_its_traced_first_pull():
  # Learner 1 first pulls 0.75 s (one median step) after learner 0.
  speed = traced("replay", """pull 0 0 5.0
push 0 0 0 1 5.75
pull 1 1 5.75
push 1 1 0 1 6.5
""")
  assert speed.traced_starts == (0.0, 1.0)
  # Learner 1 pulls version 1 at t = 1, just after learner 0's push, and
  # pushes at 2; learner 0 replays its one step again (pull v1 at 1, push
  # at 2, first: it was scheduled first), so learner 1's σ is 1.
  pushes = simulate.run_protocol(server("async", 2), 3, speed)
  assert [(t, learner, s) for t, learner, s in pushes] == [
      (1.0, 0, 0), (2.0, 0, 0), (2.0, 1, 1)]


def test_measured_draws_each_learners_own_steps():
  speed = traced("measured", seed=3)
  rng = np.random.default_rng(0)
  draws = {learner: {tuple(np.round(speed.draw(learner, k, rng), 6))
                     for k in range(200)} for learner in (0, 1)}
  assert draws == {0: {(1.333333, 0.0)},
                   1: {(0.666667, 0.666667), (0.666667, 0.0)}}
  # λ = 4 on a λ = 2 trace: learner 3 plays learner 1's steps.
  assert speed.draw(3, 0, rng)[0] == pytest.approx(2 / 3)


def test_traced_speed_models_need_a_trace_of_every_learner():
  with pytest.raises(ValueError, match="learners 0..λ-1; it has pushes of "
                     r"learners \[0, 2\]"):
    traced("replay", "pull 0 0 0\npush 0 0 0 1 1\npull 2 0 0\n"
           "push 2 0 1 1 1\n")
  with pytest.raises(ValueError, match="plays each of the trace's 2 "
                     "learners once; this run has λ = 3"):
    simulate.run_protocol(server("async", 3), 1, traced("replay"))
  with pytest.raises(ValueError, match="Unknown traced speed model 'equal'"):
    traced("equal")
  with pytest.raises(ValueError, match="build it from a push trace"):
    simulate.SpeedModel("replay")
  with pytest.raises(ValueError, match="traced steps belong to"):
    simulate.SpeedModel("equal", traced_steps=(((1.0, 0.0),),))


def test_backup_hardsync_trajectory_by_hand():
  # λ = 4, one backup (c = 3), equal speeds, ties to the lower index: at
  # t = 1 learners 0, 1, 2 complete round 1 and pull version 1; learner 3's
  # gradient of version 0 is late (σ = 1, dropped) and it pulls version 1
  # with the token it kept. Every round repeats this.
  ps = server("1-backup-hardsync", 4)
  pushes = simulate.run_protocol(ps, 12)
  assert staleness(pushes) == [0, 0, 0, 1] * 3
  assert [learner for _, learner, _ in pushes] == [0, 1, 2, 3] * 3
  assert [t for t, _, _ in pushes] == [1.0] * 4 + [2.0] * 4 + [3.0] * 4
  assert (ps.timestamp, ps.pending, ps.dropped) == (3, 0, 3)


def test_backup_hardsync_does_not_wait_for_a_straggler():
  # λ = 4, learner 0 four times slower. Hardsync's rounds take 4 time units
  # each; with one backup, learners 1-3 complete a round each time unit and
  # the straggler's gradients (σ = 3 or 4 when they land) are all dropped.
  straggler = simulate.SpeedModel("straggler", straggler_factor=4.0)
  hard = simulate.run_protocol(server("hardsync", 4), 80, straggler)
  ps = server("1-backup-hardsync", 4)
  backup = simulate.run_protocol(ps, 80, straggler)
  assert hard[-1][0] == pytest.approx(80 / 4 * 4.0)
  # 13 pushes per 4 time units (12 from the fast three, 1 late): 78 by
  # t = 24, and the 79th and 80th at t = 25.
  assert backup[-1][0] == pytest.approx(25.0)
  late = [s for _, learner, s in backup if learner == 0]
  assert ps.dropped == len(late) == 6 and min(late) >= 3
  assert ps.histogram[0] == ps.received - ps.dropped  # accepted: σ = 0


@pytest.mark.parametrize("protocol,num_learners", [
    ("hardsync", 4), ("1-softsync", 4), ("2-softsync", 5), ("async", 3),
    ("1-backup-hardsync", 4), ("2-backup-hardsync", 5)])
@pytest.mark.parametrize("seed", range(4))
def test_invariants_under_random_speeds(protocol, num_learners, seed):
  ps = server(protocol, num_learners, max_staleness=3)
  speed = simulate.SpeedModel("random", jitter=0.9, seed=seed,
                              gap=0.3 * (seed % 2))
  simulate.run_protocol(ps, 157, speed)
  c = ps.protocol.gradients_per_update
  assert ps.timestamp * c + ps.pending == ps.received - ps.dropped
  assert ps.received == 157 == ps.histogram.sum()
  if ps.protocol.backup:  # a late gradient is dropped whatever its σ
    assert ps.dropped == ps.histogram[1:].sum() > 0
  else:
    assert ps.dropped == ps.histogram[4:].sum()
  if protocol == "hardsync":
    assert ps.histogram[0] == 157


def test_normal_step_times_have_the_jitter_as_their_spread():
  # N(1, 0.2): over 4000 draws the mean is 1 and the standard deviation
  # 0.2 within sampling error; no draw is below the floor.
  rng = np.random.default_rng(0)
  speed = simulate.SpeedModel("normal", jitter=0.2)
  times = np.array([speed.step_time(0, rng) for _ in range(4000)])
  assert times.mean() == pytest.approx(1.0, abs=0.02)
  assert times.std() == pytest.approx(0.2, abs=0.01)
  wide = simulate.SpeedModel("normal", jitter=0.9)
  assert min(wide.step_time(0, rng) for _ in range(2000)) == (
      simulate.MIN_NORMAL_STEP)
  # Async under normal jitter: σ spreads around λ − 1 = 3, both ways.
  ps = server("async", 4)
  simulate.run_protocol(ps, 400, simulate.SpeedModel("normal", jitter=0.3))
  assert ps.histogram[2] > 0 and ps.histogram[4] > 0
  assert ps.received == 400 == ps.histogram.sum()


def test_runs_are_deterministic_for_a_seed():
  def trace(seed):
    return simulate.run_protocol(server("2-softsync", 6), 60,
                                 simulate.SpeedModel("random", seed=seed))
  assert trace(7) == trace(7)
  assert trace(7) != trace(8)


def test_a_straggler_slows_hardsync_more_than_softsync():
  straggler = simulate.SpeedModel("straggler", straggler_factor=4.0)
  hard = simulate.run_protocol(server("hardsync", 4), 80, straggler)
  soft = simulate.run_protocol(server("1-softsync", 4), 80, straggler)
  # hardsync waits for the straggler every round (4 time units a round of
  # 4 gradients); 1-softsync lets the other three push on.
  assert hard[-1][0] == pytest.approx(80 / 4 * 4.0)
  assert soft[-1][0] < 0.5 * hard[-1][0]
  assert sum(1 for _, l, _ in soft if l == 0) < 80 / 4


def test_speed_model_and_policy_validation():
  with pytest.raises(ValueError, match="'warp'.*equal, random, normal, "
                     "straggler, replay, measured"):
    simulate.SpeedModel("warp")
  with pytest.raises(ValueError, match="jitter"):
    simulate.SpeedModel("random", jitter=1.5)
  with pytest.raises(ValueError, match="straggler_factor"):
    simulate.SpeedModel("straggler", straggler_factor=0.5)
  with pytest.raises(ValueError, match="gap must be >= 0"):
    simulate.SpeedModel(gap=-1)
  with pytest.raises(ValueError, match="lr_policy"):
    server("async", 2, lr_policy="half")


@pytest.mark.parametrize("compensation", [
    "none", "delay", "delay_adaptive", "gap_aware"])
def test_one_learner_async_simulation_equals_plain_sgd(compensation):
  # One learner's gradients are never stale (θ_now = θ_pulled): every
  # compensation rule leaves them as they are (gap_aware's G = 1).
  data, model_fn = tiny_problem(train_size=256)
  result = simulate.simulate(model_fn, data, "async", num_learners=1,
                             minibatch=8, steps_per_epoch=40,
                             learning_rate=0.05, seed=3,
                             compensation=compensation)
  assert result["updates"] == 40 and result["report"].max == 0
  batches = data.learner_batches(0, 1, 8, seed=3)
  x, y = (np.concatenate(part) for part in zip(
      *[next(batches) for _ in range(40)]))
  reference = plain_sgd(model_fn, 3, 0.05, x, y, batch_size=8)
  assert_same_weights(result["weights"], reference, atol=1e-7)
  assert not np.allclose(result["weights"][0], model_fn().get_weights()[0])


def test_compensation_corrects_each_stale_gradient_against_the_master():
  # Async, λ = 4: "delay" with λ_dc = 0 takes the per-gradient path and
  # must equal "none" (the grouped path) to float precision; λ_dc = 1 moves
  # the weights elsewhere; "gap_aware" damps stale gradients, so its
  # weights move less far from the start than "none"'s.
  data, model_fn = tiny_problem(train_size=256)

  def weights(**kwargs):
    return simulate.simulate(model_fn, data, "async", num_learners=4,
                             minibatch=8, steps_per_epoch=40,
                             learning_rate=0.05, seed=3, **kwargs)["weights"]
  plain = weights()
  assert_same_weights(weights(compensation="delay", compensation_strength=0.0),
                      _Weights(plain), atol=1e-6)
  strong = weights(compensation="delay", compensation_strength=1.0)
  assert not np.allclose(strong[0], plain[0], atol=1e-4)
  start = _first_built(model_fn)
  distance = lambda w: sum(np.abs(a - b).sum() for a, b in zip(w, start))
  assert distance(weights(compensation="gap_aware")) < distance(plain)


def test_gap_log_averages_compensation_golden_values():
  # compensation.py's worked values: θ_now − θ_pulled = [0.2, −0.5],
  # C = [0.1, 0.2], so G = [3, 3.5]: distance (0.2 + 0.5) / 2 = 0.35,
  # C (0.1 + 0.2) / 2 = 0.15, G 3.25, 1/G (1/3 + 1/3.5) / 2 = 0.30952.
  log = simulate.GapLog()
  log.add(np.array([0.5, 1.0]), np.array([0.3, 1.5]), np.array([0.1, 0.2]))
  means = log.take()
  np.testing.assert_allclose(
      [means[name] for name in simulate.GapLog.FIELDS],
      [0.35, 0.15, 3.25, (1 / 3 + 1 / 3.5) / 2])
  # A second gradient, fresh (θ_pulled = θ_now: G = 1), after the take:
  # only it counts.
  log.add(np.array([0.5, 1.0]), np.array([0.5, 1.0]), np.array([0.1, 0.2]))
  assert log.take() == {"distance": 0.0, "typical_step": pytest.approx(0.15),
                        "divisor": 1.0, "damping": 1.0}
  assert log.take() == dict.fromkeys(simulate.GapLog.FIELDS)


def test_gap_aware_simulation_logs_its_divisor_per_epoch():
  data, model_fn = tiny_problem(train_size=256)

  def run(num_learners, compensation="gap_aware"):
    return simulate.simulate(model_fn, data, "async", num_learners,
                             minibatch=8, epochs=2, steps_per_epoch=40,
                             learning_rate=0.05, seed=3,
                             compensation=compensation)["epoch_gaps"]
  # One learner: never stale, so G = 1 for every parameter, every epoch.
  alone = run(1)
  assert [(e["distance"], e["divisor"], e["damping"]) for e in alone] == [
      (0.0, 1.0, 1.0)] * 2
  assert all(e["typical_step"] > 0 for e in alone)
  # Four learners: σ = 3 after the first round, so the weights moved and
  # G > 1; the damping is at most 1 and at least 1 / mean G (Jensen).
  for epoch in run(4):
    assert epoch["distance"] > 0 and epoch["divisor"] > 1
    assert 1 / epoch["divisor"] <= epoch["damping"] < 1
  assert run(4, compensation="delay") == []


class _Weights:
  """Weights in the shape assert_same_weights compares with."""

  def __init__(self, weights):
    self._weights = weights

  def get_weights(self):
    return self._weights


def _first_built(model_fn, seed=3):
  """The initial weights the simulator starts from (its first model)."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  tf_keras.utils.set_random_seed(seed)
  return model_fn().get_weights()


def test_simulation_of_many_learners_trains():
  import models  # pylint: disable=g-import-not-at-top
  from rudra_tf import datasets  # pylint: disable=g-import-not-at-top
  data = datasets.load_synthetic(train_size=600, test_size=100,
                                 image_shape=(8, 8, 1), num_classes=4)
  result = simulate.simulate(
      lambda: models.build_model("mlp", (8, 8, 1), 4, hidden=32), data,
      "2-softsync", num_learners=8, minibatch=4, epochs=2,
      learning_rate=0.05, lr_policy="divide_by_n",
      speed=simulate.SpeedModel("random", seed=1))
  report = result["report"]
  assert report.gradients == 2 * 150
  assert report.timestamp * 4 + report.pending == report.gradients
  assert 0 < report.mean < 8
  assert result["test_accuracy"] > 0.4  # 4 classes: chance is 0.25


def test_numpy_learner_batches_cover_the_same_shard():
  from rudra_tf import datasets  # pylint: disable=g-import-not-at-top
  data = datasets.load_synthetic(train_size=60, test_size=6,
                                 image_shape=(4, 4, 1), num_classes=3)
  rows = lambda x: {tuple(r) for r in np.round(x.reshape(len(x), -1), 4)}
  for learner in range(3):
    batches = data.learner_batches(learner, 3, 5, seed=1)
    seen = np.concatenate([next(batches)[0] for _ in range(4)])  # 20 = shard
    shard = data.preprocess(data.x_train[learner::3]).numpy()
    assert rows(seen) == rows(shard)


def test_hardsync_simulation_equals_sgd_with_batch_mu_lambda():
  # The paper: hardsync with λ learners is SGD with mini-batch μλ. Each
  # round's λ gradients share one version, so the simulator computes them
  # in one weighted call; plain SGD sees the λ batches concatenated.
  data, model_fn = tiny_problem(train_size=320)
  result = simulate.simulate(model_fn, data, "hardsync", num_learners=4,
                             minibatch=5, steps_per_epoch=48,
                             learning_rate=0.1, seed=2)
  assert result["updates"] == 12 and result["report"].max == 0
  streams = [data.learner_batches(l, 4, 5, seed=2) for l in range(4)]
  rounds = [[next(s) for s in streams] for _ in range(12)]
  x = np.concatenate([b[0] for r in rounds for b in r])
  y = np.concatenate([b[1] for r in rounds for b in r])
  reference = plain_sgd(model_fn, 2, 0.1, x, y, batch_size=20)
  assert_same_weights(result["weights"], reference, atol=1e-6)


def test_each_epochs_test_accuracy_is_that_of_a_run_stopped_there():
  # 2-softsync, λ = 4 (c = 2): 30 gradients an epoch end an update, so the
  # curve's epoch-k point is the weights after 15k updates, exactly what a
  # k-epoch run ends with; the last point is the run's own test accuracy.
  data, model_fn = tiny_problem(train_size=256)

  def run(epochs, **kwargs):
    return simulate.simulate(model_fn, data, "2-softsync", num_learners=4,
                             minibatch=8, epochs=epochs, steps_per_epoch=30,
                             learning_rate=0.05, seed=1,
                             speed=simulate.SpeedModel("random", seed=2),
                             **kwargs)
  three = run(3, evaluate_each_epoch=True)
  losses = three["epoch_test_loss"]
  assert len(losses) == len(three["epoch_test_accuracy"]) == 3
  assert losses[-1] == three["test_loss"]
  assert three["epoch_test_accuracy"][-1] == three["test_accuracy"]
  assert len(set(losses)) == 3  # each point tests different weights
  for epochs in (1, 2):
    stopped = run(epochs)
    assert losses[epochs - 1] == pytest.approx(stopped["test_loss"],
                                               rel=1e-6)
    assert three["epoch_test_accuracy"][epochs - 1] == pytest.approx(
        stopped["test_accuracy"], abs=1e-7)
  assert run(2)["epoch_test_loss"] == []  # only when asked
