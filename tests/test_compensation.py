"""Golden values of compensation.py's rules, worked by hand in comments."""

import numpy as np
import pytest
import tensorflow as tf

from rudra_tf import compensation
from tests import support

# The module docstring's example: θ_now − θ_pulled = [0.2, −0.5], g ⊙ g =
# [1, 4].
GRADIENT = np.array([1.0, -2.0])
CURRENT = np.array([0.5, 1.0])
PULLED = np.array([0.3, 1.5])


def test_delay_compensation_golden_values():
  # g + 0.1 · [1 · 0.2, 4 · (−0.5)] = [1 + 0.02, −2 − 0.2].
  np.testing.assert_allclose(
      compensation.delay_compensated(GRADIENT, CURRENT, PULLED, 0.1),
      [1.02, -2.2])


def test_delay_compensation_leaves_a_fresh_gradient_and_zero_strength_alone():
  np.testing.assert_allclose(
      compensation.delay_compensated(GRADIENT, CURRENT, CURRENT, 0.1),
      GRADIENT)
  np.testing.assert_allclose(
      compensation.delay_compensated(GRADIENT, CURRENT, PULLED, 0.0),
      GRADIENT)


def test_adaptive_delay_compensation_golden_values():
  # ms = 0.95 · 0 + 0.05 · [1, 4] = [0.05, 0.2];
  # λ = 0.1 / sqrt(ms) = [0.1 / 0.223607, 0.1 / 0.447214] = [0.447214, 0.223607];
  # g_dc = [1 + 0.447214 · 1 · 0.2, −2 + 0.223607 · 4 · (−0.5)]
  #      = [1.089443, −2.447214].
  mean_square = compensation.updated_mean_square(
      np.zeros(2), GRADIENT, compensation.DC_MEAN_SQUARE_DECAY)
  np.testing.assert_allclose(mean_square, [0.05, 0.2])
  strength = compensation.adaptive_strength(0.1, mean_square)
  np.testing.assert_allclose(strength, [0.447214, 0.223607], rtol=1e-5)
  np.testing.assert_allclose(
      compensation.delay_compensated(GRADIENT, CURRENT, PULLED, strength),
      [1.089443, -2.447214], rtol=1e-5)


def test_gap_aware_golden_values_at_the_first_gradient():
  # v = 0.001 · [1, 4]; t = 1: v̂ = v / (1 − 0.999) = [1, 4];
  # C = 0.1 · ([1, 2] + ε) = [0.1, 0.2];
  # G = 1 + [0.2 / 0.1, 0.5 / 0.2] = [3, 3.5]; g / G = [1/3, −2/3.5].
  mean_square = compensation.updated_mean_square(
      np.zeros(2), GRADIENT, compensation.GAP_MEAN_SQUARE_DECAY)
  step = compensation.typical_step(mean_square, 1, 0.1)
  np.testing.assert_allclose(step, [0.1, 0.2], rtol=1e-5)
  np.testing.assert_allclose(compensation.gap(CURRENT, PULLED, step),
                             [3.0, 3.5], rtol=1e-5)
  np.testing.assert_allclose(
      compensation.gap_aware(GRADIENT, CURRENT, PULLED, step),
      [1 / 3, -2 / 3.5], rtol=1e-5)


def test_gap_aware_bias_correction_over_two_gradients():
  # g1 = [1, −2], then g2 = [3, 0] with β = 0.5 (to keep the numbers small):
  # v1 = 0.5 · [1, 4] = [0.5, 2]; v2 = 0.5 · v1 + 0.5 · [9, 0] = [4.75, 1];
  # v̂ = v2 / (1 − 0.25) = [6.3333, 1.3333]; sqrt = [2.51661, 1.154701];
  # C = 0.1 · sqrt = [0.251661, 0.1154701].
  mean_square = compensation.updated_mean_square(np.zeros(2), GRADIENT, 0.5)
  mean_square = compensation.updated_mean_square(
      mean_square, np.array([3.0, 0.0]), 0.5)
  np.testing.assert_allclose(mean_square, [4.75, 1.0])
  np.testing.assert_allclose(
      compensation.typical_step(mean_square, 2, 0.1, decay=0.5),
      [0.251661, 0.1154701], rtol=1e-5)


def test_a_fresh_gradient_has_gap_one_and_goes_through():
  step = np.array([0.1, 0.2])
  np.testing.assert_allclose(compensation.gap(CURRENT, CURRENT, step), [1, 1])
  np.testing.assert_allclose(
      compensation.gap_aware(GRADIENT, CURRENT, CURRENT, step), GRADIENT)


