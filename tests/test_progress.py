"""launch/progress.py: the in-epoch progress line, worked out by hand, and
the thread that prints it between an epoch's start and end."""

import re
import threading

import pytest

import tensorflow as tf

from launch import progress


def test_progress_line_golden_values():
  # 420 of 1875 steps and 210 updates in 11 s, μ = 32: 19.09 updates/s,
  # 420 * 32 / 11 = 1221.8 examples/s; 1455 steps left at 420 / 11 steps/s
  # = 38.1 s.
  assert progress.progress_line(
      epoch=1, epochs=4, step=420, steps=1875, seconds=11.0, updates=210,
      minibatch=32, staleness_mean=1.0234) == (
          "epoch 1/4 step 420/1875 | 19.1 updates/s 1222 examples/s | "
          "staleness mean 1.02 | 38 s left")


def test_progress_line_before_the_first_step_and_past_the_last():
  assert progress.progress_line(2, 3, 0, 100, 4.0, 0, 8, 0.0) == (
      "epoch 2/3 step 0/100 | 0.0 updates/s 0 examples/s | "
      "staleness mean 0.00 | ? s left")
  # A refused re-run push is counted as received: never past the epoch.
  assert progress.progress_line(1, 1, 103, 100, 10.0, 50, 8, 0.5) == (
      "epoch 1/1 step 100/100 | 5.0 updates/s 80 examples/s | "
      "staleness mean 0.50 | 0 s left")


class _Counts:
  """A StalenessReport's `since` (what EpochProgress reads of it)."""

  def __init__(self, gradients):
    self.gradients = gradients

  def since(self, before):
    return {"gradients": self.gradients - before.gradients,
            "updates": (self.gradients - before.gradients) // 2,
            "staleness_mean": 1.0}


def _first_two_lines(read_report, epoch, epochs, steps):
  """Runs an EpochProgress (every 0.01 s, μ = 4, the epoch began at 100
  gradients) until it printed two lines; returns it stopped, and its lines
  so far."""
  lines = []
  two_lines = threading.Event()

  def out(line):
    lines.append(line)
    if len(lines) == 2:
      two_lines.set()
  printer = progress.EpochProgress(read_report, every_s=0.01, out=out)
  printer.start(epoch=epoch, epochs=epochs, steps=steps, minibatch=4,
                start_report=_Counts(100))
  assert two_lines.wait(60), lines
  printer.stop()
  return printer, lines


def test_epoch_progress_prints_until_stopped_and_skips_failed_reads():
  reads = []

  def read_report():
    reads.append(None)
    if len(reads) == 1:  # a ps being restarted: nothing printed this time
      raise tf.errors.UnavailableError(None, None, "ps:0 is restarting")
    return _Counts(100 + 10 * len(reads))

  printer, lines = _first_two_lines(read_report, epoch=2, epochs=3,
                                    steps=1000)
  printed = len(lines)
  # The second read saw 20 gradients since the epoch began, the third 30.
  assert re.fullmatch(
      r"epoch 2/3 step 20/1000 \| [\d.]+ updates/s \d+ examples/s \| "
      r"staleness mean 1\.00 \| \d+ s left", lines[0]), lines[0]
  assert lines[1].startswith("epoch 2/3 step 30/1000 | ")
  printer.stop()  # stopping twice is harmless
  assert len(lines) == printed  # the thread has ended: nothing more


def test_epoch_progress_prints_the_step_0_line_once():
  # The first step traces the training function: several ticks may pass
  # before any gradient. One "step 0" line says the epoch began; the next
  # line is the first with gradients.
  reads = []

  def read_report():
    reads.append(None)
    return _Counts(100 if len(reads) <= 4 else 112)

  _, lines = _first_two_lines(read_report, epoch=1, epochs=1, steps=50)
  assert len(reads) >= 5
  assert lines[0].startswith("epoch 1/1 step 0/50 | ")
  assert lines[0].endswith("? s left")
  assert lines[1].startswith("epoch 1/1 step 12/50 | ")


def test_epoch_progress_off_and_bad_interval():
  printer = progress.EpochProgress(lambda: pytest.fail("read"), every_s=0)
  printer.start(1, 1, 10, 8, _Counts(0))  # 0: no thread, no read
  printer.stop()
  with pytest.raises(ValueError, match=r"every_s must be >= 0 \(0: no "
                     r"lines\), got -1"):
    progress.EpochProgress(lambda: None, every_s=-1)
