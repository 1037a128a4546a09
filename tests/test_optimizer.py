"""rudra_tf/optimizer.py against real TensorFlow servers: the one-learner
oracle, learning-rate policies computed by hand, checkpoints, saving and
loading.

Every cluster runs in a fresh process (tests/support.py); the scenarios
each test runs are beside it, below the tests.
"""

import os

import numpy as np
import pytest

from tests.cluster_fixtures import (compiled_mlp, connect_cluster,
                                    linear_updates, make_optimizer,
                                    repeated_batches, report_as_dict,
                                    seeded_mlp, synthetic_data)
from tests.support import assert_invariants
from tests.support import run_in_fresh_process


@pytest.mark.parametrize("optimizer,handed", [
    ("sgd_momentum", "wrapped"), ("adam", "wrapped"),
    ("sgd_schedule", "wrapped"), ("sgd_weight_decay_clipnorm", "wrapped"),
    ("adamw_global_clipnorm", "wrapped"),
    # tf_keras's legacy optimizers (TensorFlow's PS tutorial uses them):
    # the decay and the schedule count the shard's updates, as the plain
    # optimizer's iterations count its steps.
    ("legacy_sgd_momentum_decay", "wrapped"),
    ("legacy_rmsprop_clipnorm", "wrapped"),
    ("legacy_adam_schedule", "wrapped"),
    # Stock ParameterServerStrategy code: the optimizer not wrapped, made
    # inside the scope or outside it.
    ("sgd_weight_decay_clipnorm", "plain"), ("adam", "plain"),
    ("legacy_rmsprop_clipnorm", "plain"),
    ("sgd_momentum", "outside_plain"), ("legacy_adam_schedule", "outside_plain"),
    ("adamw_global_clipnorm", "outside_wrapped")])
def test_one_learner_async_equals_plain_keras(optimizer, handed):
  result = run_in_fresh_process(one_learner_matches_plain,
                                optimizer=optimizer, handed=handed)
  assert result["report"]["timestamp"] == 30
  assert result["report"]["max"] == 0
  for rudra, plain in zip(result["rudra"], result["plain"]):
    np.testing.assert_allclose(rudra, plain, rtol=1e-5, atol=1e-7)
  # And training moved the weights: the comparison is not vacuous.
  initial = seeded_mlp().get_weights()
  assert not np.allclose(result["plain"][0], initial[0], atol=1e-3)


def test_mixed_bfloat16_one_learner_equals_plain_keras():
  # bfloat16 compute on the learner, float32 weights and updates on the ps
  # (mixed_float16 needs loss scaling, which tf_keras refuses under any
  # parameter-server strategy).
  result = run_in_fresh_process(one_learner_matches_plain,
                                optimizer="sgd_momentum",
                                dtype_policy="mixed_bfloat16")
  assert result["compute_dtype"] == "bfloat16"
  assert result["report"]["timestamp"] == 30
  for rudra, plain in zip(result["rudra"], result["plain"]):
    assert rudra.dtype == np.float32
    np.testing.assert_allclose(rudra, plain, rtol=1e-5, atol=1e-7)


def test_divide_by_n_update_matches_hand_computation():
  # λ = 4, 2-softsync: c = 2, α = 0.1 / 2. Each update is
  # w -= 0.05 * (1/2) * (1 + 1) = 0.05; 30 gradients make 15 updates.
  result = run_in_fresh_process(
      linear_updates, num_learners=4, protocol="2-softsync",
      lr_policy="divide_by_n", steps=30)
  report = result["report"]
  assert report["timestamp"] == 15 and report["pending"] == 0
  assert result["kernel"] == pytest.approx(-0.75, rel=1e-6)
  assert result["bias"] == pytest.approx(-0.75, rel=1e-6)


def test_divide_by_staleness_update_matches_hand_computation():
  # async (c = 1), α0 = 0.1: each gradient of staleness σ moves w by
  # -0.1 / max(σ, 1); the recorded histogram says how many had each σ.
  result = run_in_fresh_process(
      linear_updates, num_learners=3, protocol="async",
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
      linear_updates, num_learners=2, protocol="async",
      lr_policy="divide_by_n", steps=16,
      schedule=([4, 8], [0.1, 0.05, 0.02]))
  assert result["report"]["timestamp"] == 16
  assert result["kernel"] == pytest.approx(-0.42, rel=1e-6)


