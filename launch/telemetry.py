"""Progress lines, results JSON, TensorBoard logs and the PNG of a run."""

import json
import os
import time

import numpy as np
import tf_keras

from launch import progress as progress_lib


class ProgressCallback(tf_keras.callbacks.Callback):
  """Prints one line an epoch (tf_keras refuses verbose=1 under a ps strategy)
  and, inside it, a progress line every `progress_every_s` seconds
  (launch/progress.py; 0: none).

  loss, accuracy, updates/s, examples/s, mean and max staleness of the epoch;
  keeps the rows for the results and the plot, and writes TensorBoard
  scalars and the staleness histogram when `log_dir` is given.

  An epoch whose loss is NaN or infinite stops training (`diverged_epoch`):
  tf_keras's TerminateOnNaN reads per-batch logs, which a parameter-server
  fit does not give callbacks as numbers.
  """

  def __init__(self, strategy, minibatch, epochs, log_dir=None, out=print,
               progress_every_s=progress_lib.DEFAULT_EVERY_S):
    super().__init__()
    self._strategy = strategy
    self._minibatch = minibatch
    self._epochs = epochs
    self._out = out
    self.rows = []
    self.diverged_epoch = None
    self._last_report = None
    self._writer = None
    self._start = time.monotonic()
    self._in_epoch = progress_lib.EpochProgress(
        strategy.staleness_report, progress_every_s, out)
    if log_dir:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      self._writer = tf.summary.create_file_writer(log_dir)

  def on_epoch_begin(self, epoch, logs=None):
    self._epoch_start = time.monotonic()
    # After the first epoch, the previous epoch's closing report is current.
    if self._last_report is None:
      self._last_report = self._strategy.staleness_report()
    self._in_epoch.start(epoch + 1, self._epochs,
                         (self.params or {}).get("steps"), self._minibatch,
                         self._last_report)

  def on_train_end(self, logs=None):
    self.close()

  def close(self):
    """Stops the in-epoch lines (also when fit fails)."""
    self._in_epoch.stop()

  def on_epoch_end(self, epoch, logs=None):
    self._in_epoch.stop()
    logs = logs or {}
    seconds = time.monotonic() - self._epoch_start
    report = self._strategy.staleness_report()
    before, self._last_report = self._last_report, report
    counted = report.since(before)
    updates, gradients = counted["updates"], counted["gradients"]
    mean, largest = counted["staleness_mean"], counted["staleness_max"]
    row = {"epoch": epoch + 1, "wall_time_s": time.monotonic() - self._start,
           "loss": float(logs.get("loss", float("nan"))),
           "accuracy": float(logs.get("accuracy", float("nan"))),
           "updates_per_s": updates / seconds,
           "examples_per_s": gradients * self._minibatch / seconds,
           "staleness_mean": mean, "staleness_max": largest}
    self.rows.append(row)
    self._out(f"epoch {row['epoch']}/{self._epochs}: loss {row['loss']:.4f} "
              f"accuracy {row['accuracy']:.4f} | "
              f"{row['updates_per_s']:.1f} updates/s "
              f"{row['examples_per_s']:.0f} examples/s | staleness mean "
              f"{mean:.2f} max {largest}")
    if self._writer is not None:
      self._write_summaries(epoch + 1, row, report.histogram)
    if "loss" in logs and not np.isfinite(row["loss"]):
      self.diverged_epoch = row["epoch"]
      self.model.stop_training = True
      self._out(f"training diverged: the loss of epoch {row['epoch']} is "
                f"{row['loss']}; stopped. Try a lower --lr, "
                "--lr_policy=divide_by_n or divide_by_staleness, or "
                "--max_staleness.")

  def _write_summaries(self, step, row, histogram):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    with self._writer.as_default(step=step):
      for key in ("loss", "accuracy", "updates_per_s", "examples_per_s",
                  "staleness_mean", "staleness_max"):
        tf.summary.scalar(key, row[key])
      values = np.repeat(np.arange(len(histogram)), histogram)
      tf.summary.histogram("staleness", values, buckets=max(
          int(values.max(initial=0)) + 1, 1))
    self._writer.flush()


def write_results(path, results):
  """Writes strict JSON: a NaN or infinite number (a diverged run's loss)
  is written as null, which every JSON reader accepts."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  with open(path, "w") as stream:
    json.dump(_finite_or_none(results), stream, indent=2, default=_to_json,
              allow_nan=False)


def _finite_or_none(value):
  if isinstance(value, dict):
    return {key: _finite_or_none(item) for key, item in value.items()}
  if isinstance(value, (list, tuple)):
    return [_finite_or_none(item) for item in value]
  if isinstance(value, (float, np.floating)) and not np.isfinite(value):
    return None
  return value


def _to_json(value):
  if isinstance(value, np.ndarray):
    return value.tolist()
  if isinstance(value, np.generic):
    return value.item()
  raise TypeError(f"not JSON serializable: {type(value)}")


def plot_run(path, rows, test_accuracy, wall_time_s, histogram, title):
  """Accuracy against wall time, and the staleness histogram, in one PNG."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  figure, (left, right) = pyplot.subplots(1, 2, figsize=(11, 4))
  left.plot([r["wall_time_s"] for r in rows], [r["accuracy"] for r in rows],
            "o-", label="training accuracy (epoch)")
  left.plot([wall_time_s], [test_accuracy], "r*", markersize=12,
            label=f"test accuracy {test_accuracy:.4f}")
  left.set_xlabel("wall time (s)")
  left.set_ylabel("accuracy")
  left.legend(loc="lower right")
  left.grid(alpha=0.3)
  histogram = np.asarray(histogram)
  last = int(np.max(np.nonzero(histogram)[0], initial=0))
  right.bar(np.arange(last + 1), histogram[:last + 1])
  right.set_xlabel("staleness σ")
  right.set_ylabel("gradients")
  right.set_title("staleness histogram")
  figure.suptitle(title)
  figure.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  figure.savefig(path, dpi=100)
  pyplot.close(figure)
