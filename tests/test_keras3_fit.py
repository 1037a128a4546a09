"""Keras 3's model.fit, evaluate and predict under RudraStrategy
(rudra_tf/keras3_training.py), against plain Keras 3 and hand-computed
weights: the oracles of the tf_keras path (test_optimizer.py), every input
kind, epoch-level callbacks, .keras save and load, and the refusals.

Every cluster runs in a fresh process (tests/support.py); the scenarios
are below the tests.
"""

import numpy as np
import pytest

from tests.support import assert_invariants
from tests.support import run_in_fresh_process

# μ rows per learner step; rows of the small data sets.
MINIBATCH = 8
ROWS = 64


@pytest.mark.parametrize("optimizer_name",
                         ["sgd_momentum", "adam", "sgd_schedule"])
def test_one_learner_async_fit_equals_plain_keras3_fit(optimizer_name):
  result = run_in_fresh_process(one_learner_fit_and_plain_fit,
                                optimizer_name=optimizer_name)
  # 2 epochs of ROWS / μ steps, one gradient each, none stale.
  steps = 2 * ROWS // MINIBATCH
  assert result["report"]["gradients"] == steps
  assert result["report"]["timestamp"] == steps
  assert result["report"]["max"] == 0
  for rudra, plain in zip(result["trained"], result["plain"]):
    np.testing.assert_allclose(rudra, plain, rtol=1e-5, atol=1e-7)
  assert not np.allclose(result["plain"][0], result["initial"][0], atol=1e-3)
  # Epoch logs, evaluate and predict agree with Keras 3's own.
  np.testing.assert_allclose(result["history"], result["plain_history"],
                             rtol=1e-5)
  np.testing.assert_allclose(result["evaluate"], result["plain_evaluate"],
                             rtol=1e-5)
  np.testing.assert_allclose(result["predict"], result["plain_predict"],
                             rtol=1e-5, atol=1e-6)


def test_hardsync_fit_equals_sgd_with_batch_mu_lambda():
  result = run_in_fresh_process(hardsync_fit_and_big_batch_sgd)
  # λ = 2, 8 updates of c = 2 gradients each, none stale.
  assert result["report"]["gradients"] == 16
  assert result["report"]["timestamp"] == 8
  assert result["report"]["max"] == 0
  for rudra, plain in zip(result["trained"], result["plain"]):
    np.testing.assert_allclose(rudra, plain, rtol=1e-5, atol=1e-7)
  assert not np.allclose(result["plain"][0], result["initial"][0], atol=1e-3)


def test_divide_by_n_and_a_rate_callback_by_hand():
  # λ = 4, 2-softsync: c = 2, m = 1/2; x = 1, loss = mean(w·x + b), so
  # every gradient is 1 and each update moves w by α · 1/2. Epoch 1: 30
  # gradients, 15 updates at α = 0.1 (LearningRateScheduler): -0.75;
  # epoch 2: 15 at α = 0.04: -0.3. w = -1.05.
  result = run_in_fresh_process(linear_fit, num_learners=4,
                                protocol="2-softsync",
                                lr_policy="divide_by_n", steps=30,
                                epoch_learning_rates=[0.1, 0.04])
  assert result["report"]["timestamp"] == 30
  assert result["logged_rates"] == pytest.approx([0.1, 0.04])
  assert result["kernel"] == pytest.approx(-1.05, rel=1e-6)
  assert result["bias"] == pytest.approx(-1.05, rel=1e-6)
  assert_invariants(result["report"])


def test_divide_by_staleness_by_hand():
  # async (c = 1), α = 0.1: a gradient of staleness σ moves w by
  # -0.1 / max(σ, 1); the histogram says how many had each σ.
  result = run_in_fresh_process(linear_fit, num_learners=3, protocol="async",
                                lr_policy="divide_by_staleness", steps=36)
  histogram = result["report"]["histogram"]
  assert histogram.sum() == 36
  expected = -0.1 * sum(count / max(sigma, 1)
                        for sigma, count in enumerate(histogram))
  assert result["kernel"] == pytest.approx(expected, rel=1e-5)
  assert_invariants(result["report"])


