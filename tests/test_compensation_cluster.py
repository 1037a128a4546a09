"""Compensation rules on a real cluster: each update is the rule's (hand
formulas on a one-weight model), and the rule's state survives a
checkpoint. The rules' golden values are tests/test_compensation.py's."""

import numpy as np
import pytest

from tests import support


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
