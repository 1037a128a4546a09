"""rudra_tf/callbacks.py and tf_keras's epoch callbacks under RudraStrategy.

Every cluster runs in a fresh process (tests/support.py); the scenarios
each test runs are beside it, below the tests.
"""

import os

import numpy as np
import pytest

from tests.cluster_fixtures import (compiled_mlp, connect_cluster,
                                    repeated_batches, report_as_dict,
                                    synthetic_data)
from tests.support import run_in_fresh_process


def test_fit_with_validation_data_and_epoch_callbacks(tmp_path):
  result = run_in_fresh_process(standard_callbacks,
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
  result = run_in_fresh_process(staleness_logged,
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


# ------------------------------------------------------------- scenarios
def standard_callbacks(directory, epochs=3, steps=4):
  """fit with validation data and tf_keras's usual epoch-level callbacks."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  _, strategy = connect_cluster(1, 2, "2-softsync")
  x, y = synthetic_data()
  model = compiled_mlp(strategy, "sgd_momentum", "divide_by_n",
                        metrics=["accuracy"])
  history = model.fit(
      repeated_batches(x, y, 4), epochs=epochs, steps_per_epoch=steps, verbose=0,
      validation_data=repeated_batches(x, y, 8), validation_steps=2,
      callbacks=[
          tf_keras.callbacks.ModelCheckpoint(
              os.path.join(directory, "epoch_{epoch}.keras")),
          tf_keras.callbacks.ModelCheckpoint(
              os.path.join(directory, "best.weights.h5"),
              save_weights_only=True, save_best_only=True),
          tf_keras.callbacks.CSVLogger(os.path.join(directory, "log.csv")),
          tf_keras.callbacks.TensorBoard(os.path.join(directory, "tb")),
          # min_delta so large that no epoch improves on the first.
          tf_keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5,
                                               patience=0, min_delta=100),
          tf_keras.callbacks.EarlyStopping(monitor="val_loss", patience=100),
      ])
  return {"history": history.history, "files": sorted(os.listdir(directory)),
          "report": report_as_dict(strategy),
          "learning_rate": float(model.optimizer.learning_rate.numpy())}


def staleness_logged(directory, protocol, epochs=3, steps=10):
  """fit with StalenessLogger before a CSVLogger."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  _, strategy = connect_cluster(1, 3, protocol)
  x, y = synthetic_data()
  model = compiled_mlp(strategy, "sgd_momentum", "divide_by_n")
  history = model.fit(
      repeated_batches(x, y, 4), epochs=epochs, steps_per_epoch=steps, verbose=0,
      callbacks=[rudra_tf.StalenessLogger(), tf_keras.callbacks.CSVLogger(
          os.path.join(directory, "log.csv"))])
  return {"history": history.history, "report": report_as_dict(strategy)}