def test_max_staleness_drops_and_counts_as_on_tf_keras():
  # async, λ = 3, max_staleness 1, lr_policy none: each accepted gradient
  # moves w by -0.1, each dropped one (σ > 1) not at all.
  result = run_in_fresh_process(linear_fit, num_learners=3, protocol="async",
                                lr_policy="none", steps=36, max_staleness=1)
  report = result["report"]
  assert report["gradients"] == 36
  assert report["dropped"] == report["histogram"][2:].sum()
  accepted = 36 - report["dropped"]
  assert report["timestamp"] == accepted
  assert result["kernel"] == pytest.approx(-0.1 * accepted, rel=1e-5)
  assert_invariants(report)


def test_a_schedule_is_multiplied_by_the_policy():
  # async, λ = 2, divide_by_n (m = 1/2); Keras 3's PiecewiseConstantDecay
  # at the shard's timestamp t: 0.1 for t <= 4, 0.05 for t <= 8, then
  # 0.02; 16 updates: w = -(5 · 0.1 + 4 · 0.05 + 7 · 0.02) / 2 = -0.42.
  result = run_in_fresh_process(linear_fit, num_learners=2, protocol="async",
                                lr_policy="divide_by_n", steps=16,
                                schedule=([4, 8], [0.1, 0.05, 0.02]))
  assert result["report"]["timestamp"] == 16
  assert result["kernel"] == pytest.approx(-0.42, rel=1e-6)


def test_metrics_count_every_learners_rows():
  # λ = 3, 2 epochs of 60 steps of μ = 8: a metric counting rows counts 480
  # each epoch, and the loss tracker's count as many. Keras 3's
  # read-then-write assign_add lost a third of them (320) until it was made
  # atomic on the ps (tf_hooks.install_keras3_atomic_accumulation).
  result = run_in_fresh_process(counted_rows)
  assert result["rows"] == [480.0, 480.0]
  assert result["loss_tracker_count"] == 480.0
  assert result["gradients"] == 120


def test_every_input_kind_and_steps_per_execution():
  result = run_in_fresh_process(input_kinds)
  # arrays: ceil(100 / 8) = 13 steps by default; a repeated dataset and a
  # dataset function: steps_per_epoch 5 each; steps_per_execution 3 over 7
  # steps: closures of 3, 3, 1 steps, one gradient per step.
  assert result["gradients"] == [13, 13 + 5, 13 + 5 + 5, 13 + 5 + 5 + 7]
  assert_invariants(result["report"])
  assert all(np.isfinite(loss) for loss in result["losses"])
  # The dataset function got each learner's input context.
  assert {(2, 0), (2, 1)} <= set(map(tuple, result["learner_contexts"]))
  for evaluated in result["evaluations"]:
    np.testing.assert_allclose(evaluated, result["plain_evaluate"], rtol=1e-5)
  assert result["predict_shape"] == [100, 3]
  for name, message in result["errors"].items():
    assert message is not None, name
  assert "needs steps_per_epoch" in result["errors"]["dataset_no_steps"]
  assert "give y inside it" in result["errors"]["dataset_with_y"]
  assert "take numpy arrays" in result["errors"]["a_string"]
  assert "no weight for classes [1, 2]" in result["errors"]["class_missing"]
  assert result["gradients_after_errors"] == result["gradients"][-1]
  keys, gradients = result["split"]
  assert keys == ["accuracy", "loss", "val_accuracy", "val_loss"]
  assert gradients == result["gradients"][-1] + 10


def test_epoch_callbacks_and_refused_batch_callbacks(tmp_path):
  result = run_in_fresh_process(callbacks_scenario, directory=str(tmp_path))
  # EarlyStopping (min_delta 10, patience 1) stops after epoch 2 of 5.
  assert result["epochs_run"] == 2
  assert result["history_keys"] >= {"loss", "accuracy", "val_loss",
                                    "val_accuracy", "gradients",
                                    "staleness_mean", "learning_rate"}
  assert result["gradients_per_epoch"] == [8, 8]
  assert result["csv_rows"] == 2 and "staleness_mean" in result["csv_header"]
  assert result["checkpoints"] == ["epoch1.keras", "epoch2.keras"]
  assert result["tensorboard_files"] > 0
  assert result["learning_rates"] == pytest.approx([0.05, 0.025])
  refusals = result["refusals"]
  assert "Batch-level callbacks are not supported" in refusals["custom"]
  assert "PerBatch" in refusals["custom"]
  assert "ModelCheckpoint" in refusals["checkpoint_every_5"]
  assert result["gradients_after_refusals"] == 16


