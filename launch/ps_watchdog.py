"""PsWatchdog: the chief's check that every ps task still answers.

A ps task that dies is seen at once: its host refuses the chief's next RPC
and TensorFlow raises UnavailableError (launch/train.py turns it into
ParameterServerLostError). A ps host cut off from the network is not: the
chief's RPCs to it wait, without a deadline, and the fit hangs (measured on
emulated hosts, launch/emulated_hosts.py: no progress at all while a ps
host's link was down). The watchdog probes each ps task's port from a
thread; one that has not answered for `unreachable_timeout_s` is lost,
and `on_lost(["ps:0", ...])` runs (the chief reports it and exits, so the
same command resumes from the last checkpoint).

    answering ──probe fails──▶ silent since t ──answers──▶ answering
                                   │
                   now - t >= unreachable_timeout_s
                                   ▼
                               lost: on_lost(tasks), the watchdog stops
"""

import threading
import time

from launch import local_cluster

# Seconds between probes of every ps task.
PROBE_INTERVAL_S = 1.0
# A ps task silent this long is lost: longer than a network blip that
# gRPC rides out, far shorter than TCP's own give-up (about 15 minutes).
UNREACHABLE_TIMEOUT_S = 30.0


class PsWatchdog:
  """Probes `ps_addresses` ("host:port") until stopped or one is lost."""

  def __init__(self, ps_addresses, on_lost,
               unreachable_timeout_s=UNREACHABLE_TIMEOUT_S,
               probe_interval_s=PROBE_INTERVAL_S, clock=time.monotonic):
    if unreachable_timeout_s <= 0 or probe_interval_s <= 0:
      raise ValueError(
          "unreachable_timeout_s and probe_interval_s must be > 0, got "
          f"{unreachable_timeout_s} and {probe_interval_s}.")
    self._addresses = list(ps_addresses)
    self._on_lost = on_lost
    self._timeout_s = unreachable_timeout_s
    self._interval_s = probe_interval_s
    self._clock = clock
    self._silent_since = {}
    self._stop = threading.Event()
    self._thread = None

  def check(self, answers):
    """One round: `answers[i]` says whether ps task i answered. Returns the
    lost tasks (["ps:i", ...]); empty while none is."""
    now = self._clock()
    lost = []
    for index, answered in enumerate(answers):
      if answered:
        self._silent_since.pop(index, None)
        continue
      since = self._silent_since.setdefault(index, now)
      if now - since >= self._timeout_s:
        lost.append(f"ps:{index}")
    return lost

  def start(self):
    self._thread = threading.Thread(target=self._watch, daemon=True,
                                    name="ps-watchdog")
    self._thread.start()
    return self

  def stop(self):
    self._stop.set()
    if self._thread is not None:
      self._thread.join(5 * self._interval_s)

  def _watch(self):
    while not self._stop.wait(self._interval_s):
      lost = self.check([local_cluster.port_open(address)
                         for address in self._addresses])
      if lost:
        self._on_lost(lost)
        return