def test_the_rules_run_on_tensors_in_a_graph():
  ops = compensation.Ops(tf.sqrt, tf.abs)

  @tf.function
  def rules(gradient, current, pulled):
    mean_square = compensation.updated_mean_square(
        tf.zeros_like(gradient), gradient, compensation.GAP_MEAN_SQUARE_DECAY)
    step = compensation.typical_step(mean_square, 1, 0.1, ops=ops)
    strength = compensation.adaptive_strength(0.1, 0.05 * gradient * gradient,
                                              ops=ops)
    return (compensation.gap_aware(gradient, current, pulled, step, ops),
            compensation.delay_compensated(gradient, current, pulled,
                                           strength))

  gap_aware, compensated = rules(*(tf.constant(a) for a in
                                   (GRADIENT, CURRENT, PULLED)))
  np.testing.assert_allclose(gap_aware.numpy(), [1 / 3, -2 / 3.5], rtol=1e-5)
  np.testing.assert_allclose(compensated.numpy(), [1.089443, -2.447214],
                             rtol=1e-5)


@pytest.mark.parametrize("decay", [-0.1, 1.0, 1.5])
def test_a_bad_decay_names_the_value_and_the_valid_range(decay):
  with pytest.raises(ValueError, match=rf"decay must be in \[0, 1\), got "
                     rf"{decay}"):
    compensation.updated_mean_square(np.zeros(2), GRADIENT, decay)
  with pytest.raises(ValueError, match=r"decay must be in \[0, 1\)"):
    compensation.typical_step(np.ones(2), 1, 0.1, decay=decay)


def test_typical_step_refuses_no_gradients_averaged():
  with pytest.raises(ValueError, match="gradients_averaged must be >= 1.*0"):
    compensation.typical_step(np.ones(2), 0, 0.1)


def test_a_rule_by_name_over_two_gradients_the_docstring_trajectory():
  # gap_aware, α = 0.1, θ_now − θ_pulled = 0.2, g = 1 then 3 (module
  # docstring): g_ga = 1/3, then 3 / (1 + 0.2 / (0.1 · sqrt(0.009999 /
  # 0.001999))) = 3 / 1.8943 = 1.5837; t counts the gradients.
  rule = compensation.Compensation.create("gap_aware")
  first, mean_square, count = rule.correct(1.0, 0.5, 0.3, 0.0, 0, 0.1)
  second, mean_square, count = rule.correct(3.0, 0.5, 0.3, mean_square,
                                            count, 0.1)
  assert first == pytest.approx(1 / 3, rel=1e-6)
  assert second == pytest.approx(1.5837, abs=1e-4)
  assert (mean_square, count) == (pytest.approx(0.009999), 2)


def test_each_rule_by_name_matches_its_function():
  # "none" and "delay" keep no state; the adaptive rule updates ms first.
  none = compensation.Compensation.create()
  assert not none.enabled
  assert none.correct(GRADIENT, CURRENT, PULLED)[0] is GRADIENT
  delay = compensation.Compensation.create("delay", 0.1)
  corrected, mean_square, count = delay.correct(GRADIENT, CURRENT, PULLED)
  np.testing.assert_allclose(corrected, [1.02, -2.2])
  assert (mean_square, count) == (0.0, 0)
  adaptive = compensation.Compensation.create("delay_adaptive", 0.1)
  corrected, mean_square, count = adaptive.correct(GRADIENT, CURRENT, PULLED,
                                                   np.zeros(2), 0)
  np.testing.assert_allclose(corrected, [1.089443, -2.447214], rtol=1e-6)
  np.testing.assert_allclose(mean_square, [0.05, 0.2])
  assert count == 1
  assert compensation.Compensation.create("delay").strength == 0.04
  assert compensation.Compensation.create("delay_adaptive").strength == 2.0


@pytest.mark.parametrize("name,strength,fragment", [
    ("dc", None, "Unknown compensation 'dc'; valid values are 'none', "
     "'delay', 'delay_adaptive', 'gap_aware'"),
    ("delay", -0.1, "must be a number >= 0, got -0.1"),
    ("delay", "big", "must be a number >= 0, got 'big'"),
    ("gap_aware", 0.5, "compensation 'gap_aware' takes no strength"),
    ("none", 1.0, "compensation 'none' takes no strength"),
])
def test_bad_rules_name_the_value_and_the_valid_ones(name, strength,
                                                     fragment):
  with pytest.raises(ValueError) as error:
    compensation.Compensation.create(name, strength)
  assert fragment in str(error.value)