def test_save_and_load_to_train_on_and_to_serve(tmp_path):
  path = str(tmp_path / "model.keras")
  saved = run_in_fresh_process(save_scenario, path=path)
  loaded = run_in_fresh_process(load_scenario, path=path)
  # Served without a strategy: the same predictions, the inner optimizer.
  np.testing.assert_allclose(loaded["served_predictions"],
                             saved["predictions"], rtol=1e-6)
  assert loaded["served_optimizer"] == "SGD"
  # Inside a new RudraStrategy: the wrapper, its policy, the saved weights,
  # slots and shard state (12 updates, 1 pending of c = 2), and it trains on.
  assert loaded["optimizer"] == ["Keras3StalenessAwareOptimizer",
                                 "divide_by_n", "SGD"]
  np.testing.assert_allclose(loaded["predictions"], saved["predictions"],
                             rtol=1e-6)
  assert loaded["restored"]["timestamp"] == saved["report"]["timestamp"] == 12
  assert loaded["restored"]["pending"] == saved["report"]["pending"] == 1
  assert len(loaded["momentum"]) == len(saved["momentum"]) == 4
  for restored, momentum in zip(loaded["momentum"], saved["momentum"]):
    np.testing.assert_allclose(restored, momentum)
    assert np.any(momentum)  # trained slots, not fresh zeros
  assert loaded["after"]["gradients"] == saved["report"]["gradients"] + 9
  assert loaded["after"]["timestamp"] == 17
  assert_invariants(loaded["after"])


# --------------------------------------------------------------- scenarios
def _classifier(keras, features=4, classes=3):
  return keras.Sequential([keras.Input((features,)),
                           keras.layers.Dense(8, activation="tanh"),
                           keras.layers.Dense(classes)])


def _optimizer(keras, name):
  if name == "sgd_momentum":
    return keras.optimizers.SGD(0.1, momentum=0.9)
  if name == "adam":
    return keras.optimizers.Adam(0.01)
  if name == "sgd_schedule":
    return keras.optimizers.SGD(
        keras.optimizers.schedules.ExponentialDecay(0.1, 4, 0.5))
  raise ValueError(name)


def _data(rows=ROWS, features=4, classes=3):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(rows, features)).astype("float32")
  y = (np.abs(x[:, :classes]).argmax(1)).astype("int64")
  return x, y


def _report(strategy):
  from tests.cluster_fixtures import report_as_dict  # pylint: disable=g-import-not-at-top
  return report_as_dict(strategy)


def _compile(keras, model, optimizer):
  model.compile(optimizer=optimizer,
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True),
                metrics=["accuracy"])


def one_learner_fit_and_plain_fit(optimizer_name):
  import keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  cluster = rudra_tf.LocalCluster(num_ps=1, num_learners=1)
  strategy = rudra_tf.RudraStrategy(cluster.resolver, protocol="async")
  keras.utils.set_random_seed(0)
  with strategy.scope():
    model = _classifier(keras)
    _compile(keras, model, rudra_tf.StalenessAwareOptimizer(
        _optimizer(keras, optimizer_name)))
  initial = model.get_weights()
  x, y = _data()
  history = model.fit(x, y, batch_size=MINIBATCH, epochs=2, shuffle=False)
  evaluated = model.evaluate(x, y, batch_size=16)
  predicted = model.predict(x, batch_size=16)
  plain = _classifier(keras)
  plain.set_weights(initial)
  _compile(keras, plain, _optimizer(keras, optimizer_name))
  plain_history = plain.fit(x, y, batch_size=MINIBATCH, epochs=2,
                            shuffle=False, verbose=0)
  return {"initial": initial, "trained": model.get_weights(),
          "plain": plain.get_weights(), "report": _report(strategy),
          "history": history.history["loss"] + history.history["accuracy"],
          "plain_history": (plain_history.history["loss"] +
                            plain_history.history["accuracy"]),
          "evaluate": evaluated,
          "plain_evaluate": plain.evaluate(x, y, batch_size=16, verbose=0),
          "predict": predicted,
          "plain_predict": plain.predict(x, batch_size=16, verbose=0)}


