"""launch/tf_environment.py: the variables every task starts with (shared
cores) and the start-up notices left out."""

import os

import pytest

from launch import local_cluster
from launch import tf_environment


def test_cores_are_shared_among_the_tasks_that_compute():
  threads = tf_environment.INTRA_OP_THREADS_VARIABLE
  assert tf_environment.share_cores({}, 2, cores=2) == {threads: "1"}
  assert tf_environment.share_cores({}, 1, cores=2) == {threads: "2"}
  assert tf_environment.share_cores({}, 3, cores=16) == {threads: "5"}
  assert tf_environment.share_cores({}, 4, cores=2) == {threads: "1"}
  assert tf_environment.share_cores({threads: "7"}, 4, cores=2) == {
      threads: "7"}  # the user's own setting wins
  with pytest.raises(ValueError, match="computing_tasks must be >= 1, got 0"):
    tf_environment.share_cores({}, 0)

  def threads_of(cluster):
    os.remove(cluster.pids_path)  # never run: nothing else removes it
    return {f"{task}:0": cluster._environment_for(task, 0).get(threads)  # pylint: disable=protected-access
            for task in ("chief", "ps", "worker")}
  cores = tf_environment.available_cores()
  environment = {k: v for k, v in os.environ.items() if k != threads}
  # A parameter-server cluster: the learners share; chief and ps keep
  # TensorFlow's default.
  assert threads_of(local_cluster.LocalProcessCluster(
      ["true"], num_learners=2, num_ps=1, environment=environment)) == {
          "chief:0": None, "ps:0": None, "worker:0": str(max(1, cores // 2))}
  # The chief of an all-reduce cluster trains too.
  shares = threads_of(local_cluster.LocalProcessCluster(
      ["true"], num_learners=1, num_ps=1, environment=environment,
      chief_computes=True))
  assert shares["chief:0"] == shares["worker:0"] == str(max(1, cores // 2))
  # Learners on GPUs are left alone.
  assert threads_of(local_cluster.LocalProcessCluster(
      ["true"], num_learners=2, num_ps=1, gpus=2,
      environment=environment))["worker:0"] is None


def test_cuda_start_up_notices_are_recognized_and_nothing_else():
  noise = tf_environment.noise_on_machines_without_cuda
  # Printed by TensorFlow 2.21 on a machine without an NVIDIA driver.
  assert noise("WARNING: All log messages before absl::InitializeLog() is "
               "called are written to STDERR\n")
  assert noise("I0000 00:00:1796174480.384089   29545 cudart_stub.cc:31] "
               "Could not find cuda drivers on your machine, GPU will not be "
               "used.\n")
  assert noise("E0000 00:00:1796174487.330847   29543 cuda_platform.cc:52] "
               "failed call to cuInit: INTERNAL: CUDA error: Failed call to "
               "cuInit: UNKNOWN ERROR (303)\n")
  assert not noise("E0000 00:00:1796174487.330847   29543 "
                   "coordinator.cc:1] a real error\n")
  assert not noise("epoch 1/4: loss 0.7519 accuracy 0.7211\n")
  assert not noise("ps:0 serving on 127.0.0.1:37325\n")


# Printed by TensorFlow 2.21 at start-up on a CPU with oneDNN's custom ops.
_ONEDNN_LINE = ("I0000 00:00:1796174480.397132   29545 port.cc:153] oneDNN "
                "custom operations are on. You may see slightly different "
                "numerical results due to floating-point round-off errors "
                "from different computation orders. To turn them off, set the "
                "environment variable `TF_ENABLE_ONEDNN_OPTS=0`.\n")
_NO_CUDA_LINE = ("I0000 00:00:1796174480.384089   29545 cudart_stub.cc:31] "
                 "Could not find cuda drivers on your machine, GPU will not "
                 "be used.\n")


@pytest.mark.parametrize("level,driver,drops_onednn,drops_no_cuda", [
    (None, False, True, True),   # the launcher's default level, 2
    ("1", True, True, False),    # a driver: a CUDA notice is worth seeing
    ("0", False, False, True),   # INFO asked for: the oneDNN notice stays
])
def test_start_up_noise_by_log_level_and_driver(level, driver, drops_onednn,
                                                drops_no_cuda):
  environment = {} if level is None else {"TF_CPP_MIN_LOG_LEVEL": level}
  drop = tf_environment.startup_noise(environment, driver)
  assert drop(_ONEDNN_LINE) is drops_onednn
  assert drop(_NO_CUDA_LINE) is drops_no_cuda
  assert not drop("[chief:0] epoch 1/4 step 420/1875 | 19.1 updates/s\n")
  assert not drop("I0000 00:00:1796174480.397132   29545 port.cc:153] "
                  "another notice\n")
  assert tf_environment.startup_noise({"TF_CPP_MIN_LOG_LEVEL": "0"},
                                      True) is None
