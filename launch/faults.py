"""Deterministic fault injection for local runs: kill a task at a chosen step.

`--kill_task=worker:1@40` makes the chief send SIGKILL to learner 1 once the
parameter server has received 40 gradients (counted over every run this one
resumed from). The local launcher's supervisor then does what
it does with any dead task (launch/local_cluster.py): restarts a learner,
fails the job for a ps task, ends it for the chief. The pids come from the
file the supervisor keeps up to date (RUDRA_TASK_PIDS).

A killed learner is followed until it serves again: the epoch it died in
(or the run, if it was the last) ends only once its restarted server
accepts connections, so a fault-injection run never finishes before the
recovery it exists to show (on a slow machine the other learners could
otherwise train every remaining step while the new process still imports
TensorFlow).
"""

import json
import os
import signal
import threading
import time

import tf_keras

from launch import local_cluster


def task_pids():
  """{"worker:1": pid, ...} of the local cluster this process belongs to."""
  path = os.environ.get(local_cluster.PIDS_ENVIRONMENT_VARIABLE)
  if not path:
    raise ValueError("--kill_task works only in a local cluster started by "
                     "launch/train.py (no TF_CONFIG): it needs the task pids "
                     "the launcher records.")
  with open(path) as f:
    return json.load(f)


# How often the injector reads the gradient count on the ps.
POLL_INTERVAL_S = 0.02
# How long an epoch's end waits for a killed learner to serve again: the
# launcher's restart delay plus a TensorFlow import on a loaded machine, with
# room to spare. Past it the run goes on and says so.
REJOIN_TIMEOUT_S = 180


class KillTaskAtStep(tf_keras.callbacks.Callback):
  """Kills each planned task once the ps has received `step` gradients.

  tf_keras refuses batch-level callbacks under a parameter-server strategy,
  so a thread started with training reads the first shard's gradient count
  (`strategy.staleness_report()`, counted over every run this one resumed
  from) and fires each entry of the plan when the count reaches its step.
  At each epoch's end (and the run's) it waits until every learner it killed
  serves again: a new pid in the launcher's pid file and its port open.

  Args:
    strategy: the RudraStrategy being trained.
    plan: (task type, index, step) entries (launch.flags.resolve_kill_tasks).
    cluster: the cluster spec as a dict (job -> addresses), to find a
      restarted learner's port.
    out: fn(line) for what it does.
  """

  def __init__(self, strategy, plan, cluster, out=print):
    super().__init__()
    self._strategy = strategy
    self._cluster = cluster
    self._pending = sorted(plan, key=lambda entry: entry[2])
    self._out = out
    self._done = threading.Event()
    self._thread = None
    self._lock = threading.Lock()
    self._awaiting_rejoin = {}  # "worker:1" -> the pid that was killed

  def on_train_begin(self, logs=None):
    # A resumed run may call fit twice (the rest of an epoch, then the
    # others): the watch goes on in each.
    self._done.clear()
    if self._pending and self._thread is None:
      self._thread = threading.Thread(target=self._watch, daemon=True,
                                      name="rudra-fault-injection")
      self._thread.start()

  def on_epoch_end(self, epoch, logs=None):
    self._wait_for_rejoins()

  def on_train_end(self, logs=None):
    self._done.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
    self._wait_for_rejoins()

  def _watch(self):
    while self._pending and not self._done.wait(POLL_INTERVAL_S):
      received = self._strategy.staleness_report().gradients
      while self._pending and self._pending[0][2] <= received:
        task_type, index, step = self._pending.pop(0)
        name = f"{task_type}:{index}"
        self._out(f"fault injection: killing {name} at {received} gradients "
                  f"received (planned at {step})")
        pid = os.getpid() if task_type == "chief" else task_pids()[name]
        if task_type == "worker":
          with self._lock:
            self._awaiting_rejoin[name] = pid
        os.kill(pid, signal.SIGKILL)

  def _wait_for_rejoins(self):
    with self._lock:
      awaiting, self._awaiting_rejoin = self._awaiting_rejoin, {}
    for name, killed_pid in awaiting.items():
      start = time.monotonic()
      task_type, index = name.split(":")
      pid = _wait_until_serving_again(
          name, killed_pid, self._cluster[task_type][int(index)],
          start + REJOIN_TIMEOUT_S)
      waited = time.monotonic() - start
      if pid is None:
        self._out(f"fault injection: {name} did not serve again within "
                  f"{REJOIN_TIMEOUT_S} s; training goes on without it")
      else:
        self._out(f"fault injection: {name} serves again (pid {pid}; "
                  f"waited {waited:.1f} s at the epoch's end)")


def _wait_until_serving_again(name, killed_pid, address, deadline):
  """The restarted task's pid once `address` accepts connections, or None."""
  while time.monotonic() < deadline:
    try:
      pid = task_pids().get(name)
    except OSError:  # The launcher removed it: the job is stopping.
      pid = None
    # A new pid first: the killed process's port may not be closed yet.
    if pid not in (None, killed_pid) and local_cluster.port_open(address):
      return pid
    time.sleep(POLL_INTERVAL_S * 10)
  return None