def hardsync_fit_and_big_batch_sgd():
  # λ = 2, every learner step on the same μ rows (a round may hold two
  # gradients of one learner, so the batches are equal to make the round's
  # batch known): each update is plain SGD's step on the μλ rows.
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  cluster = rudra_tf.LocalCluster(num_ps=1, num_learners=2)
  strategy = rudra_tf.RudraStrategy(cluster.resolver, protocol="hardsync")
  keras.utils.set_random_seed(0)
  with strategy.scope():
    model = _classifier(keras)
    _compile(keras, model, rudra_tf.StalenessAwareOptimizer(
        keras.optimizers.SGD(0.1, momentum=0.9)))
  initial = model.get_weights()
  x, y = _data()

  def dataset_fn(input_context):
    del input_context
    return tf.data.Dataset.from_tensors(
        (x[:MINIBATCH], y[:MINIBATCH])).repeat()
  model.fit(dataset_fn, epochs=2, steps_per_epoch=8)
  plain = _classifier(keras)
  plain.set_weights(initial)
  _compile(keras, plain, keras.optimizers.SGD(0.1, momentum=0.9))
  rows = np.concatenate([np.arange(MINIBATCH)] * 2)
  for _ in range(8):
    plain.train_on_batch(x[rows], y[rows])
  return {"initial": initial, "trained": model.get_weights(),
          "plain": plain.get_weights(), "report": _report(strategy)}