# ------------------------------------------------------- on a real cluster
@pytest.mark.parametrize("rule,strength", [("delay", 0.5), ("gap_aware", None)])
def test_each_update_on_a_cluster_is_the_rules(rule, strength):
  # Async, λ = 3, one weight w with loss = w (g = 1, g ⊙ g = 1), SGD at
  # α = 0.1. Each step returns the version it pulled (t, w_t). An update
  # from a gradient pulled at t' moves w_t to
  #   delay:      w_t − α (1 + λ_dc (w_t − w_t'))
  #   gap_aware:  w_t − α / (1 + |w_t − w_t'| / α)   (v̂ = 1 when g = 1)
  # Between two pulled versions t < t + k, the k updates must be explained
  # by gradients pulled at versions <= each update's (a search over the
  # pulled versions), and some of them must be stale: a stale update moves
  # w by less than α (by 0.095 for σ = 1 under "delay"), so the check fails
  # if the rule is skipped, mis-signed or fed the wrong θ_pulled.
  result = support.run_in_fresh_process(compensated_counting_weight,
                                        rule=rule, strength=strength)
  versions = result["versions"]
  alpha = 0.1

  def moved(w_now, w_pulled):
    if rule == "delay":
      return w_now - alpha * (1 + strength * (w_now - w_pulled))
    return w_now - alpha / (1 + abs(w_now - w_pulled) / alpha)

  def explain(t, w_now, target, updates):
    """The fewest stale gradients that take w_t to `target` in `updates`
    updates (None if no choice of pulled versions does)."""
    if updates == 0:
      return 0 if abs(w_now - target) < 2e-5 else None
    best = None
    for t_pulled in versions:
      if t - 6 <= t_pulled <= t:
        rest = explain(t + 1, moved(w_now, versions[t_pulled]), target,
                       updates - 1)
        if rest is not None:
          stale_here = rest + (t_pulled < t)
          best = stale_here if best is None else min(best, stale_here)
    return best

  pulled = sorted(versions)
  stale = 0
  for t, later in zip(pulled, pulled[1:]):
    assert later - t <= 3, (t, later)
    found = explain(t, versions[t], versions[later], later - t)
    assert found is not None, (t, later, versions[t], versions[later])
    stale += found
  print(f"{rule}: {len(pulled) - 1} gaps explained, at least {stale} stale "
        "updates among them")
  assert len(pulled) >= 30 and stale >= 1
  assert result["gradients"] == 60 and result["timestamp"] == 60


def compensated_counting_weight(rule, strength):
  """Async λ = 3 on one w with loss = w; 60 scheduled steps, each returning
  the (timestamp, w) it pulled."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  from rudra_tf import variables as variables_lib  # pylint: disable=g-import-not-at-top
  from tests import cluster_fixtures  # pylint: disable=g-import-not-at-top
  _, strategy = cluster_fixtures.connect_cluster(1, 3, "async")
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
      strategy)
  with strategy.scope():
    w = tf.Variable(0.0)
    optimizer = rudra_tf.StalenessAwareOptimizer(
        tf_keras.optimizers.SGD(0.1), compensation=rule,
        compensation_strength=strength)
    optimizer.build([w])

  @tf.function
  def step():
    def replica_step():
      pulled = variables_lib.current_pull()
      with tf.GradientTape() as tape:
        loss = w * 1.0
      optimizer.apply_gradients([(tape.gradient(loss, w), w)])
      # (A lazily built step's probing trace pulls nothing: -1.)
      return (pulled.timestamps.get(0, tf.constant(-1, tf.int64)),
              tf.identity(loss))
    return strategy.run(replica_step)

  results = [coordinator.schedule(step) for _ in range(60)]
  coordinator.join()
  versions = {}
  for value in results:
    timestamp, weight = value.fetch()
    versions[int(timestamp)] = float(weight)
  report = strategy.staleness_report()
  print(report.summary())
  return {"versions": versions, "gradients": report.gradients,
          "timestamp": report.timestamp}


def test_the_rules_state_and_config_survive_a_checkpoint(tmp_path):
  # gap_aware keeps v and t per parameter on the ps: trained 9 steps, saved
  # with tf.train.Checkpoint, and read back into a fresh cluster's wrapper
  # (whose state starts at zero), they come back whole, with the config.
  path = str(tmp_path / "ckpt")
  saved = support.run_in_fresh_process(compensated_checkpoint, path=path,
                                       restore=False)
  restored = support.run_in_fresh_process(compensated_checkpoint, path=path,
                                          restore=True)
  assert saved["counts"] == [9.0] * 4  # every accepted gradient, 4 variables
  for before, after in zip(saved["state"], restored["state"]):
    np.testing.assert_array_equal(before, after)
  assert saved["config"]["compensation"] == "gap_aware"
  assert restored["config"] == saved["config"]
  assert restored["rebuilt_config"] == saved["config"]


def compensated_checkpoint(path, restore):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  from tests import cluster_fixtures  # pylint: disable=g-import-not-at-top
  _, strategy = cluster_fixtures.connect_cluster(1, 2, "async")
  x, y = cluster_fixtures.synthetic_data()
  with strategy.scope():
    model = cluster_fixtures.seeded_mlp()
    optimizer = rudra_tf.StalenessAwareOptimizer(
        cluster_fixtures.make_optimizer("sgd_momentum"),
        lr_policy="divide_by_n", compensation="gap_aware")
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
  if restore:
    optimizer.build(model.trainable_variables)
    checkpoint.read(path).assert_existing_objects_matched()
  else:
    model.fit(cluster_fixtures.repeated_batches(x, y, 4), epochs=1,
              steps_per_epoch=9, verbose=0)
    checkpoint.write(path)
  state = [v.numpy() for v in optimizer.variables][-8:]
  with strategy.scope():
    rebuilt = rudra_tf.StalenessAwareOptimizer.from_config(
        optimizer.get_config())
  return {"state": state, "counts": [float(c) for c in state[1::2]],
          "config": optimizer.get_config(),
          "rebuilt_config": rebuilt.get_config()}
