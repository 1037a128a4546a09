"""Runs every task of a cluster as a separate OS process on 127.0.0.1.

Pure Python (no TensorFlow import): the supervisor stays light and cannot be
wedged by a TensorFlow runtime. Guarantees no orphan process:

* each child asks Linux to SIGKILL it when the supervisor dies
  (PR_SET_PDEATHSIG), so even `kill -9` of the supervisor leaves none;
* the supervisor stops every task when the chief finishes, when a ps task
  dies, when a learner dies more often than it may be restarted, and on
  SIGINT / SIGTERM.

Task lifecycle (a small state machine, per task):

    STARTING --port accepts--> SERVING --exit--> EXITED
       \\__________________exit before serving____/

What an unexpected exit (non-zero code, or a signal) does:

    learner (worker)  restarted with the same TF_CONFIG, up to
                      `learner_restarts` times per task; TensorFlow's
                      coordinator re-runs its closure and takes it back
                      when it serves again. Beyond that: the job fails.
    ps                the job fails at once (its variables are gone); run
                      the same command with the same --checkpoint_dir to
                      resume from the last checkpoint.
    chief             the job ends with the chief's exit code; the same
                      command resumes from the last checkpoint.

The supervisor writes every task's current pid to a JSON file named by
RUDRA_TASK_PIDS in every task's environment (fault injection reads it).
"""

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import portpicker

from launch import gpus as gpus_lib
from launch import tf_environment

_PR_SET_PDEATHSIG = 1
# How long a task may take to open its port (TensorFlow import + server).
STARTUP_TIMEOUT_S = 120
# Grace period between SIGTERM and SIGKILL when stopping tasks.
STOP_GRACE_S = 5
# Pause before a dead learner is started again (lets its port be released).
LEARNER_RESTART_DELAY_S = 1.0
PIDS_ENVIRONMENT_VARIABLE = "RUDRA_TASK_PIDS"


class TaskFailedError(RuntimeError):
  """A task exited with an error, or never started serving."""


def _task_failed(task, code):
  hint = ("; run the same command again with the same --checkpoint_dir to "
          "resume from the last checkpoint"
          if task.name.startswith("ps") else "")
  return TaskFailedError(f"task {task.name} exited with code {code} before "
                         f"the chief finished{hint}")


def make_cluster_spec(num_learners, num_ps, host="127.0.0.1"):
  """A cluster spec with a chief, λ workers and the ps tasks on free ports.

  A job with no task is left out (MultiWorkerMirroredStrategy: no ps).
  """
  def addresses(count):
    return [f"{host}:{portpicker.pick_unused_port()}" for _ in range(count)]
  spec = {"chief": addresses(1), "worker": addresses(num_learners),
          "ps": addresses(num_ps)}
  return {job: tasks for job, tasks in spec.items() if tasks}


def tf_config_for(cluster, task_type, task_index):
  return json.dumps({"cluster": cluster,
                     "task": {"type": task_type, "index": task_index}})


# What probe_port finds at an address.
PORT_OPEN = "open"
PORT_REFUSED = "refused"  # the host answered: nothing listens there
PORT_UNREACHABLE = "unreachable"  # no answer: the network, or no such host


def probe_port(address, timeout=0.5):
  """PORT_OPEN, PORT_REFUSED or PORT_UNREACHABLE for "host:port"."""
  host, port = address.rsplit(":", 1)
  try:
    with socket.create_connection((host, int(port)), timeout=timeout):
      return PORT_OPEN
  except ConnectionRefusedError:
    return PORT_REFUSED
  except OSError:
    return PORT_UNREACHABLE


def port_open(address, timeout=0.5):
  return probe_port(address, timeout) == PORT_OPEN


def _die_with_parent():
  libc = ctypes.CDLL("libc.so.6", use_errno=True)
  libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Task:
  """One child process, its log streamed with a `[type:index]` prefix."""

  def __init__(self, task_type, index, address, command, environment, out,
               drop_line=None):
    self.name = f"{task_type}:{index}"
    self._drop_line = drop_line or (lambda line: False)
    self.address = address
    self.process = subprocess.Popen(
        command, env=environment, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        preexec_fn=_die_with_parent, text=True, bufsize=1)
    self._out = out
    self._reader = threading.Thread(target=self._stream, daemon=True)
    self._reader.start()

  def _stream(self):
    for line in self.process.stdout:
      if self._drop_line(line):
        continue
      self._out.write(f"[{self.name}] {line}")
      self._out.flush()

  def poll(self):
    return self.process.poll()

  def stop(self):
    if self.process.poll() is None:
      self.process.terminate()

  def kill(self):
    if self.process.poll() is None:
      self.process.kill()

  def wait_output(self):
    self._reader.join(timeout=5)


