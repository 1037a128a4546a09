"""Deterministic fault injection for local runs: kill a task at a chosen step.

`--kill_task=worker:1@40` makes the chief send SIGKILL to learner 1 once the
parameter server has received 40 gradients (counted over every run this one
resumed from). The local launcher's supervisor then does what
it does with any dead task (launch/local_cluster.py): restarts a learner,
fails the job for a ps task, ends it for the chief. The pids come from the
file the supervisor keeps up to date (RUDRA_TASK_PIDS).
"""

import json
import os
import signal
import threading

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


class KillTaskAtStep(tf_keras.callbacks.Callback):
  """Kills each planned task once the ps has received `step` gradients.

  tf_keras refuses batch-level callbacks under a parameter-server strategy,
  so a thread started with training reads the first shard's gradient count
  (`strategy.staleness_report()`, counted over every run this one resumed
  from) and fires each entry of the plan when the count reaches its step.

  Args:
    strategy: the RudraStrategy being trained.
    plan: (task type, index, step) entries (launch.flags.resolve_kill_tasks).
    out: fn(line) for what it does.
  """

  def __init__(self, strategy, plan, out=print):
    super().__init__()
    self._strategy = strategy
    self._pending = sorted(plan, key=lambda entry: entry[2])
    self._out = out
    self._done = threading.Event()
    self._thread = None

  def on_train_begin(self, logs=None):
    if self._pending and self._thread is None:
      self._thread = threading.Thread(target=self._watch, daemon=True,
                                      name="rudra-fault-injection")
      self._thread.start()

  def on_train_end(self, logs=None):
    self._done.set()

  def _watch(self):
    while self._pending and not self._done.wait(POLL_INTERVAL_S):
      received = self._strategy.staleness_report().gradients
      while self._pending and self._pending[0][2] <= received:
        task_type, index, step = self._pending.pop(0)
        name = f"{task_type}:{index}"
        self._out(f"fault injection: killing {name} at {received} gradients "
                  f"received (planned at {step})")
        pid = os.getpid() if task_type == "chief" else task_pids()[name]
        os.kill(pid, signal.SIGKILL)