def test_a_learning_rate_callback_reaches_the_ps_updates():
  # tf_keras's LearningRateScheduler sets the wrapper's rate between epochs;
  # async, λ = 2, divide_by_n: 6 updates at 0.1 / 2, then 6 at 0.04 / 2:
  # w = -(6 * 0.05 + 6 * 0.02) = -0.42.
  result = run_in_fresh_process(
      linear_updates, num_learners=2, protocol="async",
      lr_policy="divide_by_n", steps=6, epoch_learning_rates=[0.1, 0.04])
  assert result["report"]["timestamp"] == 12
  assert result["logged_rates"] == pytest.approx([0.1, 0.04])
  assert result["kernel"] == pytest.approx(-0.42, rel=1e-6)


def test_checkpoint_restores_weights_slots_timestamp_and_histogram(tmp_path):
  path = str(tmp_path / "ckpt")
  saved = run_in_fresh_process(checkpoint_round, path=path,
                               restore=False)
  restored = run_in_fresh_process(checkpoint_round, path=path,
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


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp("saved_models"))
  saved = run_in_fresh_process(saved_model_round,
                               directory=directory)
  # 7 hardsync gradients at c = 2: 3 updates and one pending gradient,
  # whose accumulator the saved state must carry.
  assert saved["report"]["timestamp"] == 3
  assert saved["report"]["pending"] == 1
  return directory, saved


