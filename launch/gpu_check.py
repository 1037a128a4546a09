r"""The prepared GPU check: 2 learners with one GPU each, in under 5 minutes.

  python -m launch.gpu_check [extra launch.train flags]

Trains the small CNN on synthetic data with a local cluster of 1 ps and 2
learners (`--gpus` = the GPUs nvidia-smi lists, or TensorFlow sees if
more), and prints the GPUs each
learner sees, the device each learner's compute ops (convolutions, matrix
products and their gradients) were placed on, as TensorFlow's placer logged
them in that learner's task, and each epoch's updates/s and examples/s.
It runs unchanged on a CPU-only machine (and then says so). Exits 1 when
GPUs were found but a learner's compute ops did not run on one, and 2, with
the launcher's one-line error, when the driver lists GPUs that TensorFlow
cannot use (it needs CUDA 12's libraries: `pip install -e '.[gpu]'`).
"""

import collections
import os
import re
import subprocess
import sys
import threading

from launch import gpus as gpus_lib
from launch import tf_environment

TIMEOUT_S = 290  # the check must end within 5 minutes
# The placer's log line for one op, behind the local cluster's task prefix:
# "[worker:0] small_cnn/conv1/Conv2D: (Conv2D): /job:worker/.../device:GPU:0"
PLACEMENT = re.compile(r"^\[(?P<task>\w+:\d+)\] (?P<op>\S+): "
                       r"\((?P<type>\w+)\): (?P<device>/job:\S+)$")
# The ops that carry a learner's step: where they run is where it trains.
COMPUTE_OP_TYPES = frozenset({
    "Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput", "MatMul",
    "_FusedConv2D", "_FusedMatMul"})


class PlacementLog:
  """The devices each learner task's compute ops were placed on (the
  placement lines of other tasks and ops are read and dropped)."""

  def __init__(self):
    self.devices = collections.defaultdict(collections.Counter)

  def read(self, line):
    """Records `line` if it is a placement line; returns whether it was."""
    match = PLACEMENT.match(line.rstrip("\n"))
    if match is None:
      return "placer.cc" in line  # the same line again, through absl logging
    if match["task"].startswith("worker:") and \
        match["type"] in COMPUTE_OP_TYPES:
      self.devices[match["task"]][match["device"]] += 1
    return True

  def summary(self, gpus):
    """Lines to print, and whether every learner computed where it should."""
    lines, ok = [], bool(self.devices)
    for task in sorted(self.devices):
      placed = ", ".join(f"{count} on {device}" for device, count in
                         sorted(self.devices[task].items()))
      lines.append(f"gpu_check: {task} compute ops: {placed}")
      on_gpu = all("/device:GPU:" in d for d in self.devices[task])
      ok = ok and (on_gpu if gpus else not on_gpu)
    if not self.devices:
      lines.append("gpu_check: no learner placement was logged")
    expected = "its GPU" if gpus else "its CPU (no GPU on this machine)"
    if ok:
      lines.append(f"gpu_check: PASS: every learner's compute ops ran on "
                   f"{expected}")
    else:
      lines.append(f"gpu_check: FAIL: not every learner's compute ops ran "
                   f"on {expected}")
    return lines, ok


def main(argv):
  driver_gpus = gpus_lib.nvidia_smi_gpus()
  try:
    tensorflow_gpus, _, version = gpus_lib.tensorflow_gpus(dict(os.environ))
  except ValueError as error:
    print(f"gpu_check: FAIL: {error}", flush=True)
    return 2
  print(f"gpu_check: nvidia-smi lists {driver_gpus} GPU(s); TensorFlow "
        f"{version} sees {tensorflow_gpus}", flush=True)
  # The larger count: GPUs the driver lists but TensorFlow cannot open make
  # the launcher refuse with the fix, instead of a check that passes on CPU.
  gpus = max(driver_gpus, tensorflow_gpus)
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  command = [sys.executable, "-m", "launch.train", "--model=small_cnn",
             "--dataset=synthetic", "--learners=2", "--ps_tasks=1",
             "--protocol=async", "--epochs=2", "--steps_per_epoch=400",
             "--minibatch=64", f"--gpus={gpus}", *argv[1:]]
  environment = dict(os.environ, PYTHONPATH=repo)
  environment[tf_environment.PRINT_DEVICES_VARIABLE] = "1"
  placements = PlacementLog()
  with subprocess.Popen(command, cwd=repo, env=environment, text=True,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT) as job:
    # SIGTERM: the launcher then stops every task it started.
    deadline = threading.Timer(TIMEOUT_S, job.terminate)
    deadline.start()
    try:
      for line in job.stdout:
        if not placements.read(line):
          print(line, end="", flush=True)
      returncode = job.wait()
    finally:
      deadline.cancel()
  lines, ok = placements.summary(gpus)
  print("\n".join(lines), flush=True)
  return returncode or (0 if ok else 1)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
