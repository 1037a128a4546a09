"""launch/ps_watchdog.py: when a silent ps task counts as lost (a clock
and answers given by hand), and the thread's verdict on a real port."""

import socket
import threading

import pytest

from launch import ps_watchdog


class FakeClock:

  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def test_a_ps_task_is_lost_after_the_timeout_of_silence_only():
  # Timeout 30 s. ps:0 is silent from t = 100 (answers again at 120, so
  # its silence restarts at 125); ps:1 is silent from 110 on: lost at 140.
  clock = FakeClock()
  watchdog = ps_watchdog.PsWatchdog(["a:1", "b:2"], on_lost=None,
                                    unreachable_timeout_s=30, clock=clock)
  trajectory = [(100, [False, True], []), (110, [False, False], []),
                (120, [True, False], []), (125, [False, False], []),
                (139, [False, False], []), (140, [False, False], ["ps:1"]),
                (155, [False, False], ["ps:0", "ps:1"])]
  for now, answers, lost in trajectory:
    clock.now = now
    assert watchdog.check(answers) == lost, now


def test_bad_settings_are_refused():
  with pytest.raises(ValueError, match="must be > 0, got 0 and 1"):
    ps_watchdog.PsWatchdog(["a:1"], on_lost=None, unreachable_timeout_s=0,
                           probe_interval_s=1)


def test_the_thread_reports_a_port_that_stops_answering():
  listener = socket.socket()
  listener.bind(("127.0.0.1", 0))
  listener.listen()
  address = f"127.0.0.1:{listener.getsockname()[1]}"
  verdicts = []
  reported = threading.Event()
  watchdog = ps_watchdog.PsWatchdog(
      [address], on_lost=lambda tasks: (verdicts.append(tasks),
                                        reported.set()),
      unreachable_timeout_s=0.3, probe_interval_s=0.05).start()
  try:
    assert not reported.wait(0.6)  # it answers: never lost
    listener.close()  # now nothing listens there
    assert reported.wait(10)
    assert verdicts == [["ps:0"]]
  finally:
    watchdog.stop()
