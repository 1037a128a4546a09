r"""The prepared GPU check: 2 learners with one GPU each, in under 5 minutes.

  python -m launch.gpu_check

Trains the small CNN on synthetic data with a local cluster of 1 ps and 2
learners (`--gpus` = the GPUs found), and prints the GPUs each learner sees,
the devices the learners' steps run on, and the updates/s and examples/s.
It runs unchanged on a CPU-only machine (and then says so).
"""

import os
import subprocess
import sys


def visible_gpus():
  try:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                         text=True, timeout=30).stdout
  except (OSError, subprocess.TimeoutExpired):
    return 0
  return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def main():
  gpus = visible_gpus()
  print(f"gpu_check: {gpus} GPU(s) found by nvidia-smi", flush=True)
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  command = [sys.executable, "-m", "launch.train", "--model=small_cnn",
             "--dataset=synthetic", "--learners=2", "--ps_tasks=1",
             "--protocol=async", "--epochs=2", "--steps_per_epoch=400",
             "--minibatch=64", f"--gpus={gpus}"]
  environment = dict(os.environ, PYTHONPATH=repo,
                     RUDRA_PRINT_DEVICES="1")
  return subprocess.call(command, cwd=repo, env=environment, timeout=290)


if __name__ == "__main__":
  sys.exit(main())