def load_saved(directory, load_format):
  """Loads what `saved_models` saved, in a new cluster, and trains on."""
  loaded = run_in_fresh_process(saved_model_round,
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
  for a, b in zip(loaded["weights"], seeded_mlp().get_weights()):
    np.testing.assert_array_equal(a, b)
  assert loaded["report"]["gradients"] == 0
  after = loaded["after_more_training"]
  assert after["gradients"] == 3 and after["timestamp"] == 1
  assert_invariants(after)


def test_a_saved_model_refuses_a_protocol_it_does_not_fit(saved_models):
  directory, _ = saved_models
  result = run_in_fresh_process(saved_model_round,
                                directory=directory, load_format="keras",
                                protocol="async")
  assert "holds 1 pending gradients; async here updates after c = 1" in \
      result["error"]
  assert "compile=False" in result["error"]


def test_a_saved_model_loads_without_a_cluster_for_inference(saved_models):
  directory, saved = saved_models
  for name in SAVE_FORMATS.values():
    path = f"{directory}/{name}"
    loaded = run_in_fresh_process(load_without_cluster, path=path,
                                  compile_model=False)
    np.testing.assert_allclose(loaded["predictions"], saved["predictions"],
                               atol=1e-6)
  # Compiled too: a plain tf_keras model with the inner optimizer (its
  # config: SGD, rate 0.05, momentum 0.9), which trains with no cluster.
  for name in ("model.keras", "model.h5"):
    plain = run_in_fresh_process(load_without_cluster,
                                 path=f"{directory}/{name}",
                                 compile_model=True)
    assert plain["optimizer"] == ("SGD", pytest.approx(0.05),
                                  pytest.approx(0.9)), name
    np.testing.assert_allclose(plain["predictions"], saved["predictions"],
                               atol=1e-6)
    assert np.isfinite(plain["loss_after_a_step"]), name


# ------------------------------------------------------------- scenarios
def one_learner_matches_plain(optimizer, steps=30, dtype_policy=None,
                              handed="wrapped"):
  """One learner, async, lr_policy "none", against plain tf_keras (both
  under `dtype_policy`, e.g. "mixed_bfloat16", when given)."""
  if dtype_policy is not None:
    import tf_keras  # pylint: disable=g-import-not-at-top
    tf_keras.mixed_precision.set_global_policy(dtype_policy)
  _, strategy = connect_cluster(1, 1, "async")
  x, y = synthetic_data()
  model = compiled_mlp(strategy, optimizer, "none", handed=handed)
  model.fit(repeated_batches(x, y, 8), epochs=1, steps_per_epoch=steps, verbose=0)
  reference = seeded_mlp()
  reference.compile(optimizer=make_optimizer(optimizer),
                    loss="sparse_categorical_crossentropy")
  reference.fit(repeated_batches(x, y, 8), epochs=1, steps_per_epoch=steps,
                verbose=0)
  return {"rudra": model.get_weights(), "plain": reference.get_weights(),
          "compute_dtype": model.layers[0].compute_dtype,
          "report": report_as_dict(strategy)}


def checkpoint_round(path, restore, steps=7):
  """Trains 1-softsync (λ=2, c=2) and saves, or restores and reads back."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  _, strategy = connect_cluster(1, 2, "1-softsync")
  x, y = synthetic_data()
  with strategy.scope():
    model = seeded_mlp(seed=5 if restore else 2)
    optimizer = rudra_tf.StalenessAwareOptimizer(
        make_optimizer("sgd_momentum"), lr_policy="divide_by_staleness")
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
  if restore:
    checkpoint.read(path).assert_existing_objects_matched()
    optimizer.build(model.trainable_variables)
  else:
    model.fit(repeated_batches(x, y, 4), epochs=1, steps_per_epoch=steps, verbose=0)
    checkpoint.write(path)
  state = {
      "weights": model.get_weights(),
      "slots": [v.numpy() for v in optimizer.inner_optimizer.variables],
      "accumulators": [a.numpy() for s in optimizer._rudra_shards  # pylint: disable=protected-access
                       for a in s.accumulators],
      "report": report_as_dict(strategy),
      "config": optimizer.get_config(),
  }
  if restore:
    model.fit(repeated_batches(x, y, 4), epochs=1, steps_per_epoch=steps, verbose=0)
    state["after_more_training"] = report_as_dict(strategy)
  return state


SAVE_FORMATS = {"keras": "model.keras", "h5": "model.h5",
                "savedmodel": "savedmodel"}


UNTRAINED = "untrained.keras"  # saved after compile, before any step


def _optimizer_state(model):
  return {"weights": model.get_weights(),
          # Called, as tf_keras code does: the property is callable too.
          "optimizer": [v.numpy() for v in model.optimizer.variables()]}


def saved_model_round(directory, load_format=None, protocol="hardsync",
                      steps=7):
  """Trains hardsync (λ=2, c=2) and saves in every format, or loads one
  format inside a new cluster's strategy and trains on."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  _, strategy = connect_cluster(1, 2, protocol)
  x, y = synthetic_data()
  if load_format is None:
    model = compiled_mlp(strategy, "sgd_momentum", "divide_by_n")
    model.save(os.path.join(directory, UNTRAINED))
    model.fit(repeated_batches(x, y, 4), epochs=1, steps_per_epoch=steps, verbose=0)
    for save_format, name in SAVE_FORMATS.items():
      model.save(os.path.join(directory, name),
                 save_format="tf" if save_format == "savedmodel" else None)
    return dict(_optimizer_state(model), report=report_as_dict(strategy),
                predictions=model.predict(x[:16], verbose=0))
  path = os.path.join(directory, SAVE_FORMATS.get(load_format, UNTRAINED))
  try:
    with strategy.scope():
      model = tf_keras.models.load_model(path)  # no custom_objects
      model.optimizer.build(model.trainable_variables)
  except ValueError as error:
    return {"error": str(error)}
  state = dict(_optimizer_state(model), report=report_as_dict(strategy),
               optimizer_class=type(model.optimizer).__name__,
               predictions=model.predict(x[:16], verbose=0))
  model.fit(repeated_batches(x, y, 4), epochs=1, steps_per_epoch=3, verbose=0)
  state["after_more_training"] = report_as_dict(strategy)
  return state


def load_without_cluster(path, compile_model):
  """Loads a saved model in a process with no cluster and no strategy."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  from rudra_tf import StalenessAwareOptimizer  # pylint: disable=g-import-not-at-top,unused-import
  model = tf_keras.models.load_model(path, compile=compile_model)
  x, y = synthetic_data()
  result = {"predictions": model.predict(x[:16], verbose=0)}
  if compile_model:
    optimizer = model.optimizer
    result["optimizer"] = (type(optimizer).__name__,
                           float(optimizer.learning_rate),
                           float(optimizer.momentum))
    result["loss_after_a_step"] = model.train_on_batch(x[:16], y[:16])
  return result
