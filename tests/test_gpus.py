"""launch/gpus.py: each learner's GPU and the GPUs TensorFlow can use."""

import os

import pytest

from launch import gpus
from launch import local_cluster
from launch import tf_environment
from tests.processes import SMALL_JOB, launch


def test_learners_get_one_gpu_each_round_robin():
  def gpu_environment(num_learners, gpus):
    cluster = local_cluster.LocalProcessCluster(
        ["true"], num_learners=num_learners, num_ps=1, gpus=gpus,
        environment={})
    os.remove(cluster.pids_path)  # never run: nothing else removes it
    return {f"{task}:{index}": (
        environment.get("CUDA_VISIBLE_DEVICES"),
        environment.get(tf_environment.GPU_ALLOW_GROWTH_VARIABLE))
            for task, count in (("chief", 1), ("ps", 1),
                                ("worker", num_learners))
            for index in range(count)
            for environment in [cluster._environment_for(task, index)]}  # pylint: disable=protected-access
  assert gpu_environment(2, 2) == {
      "chief:0": ("", None), "ps:0": ("", None),
      "worker:0": ("0", None), "worker:1": ("1", None)}
  # Two learners on one GPU share it: each takes memory as it needs it.
  assert gpu_environment(3, 2) == {
      "chief:0": ("", None), "ps:0": ("", None), "worker:0": ("0", "true"),
      "worker:1": ("1", "true"), "worker:2": ("0", "true")}
  assert gpu_environment(2, 0) == {
      "chief:0": (None, None), "ps:0": (None, None),
      "worker:0": (None, None), "worker:1": (None, None)}


def test_learners_get_the_gpus_the_launchers_cuda_visible_devices_lists():
  # A launcher run under CUDA_VISIBLE_DEVICES=2,5,7 with --gpus=2 hands out
  # its first two ids round-robin and never the GPUs it was not given.
  listed = {"CUDA_VISIBLE_DEVICES": "2, 5,7"}
  assert [gpus.learner_device_id(learner, 2, listed)
          for learner in range(3)] == ["2", "5", "2"]
  assert gpus.learner_device_id(1, 2, {}) == "1"  # unset: every GPU
  cluster = local_cluster.LocalProcessCluster(
      ["true"], num_learners=2, num_ps=1, gpus=2, environment=listed)
  os.remove(cluster.pids_path)  # never run: nothing else removes it
  assert [cluster._environment_for("worker", index)["CUDA_VISIBLE_DEVICES"]  # pylint: disable=protected-access
          for index in (0, 1)] == ["2", "5"]
  with pytest.raises(ValueError) as error:
    local_cluster.LocalProcessCluster(
        ["true"], num_learners=2, num_ps=1, gpus=4, environment=listed)
  assert str(error.value) == (
      "--gpus=4 asks for 4 GPU(s), but CUDA_VISIBLE_DEVICES='2, 5,7' "
      "allows 3; pass --gpus=3 or fewer, or list more GPUs in "
      "CUDA_VISIBLE_DEVICES.")


@pytest.mark.parametrize("requested,environment,seen,driver,cuda,expected", [
    (2, {}, 2, 2, True, None),
    (1, {"CUDA_VISIBLE_DEVICES": "1"}, 1, 4, True, None),
    # The driver lists GPUs that TensorFlow cannot open: the fix is the
    # CUDA libraries, not the flag.
    (2, {}, 0, 2, True,
     "--gpus=2 asks for 2 GPU(s), but nvidia-smi lists 2 while TensorFlow "
     "2.21.0 sees none: its CUDA 12 libraries are missing or do not load; "
     "install them with pip install -e '.[gpu]' "
     "(tensorflow[and-cuda]==2.21.*), or pass --gpus=0 to train on the "
     "CPU."),
    (1, {}, 0, 1, False,
     "--gpus=1 asks for 1 GPU(s), but nvidia-smi lists 1 while TensorFlow "
     "2.21.0 sees none: it is built without CUDA; install TensorFlow's "
     "CUDA build with pip install -e '.[gpu]' "
     "(tensorflow[and-cuda]==2.21.*), or pass --gpus=0 to train on the "
     "CPU."),
    (4, {}, 2, 2, True,
     "--gpus=4 asks for 4 GPU(s), but TensorFlow 2.21.0 sees 2 GPU(s) on "
     "this machine; pass --gpus=2 or fewer."),
    (1, {}, 0, 0, True,
     "--gpus=1 asks for 1 GPU(s), but TensorFlow 2.21.0 sees 0 GPU(s) on "
     "this machine; pass --gpus=0 to train on the CPU."),
    (1, {"CUDA_VISIBLE_DEVICES": ""}, 0, 2, True,
     "--gpus=1 asks for 1 GPU(s), but CUDA_VISIBLE_DEVICES='' allows 0; "
     "pass --gpus=0 or fewer, or list more GPUs in CUDA_VISIBLE_DEVICES."),
])
def test_gpus_tensorflow_cannot_use_are_named_with_the_fix(
    requested, environment, seen, driver, cuda, expected):
  assert gpus.shortage_message(requested, environment, seen, driver, cuda,
                               "2.21.0") == expected


def test_more_gpus_than_tensorflow_sees_are_refused_before_any_server():
  # No machine this runs on has 64 GPUs, so every one refuses; on this
  # project's CPU-only machines TensorFlow sees none.
  bad = launch(SMALL_JOB + ["--gpus=64"])
  out, _ = bad.communicate(timeout=120)
  assert bad.returncode == 2, out
  last = out.strip().splitlines()[-1]
  assert last.startswith("error: --gpus=64 asks for 64 GPU(s), but "), out
  assert "pass --gpus=" in last and "serving on" not in out, out
