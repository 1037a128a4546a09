"""Progress lines inside an epoch, so that a long epoch is not silent.

tf_keras refuses `verbose=1` and batch-level callbacks under a
parameter-server strategy, so the chief cannot count its own steps: it
reads the shards' counters instead (one small RPC per shard), from a thread
of its own, every `every_s` seconds of an epoch:

    epoch 1/4 step 420/1875 | 38.2 updates/s 1344 examples/s | staleness mean 1.02 | 38 s left

A step is one gradient received (each learner step pushes one), so
`step` counts the gradients since the epoch began; examples/s is that
times μ per second, and the time left assumes the epoch's rate so far.

States of `EpochProgress` (one thread per epoch):

    idle --start()--> printing --stop()--> idle
                        |  every every_s: read the counters, print a line
                        |  (a read that fails, e.g. a ps being restarted,
                        |   prints nothing that time; while no gradient has
                        |   arrived, only the first tick prints: the first
                        |   step traces the training function, which can
                        |   take several ticks)
"""

import threading
import time

# Between two in-epoch lines, by default (launch.train --progress_every_s).
DEFAULT_EVERY_S = 5.0


def progress_line(epoch, epochs, step, steps, seconds, updates, minibatch,
                  staleness_mean):
  """One in-epoch line (pure).

  `step` gradients and `updates` updates in `seconds` since the epoch began,
  of `steps` in the epoch; μ = `minibatch`.
  """
  step = min(step, steps)  # a re-run closure's refused push is counted too
  rate = step / seconds if seconds > 0 else 0.0
  left = f"{(steps - step) / rate:.0f} s left" if rate > 0 else "? s left"
  updates_per_s = updates / seconds if seconds > 0 else 0.0
  return (f"epoch {epoch}/{epochs} step {step}/{steps} | "
          f"{updates_per_s:.1f} updates/s {rate * minibatch:.0f} examples/s | "
          f"staleness mean {staleness_mean:.2f} | {left}")


class EpochProgress:
  """Prints `progress_line` every `every_s` seconds between start and stop.

  `read_report()` returns the strategy's `StalenessReport` (chief side);
  `out` takes each line.
  """

  def __init__(self, read_report, every_s=DEFAULT_EVERY_S, out=print):
    if every_s < 0:
      raise ValueError(f"every_s must be >= 0 (0: no lines), got {every_s}.")
    self._read_report = read_report
    self._every_s = every_s
    self._out = out
    self._stop = None
    self._thread = None

  def start(self, epoch, epochs, steps, minibatch, start_report):
    """Begins epoch `epoch` (1-based) of `steps` steps; `start_report` is
    the report read as it began."""
    self.stop()
    if not self._every_s or not steps:
      return
    stop = self._stop = threading.Event()
    began = time.monotonic()

    def print_until_stopped():
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      printed_nothing_counted = False
      while not stop.wait(self._every_s):
        try:
          counted = self._read_report().since(start_report)
        except tf.errors.OpError:
          continue  # a ps being restarted: the next tick may read it
        if stop.is_set():
          return
        if not counted["gradients"]:
          if printed_nothing_counted:
            continue  # the same "step 0" line again says nothing new
          printed_nothing_counted = True
        self._out(progress_line(
            epoch, epochs, counted["gradients"], steps,
            time.monotonic() - began, counted["updates"], minibatch,
            counted["staleness_mean"]))
    self._thread = threading.Thread(target=print_until_stopped, daemon=True,
                                    name="rudra-epoch-progress")
    self._thread.start()

  def stop(self):
    """Ends the epoch's lines (and waits for the thread)."""
    if self._stop is not None:
      self._stop.set()
      self._thread.join()
      self._stop = self._thread = None
