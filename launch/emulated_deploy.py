r"""A launch.train deploy across emulated hosts: one task per host.

Each task runs the command a pod of a real deploy runs (docs/deploy.md):
`python -m launch.train FLAGS` with its TF_CONFIG, made by
launch.cluster_config from the hosts' addresses, every task on the same
port of its own host. Hosts: the chief on host 0, learner i on host 1 + i,
ps task j on host 1 + λ + j.

    with EmulatedHosts(1 + learners + ps, rate_mbit=20) as hosts:
      deploy = EmulatedDeploy(hosts, learners, ps, flags, log_dir)
      deploy.start()
      deploy.wait_for_line("chief", r"epoch 1/\d+ step [1-9]")
      hosts.set_link(deploy.host_of("worker", 0), up=False)
      codes = deploy.wait(timeout_s=600)
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

from launch import cluster_config

# The port every task listens on, on its own host (as in a real deploy).
TASK_PORT = 2222


class EmulatedDeploy:
  """launch.train's tasks on `hosts` (see the module docstring).

  Args:
    hosts: a started EmulatedHosts with at least 1 + learners + ps hosts.
    learners, ps: the cluster's worker and ps task counts.
    flags: launch.train flags every task gets (as in a real deploy).
    log_dir: each task's output goes to <log_dir>/<type>_<index>.log.
    env: extra environment of every task.
    module: the Python module each task runs (`python -m MODULE FLAGS`):
      launch.train, or a benchmark's task (benchmarks.task).
  """

  def __init__(self, hosts, learners, ps, flags, log_dir, env=None,
               module="launch.train"):
    needed = 1 + learners + ps
    if hosts.count < needed:
      raise ValueError(f"a deploy of 1 chief, {learners} learners and {ps} "
                       f"ps tasks needs {needed} hosts; got {hosts.count}.")
    self._hosts = hosts
    self._flags = list(flags)
    self._log_dir = log_dir
    self._env = dict(env or {})
    self._module = module
    self._tasks = [("chief", 0)] + [("worker", i) for i in range(learners)] + [
        ("ps", j) for j in range(ps)]
    self.cluster = cluster_config.cluster_from_addresses(
        self._address("chief", 0),
        [self._address("worker", i) for i in range(learners)],
        [self._address("ps", j) for j in range(ps)])
    self.processes = {}
    self._lines = {}
    self._readers = []

  def host_of(self, task_type, index):
    return self._tasks.index((task_type, index))

  def _address(self, task_type, index):
    return f"{self._hosts.address(self.host_of(task_type, index))}:{TASK_PORT}"

  def log_path(self, task_type, index):
    return os.path.join(self._log_dir, f"{task_type}_{index}.log")

  def start(self, tasks=None):
    """Starts every task (or those listed, as (type, index))."""
    os.makedirs(self._log_dir, exist_ok=True)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for task_type, index in tasks or self._tasks:
      config = {"cluster": self.cluster,
                "task": {"type": task_type, "index": index}}
      environment = dict(os.environ, PYTHONPATH=repo,
                         TF_CONFIG=json.dumps(config), **self._env)
      process = self._hosts.run(
          self.host_of(task_type, index),
          [sys.executable, "-m", self._module, *self._flags],
          env=environment, cwd=repo, stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT, text=True)
      name = (task_type, index)
      self.processes[name] = process
      self._lines[name] = []
      reader = threading.Thread(target=self._copy, daemon=True,
                                args=(process, name,
                                      self.log_path(task_type, index)))
      reader.start()
      self._readers.append(reader)

  def _copy(self, process, name, path):
    with open(path, "a", encoding="utf-8") as log:
      for line in process.stdout:
        log.write(line)
        log.flush()
        self._lines[name].append(line)

  def output(self, task_type, index=0):
    return "".join(self._lines.get((task_type, index), ()))

  def wait_for_line(self, task_type, pattern, index=0, timeout_s=300):
    """Waits until the task printed a line matching regex `pattern`."""
    deadline = time.monotonic() + timeout_s
    name = (task_type, index)
    while time.monotonic() < deadline:
      if any(re.search(pattern, line) for line in self._lines.get(name, ())):
        return
      process = self.processes[name]
      if process.poll() is not None and not self._reading(process):
        break
      time.sleep(0.1)
    raise TimeoutError(f"{task_type}:{index} printed no line matching "
                       f"{pattern!r}:\n{self.output(task_type, index)[-3000:]}")

  def _reading(self, process):
    return process.stdout is not None and not process.stdout.closed

  def run_until_chief_exits(self, timeout_s=3600):
    """Waits for the chief, then stops every other task (SIGTERM, as the
    local launcher does: a benchmark task writes its figures then);
    returns the chief's exit code."""
    code = self.processes[("chief", 0)].wait(timeout_s)
    for name, process in self.processes.items():
      if name != ("chief", 0) and process.poll() is None:
        try:
          os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
          pass
    self.wait(timeout_s=60)
    return code

  def wait(self, timeout_s=600):
    """Waits for every task; returns {(type, index): exit code}."""
    deadline = time.monotonic() + timeout_s
    codes = {}
    for name, process in self.processes.items():
      codes[name] = process.wait(max(1.0, deadline - time.monotonic()))
    for reader in self._readers:
      reader.join(10)
    return codes