def linear_fit(num_learners, protocol, lr_policy, steps, schedule=None,
               epoch_learning_rates=None, max_staleness=None):
  """Keras 3's linear_updates (tests/cluster_fixtures.py): loss =
  mean(w·x + b) with x = 1, so every gradient is exactly 1."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  cluster = rudra_tf.LocalCluster(num_ps=1, num_learners=num_learners)
  strategy = rudra_tf.RudraStrategy(cluster.resolver, protocol=protocol,
                                    max_staleness=max_staleness)
  learning_rate = 0.1
  if schedule is not None:
    learning_rate = keras.optimizers.schedules.PiecewiseConstantDecay(
        *schedule)
  with strategy.scope():
    model = keras.Sequential([
        keras.Input((1,)),
        keras.layers.Dense(1, kernel_initializer="zeros",
                           bias_initializer="zeros")])
    model.compile(
        optimizer=rudra_tf.StalenessAwareOptimizer(
            keras.optimizers.SGD(learning_rate), lr_policy=lr_policy),
        loss=lambda y_true, y_pred: tf.reduce_mean(y_pred))
  rates = epoch_learning_rates or []
  history = model.fit(
      np.ones((64, 1), np.float32), np.zeros((64, 1), np.float32),
      batch_size=2, epochs=len(rates) or 1, steps_per_epoch=steps, verbose=0,
      callbacks=[keras.callbacks.LearningRateScheduler(
          lambda epoch, _: rates[epoch])] if rates else [])
  kernel, bias = model.get_weights()
  return {"kernel": float(kernel[0, 0]), "bias": float(bias[0]),
          "logged_rates": history.history.get("learning_rate"),
          "report": _report(strategy)}


def counted_rows():
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top

  class Rows(keras.metrics.Metric):
    def __init__(self, name="rows", **kwargs):
      super().__init__(name=name, **kwargs)
      self.rows = self.add_variable(shape=(), initializer="zeros",
                                    name="rows")

    def update_state(self, y_true, y_pred, sample_weight=None):
      self.rows.assign_add(tf.cast(tf.shape(y_true)[0], "float32"))

    def result(self):
      return self.rows

  cluster = rudra_tf.LocalCluster(num_ps=1, num_learners=3)
  strategy = rudra_tf.RudraStrategy(cluster.resolver, protocol="async")
  with strategy.scope():
    model = _classifier(keras)
    model.compile(rudra_tf.StalenessAwareOptimizer(keras.optimizers.SGD(0.01)),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[Rows()])
  x, y = _data(rows=512)
  history = model.fit(x, y, batch_size=MINIBATCH, steps_per_epoch=60,
                      epochs=2, verbose=0)
  tracker = [v for v in model.metrics_variables if "count" in v.path]
  return {"rows": history.history["rows"],
          "loss_tracker_count": float(tracker[0].numpy()),
          "gradients": strategy.staleness_report().gradients}


def input_kinds():
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  cluster = rudra_tf.LocalCluster(num_ps=1, num_learners=2)
  strategy = rudra_tf.RudraStrategy(cluster.resolver, protocol="async")
  keras.utils.set_random_seed(0)
  with strategy.scope():
    model = _classifier(keras)
    _compile(keras, model, rudra_tf.StalenessAwareOptimizer(
        keras.optimizers.SGD(0.05)))
  x, y = _data(rows=100)
  gradients, losses, evaluations = [], [], []

  def count():
    gradients.append(strategy.staleness_report().gradients)

  losses += model.fit(x, y, batch_size=MINIBATCH, epochs=1).history["loss"]
  count()
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(MINIBATCH)
  losses += model.fit(dataset.repeat(), steps_per_epoch=5).history["loss"]
  count()

  contexts = set()

  def dataset_fn(input_context):
    # Traced on the chief, once per learner with its input context.
    contexts.add((input_context.num_input_pipelines,
                  input_context.input_pipeline_id))
    return tf.data.Dataset.from_tensor_slices((x, y)).shard(
        input_context.num_input_pipelines,
        input_context.input_pipeline_id).batch(MINIBATCH).repeat()
  losses += model.fit(dataset_fn, steps_per_epoch=5).history["loss"]
  count()
  model.compile(optimizer=model.optimizer, metrics=["accuracy"],
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True), steps_per_execution=3)
  losses += model.fit(x, y, batch_size=MINIBATCH,
                      steps_per_epoch=7).history["loss"]
  count()
  evaluations.append(model.evaluate(x, y, batch_size=16))
  evaluations.append(model.evaluate(dataset))
  evaluations.append(model.evaluate(
      lambda context: dataset, steps=None))
  plain = _classifier(keras)
  plain.set_weights(model.get_weights())
  _compile(keras, plain, "sgd")
  errors = {}
  for name, call in {
      "dataset_no_steps": lambda: model.fit(dataset.repeat()),
      "dataset_with_y": lambda: model.fit(dataset, y, steps_per_epoch=2),
      "a_string": lambda: model.fit("data.csv", steps_per_epoch=2),
      "class_missing": lambda: model.fit(x, y, class_weight={0: 1.0}),
  }.items():
    try:
      call()
      errors[name] = None
    except ValueError as error:
      errors[name] = str(error)
  gradients_after_errors = strategy.staleness_report().gradients
  # The last 20% of the rows held out: 80 rows, 10 steps.
  model.compile(optimizer=model.optimizer, metrics=["accuracy"],
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
  split = model.fit(x, y, batch_size=MINIBATCH, validation_split=0.2,
                    class_weight={0: 1.0, 1: 2.0, 2: 1.0}).history
  return {"gradients": gradients, "losses": losses,
          "split": [sorted(split), strategy.staleness_report().gradients],
          "learner_contexts": sorted(contexts),
          "evaluations": evaluations,
          "plain_evaluate": plain.evaluate(x, y, batch_size=16, verbose=0),
          "predict_shape": list(model.predict(x).shape),
          "errors": errors,
          "gradients_after_errors": gradients_after_errors,
          "report": _report(strategy)}


def callbacks_scenario(directory):
  import csv  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  cluster = rudra_tf.LocalCluster(num_ps=1, num_learners=2)
  strategy = rudra_tf.RudraStrategy(cluster.resolver, protocol="async")
  keras.utils.set_random_seed(0)
  with strategy.scope():
    model = _classifier(keras)
    _compile(keras, model, rudra_tf.StalenessAwareOptimizer(
        keras.optimizers.SGD(0.05), "divide_by_n"))
  x, y = _data()
  csv_path = os.path.join(directory, "log.csv")
  tensorboard = os.path.join(directory, "tensorboard")
  history = model.fit(
      x, y, batch_size=MINIBATCH, epochs=5, validation_data=(x, y),
      callbacks=[
          rudra_tf.StalenessLogger(),
          keras.callbacks.LearningRateScheduler(
              lambda epoch, rate: 0.05 / (epoch + 1)),
          keras.callbacks.CSVLogger(csv_path),
          keras.callbacks.TensorBoard(tensorboard),
          keras.callbacks.ModelCheckpoint(
              os.path.join(directory, "epoch{epoch}.keras")),
          keras.callbacks.EarlyStopping("val_loss", min_delta=10.0,
                                        patience=1)])
  with open(csv_path, encoding="utf-8") as rows:
    csv_rows = list(csv.reader(rows))

  class PerBatch(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
      pass

  refusals = {}
  for name, callback in {
      "custom": PerBatch(),
      "checkpoint_every_5": keras.callbacks.ModelCheckpoint(
          os.path.join(directory, "x.keras"), save_freq=5)}.items():
    try:
      model.fit(x, y, batch_size=MINIBATCH, callbacks=[callback])
      refusals[name] = None
    except ValueError as error:
      refusals[name] = str(error)
  return {"epochs_run": len(history.history["loss"]),
          "history_keys": set(history.history),
          "gradients_per_epoch": history.history["gradients"],
          "learning_rates": history.history["learning_rate"],
          "csv_rows": len(csv_rows) - 1, "csv_header": csv_rows[0],
          "checkpoints": sorted(name for name in os.listdir(directory)
                                if name.startswith("epoch")),
          "tensorboard_files": sum(len(files) for _, _, files in
                                   os.walk(tensorboard)),
          "refusals": refusals,
          "gradients_after_refusals": strategy.staleness_report().gradients}


def _momentum(model):
  return [v.numpy() for v in model.optimizer.inner_optimizer.variables
          if "momentum" in v.name]


def save_scenario(path):
  # 1-softsync, λ = 2: c = 2; 25 gradients leave 12 updates and 1
  # pending gradient at the save.
  import keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  cluster = rudra_tf.LocalCluster(num_ps=1, num_learners=2)
  strategy = rudra_tf.RudraStrategy(cluster.resolver, protocol="1-softsync")
  keras.utils.set_random_seed(0)
  with strategy.scope():
    model = _classifier(keras)
    _compile(keras, model, rudra_tf.StalenessAwareOptimizer(
        keras.optimizers.SGD(0.05, momentum=0.9), "divide_by_n"))
  x, y = _data()
  model.fit(x, y, batch_size=MINIBATCH, steps_per_epoch=25)
  model.save(path)
  return {"predictions": model.predict(x), "report": _report(strategy),
          "momentum": _momentum(model)}


def load_scenario(path):
  import keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  x, y = _data()
  served = keras.models.load_model(path)
  result = {"served_predictions": served.predict(x, verbose=0),
            "served_optimizer": type(served.optimizer).__name__}
  cluster = rudra_tf.LocalCluster(num_ps=1, num_learners=2)
  strategy = rudra_tf.RudraStrategy(cluster.resolver, protocol="1-softsync")
  with strategy.scope():
    model = keras.models.load_model(path)
  optimizer = model.optimizer
  result["optimizer"] = [type(optimizer).__name__, optimizer.lr_policy,
                         type(optimizer.inner_optimizer).__name__]
  result["predictions"] = model.predict(x)
  result["restored"] = _report(strategy)
  result["momentum"] = _momentum(model)
  model.fit(x, y, batch_size=MINIBATCH, steps_per_epoch=9)
  result["after"] = _report(strategy)
  return result
