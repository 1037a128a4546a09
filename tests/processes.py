"""Starting launch/train.py jobs as processes, and checking none survives."""

import os
import subprocess
import sys

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A job that trains in seconds: 2 learners, 12 async steps of a small MLP.
SMALL_JOB = ["--model=mlp", "--dataset=synthetic", "--learners=2",
             "--ps_tasks=1", "--protocol=async", "--epochs=1",
             "--steps_per_epoch=12", "--minibatch=8"]


def launch(args, env_extra=None, **popen):
  """Starts `python -m launch.train ARGS` (no TF_CONFIG unless given)."""
  environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
  environment.pop("TF_CONFIG", None)
  environment.update(env_extra or {})
  return subprocess.Popen([sys.executable, "-m", "launch.train", *args],
                          cwd=REPO, env=environment, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, **popen)


def descendants(process):
  try:
    return psutil.Process(process.pid).children(recursive=True)
  except psutil.NoSuchProcess:
    return []


def assert_all_gone(children):
  gone, alive = psutil.wait_procs(children, timeout=15)
  assert not alive, f"orphan processes: {alive}"
  assert len(gone) == len(children)
