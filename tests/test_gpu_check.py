"""launch/gpu_check.py: where each learner's compute ops ran."""

import os
import subprocess
import sys

from tests.processes import REPO


def test_gpu_check_reads_where_each_learners_compute_ops_ran():
  from launch import gpu_check  # pylint: disable=g-import-not-at-top
  gpu_line = ("[worker:{0}] small_cnn/conv1/Conv2D: (Conv2D): "
              "/job:worker/replica:0/task:{0}/device:{1}:0\n")
  log = gpu_check.PlacementLog()
  assert log.read(gpu_line.format(0, "GPU"))
  assert log.read(gpu_line.format(1, "CPU"))
  assert log.read("[worker:1] I0000 ... placer.cc:162] x: (Conv2D): ...\n")
  assert log.read("[ps:0] Const: (Const): /job:ps/replica:0/task:0/"
                  "device:CPU:0\n")  # read, not counted
  assert not log.read("[chief:0] epoch 1/2: loss 2.30 accuracy 0.10\n")
  lines, ok = log.summary(gpus=1)
  assert not ok and lines[-1].startswith("gpu_check: FAIL")
  assert lines[0] == ("gpu_check: worker:0 compute ops: 1 on "
                      "/job:worker/replica:0/task:0/device:GPU:0")
  on_gpus = gpu_check.PlacementLog()
  for task in (0, 1):
    on_gpus.read(gpu_line.format(task, "GPU"))
  lines, ok = on_gpus.summary(gpus=1)
  assert ok and lines[-1] == ("gpu_check: PASS: every learner's compute ops "
                              "ran on its GPU")
  assert not gpu_check.PlacementLog().summary(gpus=0)[1]  # nothing logged


def test_gpu_check_runs_on_a_machine_without_gpus():
  environment = dict(os.environ, PYTHONPATH=REPO)
  environment.pop("TF_CONFIG", None)
  check = subprocess.run(
      [sys.executable, "-m", "launch.gpu_check", "--epochs=1",
       "--steps_per_epoch=6", "--minibatch=8"], cwd=REPO, env=environment,
      capture_output=True, text=True, timeout=300)
  out = check.stdout
  assert check.returncode == 0, out + check.stderr
  assert "gpu_check: nvidia-smi lists 0 GPU(s); TensorFlow 2.21." in out
  assert " sees 0\n" in out
  for task in (0, 1):
    assert (f"gpu_check: worker:{task} compute ops: " in out and
            f"on /job:worker/replica:0/task:{task}/device:CPU:0" in out), out
  assert ("gpu_check: PASS: every learner's compute ops ran on its CPU "
          "(no GPU on this machine)") in out
  assert "epoch 1/1: loss" in out and "updates/s" in out
  assert ": (Conv2D): " not in out  # the placer's lines are summarized
