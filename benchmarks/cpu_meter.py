"""CPU time of one benchmark task over the chief's timed epoch.

Each task samples its own CPU time (all threads: user + system) against
CLOCK_MONOTONIC, which is one clock for every process on a Linux machine,
so the samples of every task line up with the chief's timed-epoch instants.
The CPU a task used between two instants is interpolated between the
samples around them (`cpu_seconds_between`). Summed over all tasks, it says
how much of the machine a contender used and what one gradient cost it:
the figures that tell a protocol's overhead from a machine that is simply
full.
"""

import bisect
import threading
import time

# Four samples a second: a timed epoch lasts seconds, so interpolation
# errs by well under 1% of it, and the sampling thread costs next to nothing.
SAMPLE_INTERVAL_S = 0.25


def cpu_seconds_between(samples, begin, end):
  """CPU seconds used between `begin` and `end` (monotonic seconds).

  `samples` are (monotonic time, cumulative CPU seconds) pairs in time
  order. Returns None unless they cover [begin, end]: a task that stopped
  sampling early has no figure rather than a wrong one.
  """
  if not samples or samples[0][0] > begin or samples[-1][0] < end:
    return None
  return _cpu_at(samples, end) - _cpu_at(samples, begin)


def _cpu_at(samples, instant):
  """Cumulative CPU at `instant`, linear between the samples around it."""
  times = [t for t, _ in samples]
  after = bisect.bisect_left(times, instant)
  if times[after] == instant:
    return samples[after][1]
  (t0, cpu0), (t1, cpu1) = samples[after - 1], samples[after]
  return cpu0 + (cpu1 - cpu0) * (instant - t0) / (t1 - t0)


class CpuMeter:
  """Samples this process's CPU time in a daemon thread, for its lifetime."""

  def __init__(self, interval_s=SAMPLE_INTERVAL_S):
    self._interval_s = interval_s
    self._samples = [self._now()]
    self._lock = threading.Lock()
    threading.Thread(target=self._run, daemon=True, name="cpu-meter").start()

  @staticmethod
  def _now():
    return (time.monotonic(), time.process_time())

  def _run(self):
    while True:  # a daemon thread: it ends with the task
      time.sleep(self._interval_s)
      with self._lock:
        self._samples.append(self._now())

  def samples(self):
    """Every sample so far, ending with one taken now."""
    with self._lock:
      self._samples.append(self._now())
      return list(self._samples)