class LocalProcessCluster:
  """Starts ps and worker tasks, then the chief; supervises all of them.

  Args:
    command: argv of the training script; each task runs it with its own
      TF_CONFIG in the environment.
    num_learners, num_ps: cluster size.
    gpus: GPUs to hand out round-robin, one per learner, through
      CUDA_VISIBLE_DEVICES (the first `gpus` ids that `environment`'s own
      CUDA_VISIBLE_DEVICES lists, if it sets one: `gpus.learner_device_id`);
      0 leaves the environment as it is. The chief and
      ps tasks never see a GPU when gpus > 0. With more learners than GPUs,
      learners share them and take GPU memory as they need it
      (TF_FORCE_GPU_ALLOW_GROWTH, unless the environment sets it).
    learner_restarts: how many times each learner task that dies is started
      again before its death fails the job.
    chief_computes: the chief trains too (MultiWorkerMirroredStrategy), so
      it shares the cores with the learners.

  Without GPUs, every task that computes (each learner, and the chief when
  `chief_computes`) gets an equal share of this machine's cores as its
  intra-op thread pool (`tf_environment.share_cores`), unless the
  environment sets TF_NUM_INTRAOP_THREADS itself. TensorFlow's start-up
  notices that its log level does not hide are left out of the streamed
  logs (`tf_environment.startup_noise`): on a machine without an NVIDIA
  driver, that every task found none; unless TF_CPP_MIN_LOG_LEVEL is 0,
  that oneDNN operations are on.
  """

  def __init__(self, command, num_learners, num_ps, gpus=0, out=sys.stdout,
               environment=None, learner_restarts=0, chief_computes=False):
    self.cluster = make_cluster_spec(num_learners, num_ps)
    self._command = list(command)
    self._gpus = gpus
    self._out = out
    self._environment = dict(
        os.environ if environment is None else environment)
    if gpus > 0:  # refuses more GPUs than CUDA_VISIBLE_DEVICES lists
      gpus_lib.learner_device_id(0, gpus, self._environment)
    self._learner_restarts = learner_restarts
    self._chief_computes = chief_computes
    self._restarts = {}
    handle, self.pids_path = tempfile.mkstemp(prefix="rudra_pids_",
                                              suffix=".json")
    os.close(handle)
    self._environment[PIDS_ENVIRONMENT_VARIABLE] = self.pids_path
    # TensorFlow's start-up notices that its log level does not hide.
    self._drop_line = tf_environment.startup_noise(
        self._environment, gpus_lib.nvidia_driver_installed())
    self.tasks = []

  def _environment_for(self, task_type, index):
    environment = dict(self._environment)
    environment["TF_CONFIG"] = tf_config_for(self.cluster, task_type, index)
    tf_environment.apply_defaults(environment)
    computes = task_type == "worker" or (
        task_type == "chief" and self._chief_computes)
    if computes and self._gpus == 0:
      computing_tasks = len(self.cluster.get("worker", ())) + (
          1 if self._chief_computes else 0)
      tf_environment.share_cores(environment, computing_tasks)
    environment.setdefault("PYTHONUNBUFFERED", "1")
    if self._gpus > 0:
      environment[gpus_lib.CUDA_VISIBLE_DEVICES] = (
          gpus_lib.learner_device_id(index, self._gpus, self._environment)
          if task_type == "worker" else "")
      if task_type == "worker" and len(self.cluster["worker"]) > self._gpus:
        environment.setdefault(tf_environment.GPU_ALLOW_GROWTH_VARIABLE,
                               "true")
    return environment

  def _start(self, task_type, index):
    task = Task(task_type, index, self.cluster[task_type][index],
                self._command, self._environment_for(task_type, index),
                self._out, self._drop_line)
    self.tasks.append(task)
    self._write_pids()
    return task

  def _write_pids(self):
    pids = {task.name: task.process.pid for task in self.tasks
            if task.poll() is None}
    partial = self.pids_path + ".tmp"
    with open(partial, "w") as f:
      json.dump(pids, f)
    os.replace(partial, self.pids_path)

  def _say(self, message):
    self._out.write(f"[launcher] {message}\n")
    self._out.flush()

  def _check_alive(self):
    for task in list(self.tasks):
      code = task.poll()
      # A task that ends cleanly (code 0, e.g. a synchronous worker done
      # with its own fit) is not a failure; the chief decides the result.
      if not code or task.name.startswith("chief"):
        continue
      if task.name.startswith("worker"):
        done = self._restarts.get(task.name, 0)
        if done < self._learner_restarts:
          self._restarts[task.name] = done + 1
          self._say(f"task {task.name} exited with code {code}; restarting "
                    f"it ({done + 1} of {self._learner_restarts} restarts)")
          task.wait_output()
          self.tasks.remove(task)
          time.sleep(LEARNER_RESTART_DELAY_S)
          self._start("worker", int(task.name.split(":")[1]))
          continue
      raise _task_failed(task, code)

  def _raise_if_a_ps_died(self):
    """After a failed chief: a ps that died first is the cause to name."""
    for task in self.tasks:
      code = task.poll()
      if code and task.name.startswith("ps"):
        raise _task_failed(task, code)

  def run(self):
    """Runs the job; returns the chief's exit code. Always stops every task."""
    previous = {sig: signal.signal(sig, self._on_signal)
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
      servers = [self._start(job, i) for job in ("ps", "worker")
                 for i in range(len(self.cluster.get(job, ())))]
      deadline = time.monotonic() + STARTUP_TIMEOUT_S
      for task in servers:
        while not port_open(task.address):
          self._check_alive()
          if time.monotonic() > deadline:
            raise TaskFailedError(
                f"task {task.name} did not open {task.address} within "
                f"{STARTUP_TIMEOUT_S} s")
          time.sleep(0.2)
      chief = self._start("chief", 0)
      while chief.poll() is None:
        self._check_alive()
        time.sleep(0.2)
      chief.wait_output()
      if chief.poll():
        self._raise_if_a_ps_died()
      return chief.poll()
    finally:
      self.shutdown()
      for sig, handler in previous.items():
        signal.signal(sig, handler)

  def _on_signal(self, signum, frame):
    del frame
    raise KeyboardInterrupt(f"signal {signum}")

  def shutdown(self):
    if os.path.exists(self.pids_path):
      os.remove(self.pids_path)
    for task in self.tasks:
      task.stop()
    deadline = time.monotonic() + STOP_GRACE_S
    for task in self.tasks:
      try:
        task.process.wait(max(0.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        task.kill()
        task.process.wait()
