"""launch/train.py: flag validation, TF_CONFIG, and the multi-process cluster."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import types

import pytest
from absl import flags as absl_flags

from launch import flags as launch_flags
from launch import gpus
from launch import local_cluster
from launch import tf_environment
from tests import scenarios
from tests.processes import REPO, assert_all_gone, descendants, launch
from tests.support import run_in_fresh_process

SMALL_JOB = ["--model=mlp", "--dataset=synthetic", "--learners=2",
             "--ps_tasks=1", "--protocol=async", "--epochs=1",
             "--steps_per_epoch=12", "--minibatch=8"]


def flag_values(**overrides):
  values = dict(model="small_cnn", dataset="synthetic", data_dir=None,
                manual_dir=None, protocol="2-softsync", lr=0.1, momentum=0.9,
                lr_policy="divide_by_n", minibatch=None, global_batch=None,
                epochs=1, steps_per_epoch=None, max_staleness=None,
                checkpoint_dir=None, log_dir=None, results=None, seed=0,
                gpus=0, steps_per_execution=1, emulated_step_ms=[],
                learner_restarts=3, kill_task=[], save_model=None,
                checkpoint_every_steps=None, checkpoint_every_secs=None)
  values.update(overrides)
  return types.SimpleNamespace(**values)


@pytest.mark.parametrize("overrides,learners,ps,fragment", [
    (dict(model="vgg"), 4, 1, "--model='vgg' is unknown; valid models"),
    (dict(dataset="mnist"), 4, 1, "valid datasets are"),
    ({}, 0, 1, "--learners must be >= 1"),
    ({}, 4, 0, "--ps_tasks must be >= 1"),
    (dict(protocol="5-softsync"), 4, 1, "n = 5"),
    (dict(lr_policy="half"), 4, 1, "Unknown lr_policy 'half'"),
    (dict(lr=0.0), 4, 1, "--lr must be > 0"),
    (dict(momentum=1.0), 4, 1, "--momentum must be in [0, 1)"),
    (dict(epochs=0), 4, 1, "--epochs must be >= 1"),
    (dict(steps_per_epoch=0), 4, 1, "--steps_per_epoch must be >= 1"),
    (dict(max_staleness=0), 4, 1, "max_staleness"),
    (dict(global_batch=30), 4, 1, "multiple of λ=4"),
    (dict(global_batch=128, minibatch=16), 4, 1, "contradicts"),
    (dict(minibatch=0), 4, 1, "--minibatch must be >= 1"),
    (dict(dataset="fashion_mnist", data_dir="/nonexistent"), 4, 1,
     "apt-get install dataset-fashion-mnist"),
    (dict(emulated_step_ms=["100", "100"]), 4, 1,
     "--emulated_step_ms has 2 values; give one for every learner or one per"
     " learner (λ=4)"),
    (dict(emulated_step_ms=["-5"]), 4, 1, "values must be >= 0, got -5"),
    (dict(emulated_step_ms=["fast"]), 4, 1, "must be numbers"),
    (dict(save_model="model.h5"), 4, 1,
     "--save_model='model.h5' must end in '.keras'"),
    (dict(checkpoint_dir="/tmp/c", checkpoint_every_steps=0), 4, 1,
     "--checkpoint_every_steps must be > 0, got 0."),
    (dict(checkpoint_dir="/tmp/c", checkpoint_every_secs=-1.0), 4, 1,
     "--checkpoint_every_secs must be > 0, got -1.0."),
    (dict(checkpoint_every_steps=100), 4, 1,
     "--checkpoint_every_steps=100 needs --checkpoint_dir"),
    (dict(checkpoint_every_secs=30.0), 4, 1,
     "--checkpoint_every_secs=30.0 needs --checkpoint_dir"),
])
def test_bad_flags_are_refused(overrides, learners, ps, fragment):
  with pytest.raises(ValueError) as error:
    launch_flags.resolve_config(flag_values(**overrides), learners, ps)
  assert fragment in str(error.value)


def test_emulated_step_times_per_learner():
  config = launch_flags.resolve_config(
      flag_values(emulated_step_ms=["150"]), 3, 1)
  assert config.emulated_step_ms == (150.0, 150.0, 150.0)
  config = launch_flags.resolve_config(
      flag_values(emulated_step_ms=["600", "150", "150"]), 3, 1)
  assert [config.learner_step_time_s(i) for i in range(3)] == [
      0.6, 0.15, 0.15]
  assert launch_flags.resolve_config(
      flag_values(), 3, 1).learner_step_time_s(2) == 0.0


def test_global_batch_sets_mu_per_learner():
  config = launch_flags.resolve_config(flag_values(global_batch=128), 4, 1)
  assert config.minibatch == 32
  config = launch_flags.resolve_config(flag_values(minibatch=8), 4, 1)
  assert config.minibatch == 8


CLUSTER = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],
           "ps": ["127.0.0.1:3"]}


@pytest.mark.parametrize("text,fragment", [
    ("{not json", "not valid JSON"),
    (json.dumps({"task": {"type": "worker"}}), 'needs a "cluster"'),
    (json.dumps({"cluster": CLUSTER}), 'needs a "task"'),
    (json.dumps({"cluster": CLUSTER, "task": {"type": "evaluator"}}),
     "task type 'evaluator' is unknown"),
    (json.dumps({"cluster": CLUSTER, "task": {"type": "worker", "index": 3}}),
     "index 3 is out of range"),
    (json.dumps({"cluster": {"chief": ["a:1"], "worker": ["b:2"]},
                 "task": {"type": "chief"}}), "has no 'ps' job"),
    (json.dumps({"cluster": {**CLUSTER, "ps": ["nohostport"]},
                 "task": {"type": "ps"}}), '"host:port"'),
])
def test_malformed_tf_config(text, fragment):
  with pytest.raises(ValueError) as error:
    launch_flags.parse_tf_config(text)
  assert fragment in str(error.value)
  assert "\n" not in str(error.value)


def test_cli_errors_are_one_line_before_any_server(tmp_path):
  bad = launch(["--learners=0"])
  out, _ = bad.communicate(timeout=60)
  assert bad.returncode == 2
  assert out.strip().splitlines()[-1] == "error: --learners must be >= 1, got 0."
  bad = launch(SMALL_JOB, env_extra={"TF_CONFIG": "{oops"})
  out, _ = bad.communicate(timeout=60)
  assert bad.returncode == 2 and "TF_CONFIG is not valid JSON" in out
  with socket.socket() as holder:  # a ps task whose port is taken
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],
               "ps": [f"127.0.0.1:{port}"]}
    bad = launch(SMALL_JOB, env_extra={"TF_CONFIG": json.dumps(
        {"cluster": cluster, "task": {"type": "ps", "index": 0}})})
    out, _ = bad.communicate(timeout=60)
  assert bad.returncode == 2 and f"127.0.0.1:{port}) is already in use" in out


@pytest.mark.parametrize("flag,fragment", [
    ("--gpus=1", "--gpus=1 works only in a local cluster"),
    ("--kill_task=worker:0@3", "--kill_task works only in a local cluster"),
])
def test_local_cluster_flags_are_refused_in_a_deploy(flag, fragment):
  # The same command runs every task of a deploy: a flag that only the local
  # launcher can honour is refused there, not ignored.
  cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],
             "ps": ["127.0.0.1:3"]}
  bad = launch(SMALL_JOB + [flag], env_extra={"TF_CONFIG": json.dumps(
      {"cluster": cluster, "task": {"type": "worker", "index": 0}})})
  out, _ = bad.communicate(timeout=60)
  assert bad.returncode == 2, out
  last = out.strip().splitlines()[-1]
  assert last.startswith(f"error: {fragment}") and "serving on" not in out


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


def test_local_cluster_trains_and_leaves_no_process(tmp_path):
  results = tmp_path / "results.json"
  job = launch(SMALL_JOB + [f"--results={results}",
                            f"--log_dir={tmp_path / 'logs'}"])
  children, lines = [], []
  for line in job.stdout:
    lines.append(line)
    if not children and line.startswith("[chief:0]"):
      children = descendants(job)
  job.wait(timeout=300)
  output = "".join(lines)
  assert job.returncode == 0, output
  assert len(children) == 4, children  # ps, 2 workers, chief
  assert_all_gone(children)
  for task in ("[ps:0]", "[worker:0]", "[worker:1]", "[chief:0]"):
    assert task in output
  assert "[chief:0] epoch 1/1: loss" in output and "staleness mean" in output
  if not gpus.nvidia_driver_installed():  # as on this project's machines
    assert "cudart_stub" not in output and "cuInit" not in output, output
  saved = json.loads(results.read_text())
  assert saved["gradients"] == 12 and saved["updates"] == 12
  assert sum(saved["staleness_histogram"]) == 12
  assert 0.0 <= saved["test_accuracy"] <= 1.0
  assert (tmp_path / "logs" / "run.png").stat().st_size > 10000
  assert any(p.name.startswith("events.out.tfevents")
             for p in (tmp_path / "logs").iterdir())
  # The trained model, saved where --log_dir puts it by default, loads
  # with plain tf_keras: no rudra_tf, no cluster.
  assert saved["model_path"] == str(tmp_path / "logs" / "model.keras")
  model = run_in_fresh_process(scenarios.describe_saved_model,
                               path=saved["model_path"], dataset="synthetic")
  assert model["loaded_without_rudra_tf"] and model["optimizer"] == "SGD"
  # The trained weights: the chief's own test accuracy, reproduced.
  assert model["test_accuracy"] == pytest.approx(saved["test_accuracy"],
                                                 abs=1e-6)


def start_long_job(extra=()):
  """Starts a job that trains for long; returns it once the chief trains."""
  job = launch(SMALL_JOB[:-2] + ["--steps_per_epoch=100000", "--minibatch=8",
                                 *extra])
  for line in job.stdout:
    if line.startswith("[chief:0]") and "gradients per epoch" in line:
      return job, descendants(job)
  raise AssertionError(f"the chief never started: {job.wait()}")


def test_a_learner_beyond_its_restarts_stops_every_task():
  # tests/test_faults.py covers restarts; with none allowed, a dead learner
  # ends the job and takes every other task with it.
  job, children = start_long_job(["--learner_restarts=0"])
  worker = next(p for p in children
                if "worker" in json.loads(p.environ()["TF_CONFIG"])["task"]
                ["type"])
  worker.send_signal(signal.SIGKILL)
  output = job.stdout.read()
  job.wait(timeout=120)
  assert job.returncode == 2, output
  assert "task worker:" in output and "stopped every task" in output
  assert_all_gone(children)


def test_interrupting_the_launcher_stops_every_task():
  job, children = start_long_job()
  assert len(children) == 4
  job.send_signal(signal.SIGINT)
  job.stdout.read()
  job.wait(timeout=120)
  assert job.returncode == 130
  assert_all_gone(children)


# ------------------------------------------------------------- deployment
def generate(*args):
  result = subprocess.run(
      [sys.executable, "-m", "launch.cluster_config", *args], cwd=REPO,
      env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True,
      timeout=60)
  return result


def test_generator_prints_consistent_tf_configs_and_a_tfjob(tmp_path):
  manifest = tmp_path / "tfjob.yaml"
  result = generate("--num_workers=3", "--num_ps=2",
                    "--pattern=rudra-{job}-{index}:2222", "--format=json",
                    f"--manifest={manifest}", "--image=registry/rudra:1",
                    "--command=python -m launch.train --protocol=async")
  assert result.returncode == 0, result.stderr
  configs = json.loads(result.stdout)
  assert sorted(configs) == ["chief:0", "ps:0", "ps:1", "worker:0",
                             "worker:1", "worker:2"]
  clusters = {json.dumps(c["cluster"], sort_keys=True)
              for c in configs.values()}
  assert len(clusters) == 1  # every task sees the same cluster
  for task, config in configs.items():
    job, index = task.split(":")
    assert config["task"] == {"type": job, "index": int(index)}
    spec = launch_flags.parse_tf_config(json.dumps(config))
    assert spec.address == f"rudra-{job}-{index}:2222"
  tfjob = json.loads(manifest.read_text())
  assert tfjob["kind"] == "TFJob" and tfjob["apiVersion"] == "kubeflow.org/v1"
  replicas = {k: v["replicas"] for k, v in
              tfjob["spec"]["tfReplicaSpecs"].items()}
  assert replicas == {"Chief": 1, "Worker": 3, "PS": 2}
  container = tfjob["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"][
      "containers"][0]
  assert container["command"] == ["python", "-m", "launch.train",
                                  "--protocol=async"]
  assert container["image"] == "registry/rudra:1"
  # Without --gpus_per_learner no pod asks for a GPU or hides one.
  for replica in tfjob["spec"]["tfReplicaSpecs"].values():
    container = replica["template"]["spec"]["containers"][0]
    assert "resources" not in container and "env" not in container


def test_generator_gives_each_learner_pod_one_gpu_and_hides_the_rest(
    tmp_path):
  manifest = tmp_path / "tfjob.yaml"
  result = generate("--num_workers=2", "--num_ps=1",
                    "--pattern=rudra-{job}-{index}:2222",
                    f"--manifest={manifest}", "--image=registry/rudra:1",
                    "--gpus_per_learner=1")
  assert result.returncode == 0, result.stderr
  specs = json.loads(manifest.read_text())["spec"]["tfReplicaSpecs"]
  containers = {replica: spec["template"]["spec"]["containers"][0]
                for replica, spec in specs.items()}
  assert containers["Worker"]["resources"] == {
      "limits": {"nvidia.com/gpu": 1}}
  assert "env" not in containers["Worker"]
  for replica in ("Chief", "PS"):
    assert "resources" not in containers[replica]
    assert containers[replica]["env"] == [
        {"name": "CUDA_VISIBLE_DEVICES", "value": ""}]


@pytest.mark.parametrize("args,fragment", [
    (["--chief=a:1", "--workers=b:2"], "--ps is required"),
    (["--chief=a:1", "--workers=b:2", "--ps=b:2"], "used twice"),
    (["--chief=a", "--workers=b:2", "--ps=c:3"], "not \"host:port\""),
    (["--num_workers=0", "--num_ps=1", "--pattern={job}-{index}:1"],
     "--num_workers and --num_ps must be >= 1"),
    (["--num_workers=2", "--num_ps=1", "--pattern=host:1"], "needs both"),
    (["--chief=a:1", "--workers=b:2", "--ps=c:3", "--manifest=x.yaml"],
     "--image is required"),
    (["--chief=a:1", "--workers=b:2", "--ps=c:3", "--manifest=x.yaml",
      "--image=i", "--gpus_per_learner=2"],
     "--gpus_per_learner=2 is not supported: a learner task trains one "
     "replica on one device; valid values are 0, 1."),
    (["--chief=a:1", "--workers=b:2", "--ps=c:3", "--gpus_per_learner=1"],
     "give --manifest (and --image) with it"),
])
def test_generator_refuses_bad_clusters(args, fragment):
  result = generate(*args)
  assert result.returncode == 2
  assert fragment in result.stderr


def test_cluster_from_generated_tf_config_trains_to_completion(tmp_path):
  import portpicker  # pylint: disable=g-import-not-at-top
  address = lambda: f"127.0.0.1:{portpicker.pick_unused_port()}"
  result = generate(f"--chief={address()}",
                    f"--workers={address()},{address()}",
                    f"--ps={address()}", "--format=json")
  configs = json.loads(result.stdout)
  results = tmp_path / "results.json"
  tasks = {name: launch(SMALL_JOB + [f"--results={results}"],
                        env_extra={"TF_CONFIG": json.dumps(config)})
           for name, config in configs.items()}
  outputs = {name: task.communicate(timeout=300)[0]
             for name, task in tasks.items()}
  for name, task in tasks.items():
    assert task.returncode == 0, f"{name}:\n{outputs[name]}"
  for name in ("ps:0", "worker:0", "worker:1"):
    assert "chief finished; exiting" in outputs[name]
  assert json.loads(results.read_text())["gradients"] == 12


def test_checkpoint_dir_resumes_where_the_last_run_stopped(tmp_path):
  checkpoints, results = tmp_path / "ckpt", tmp_path / "results.json"
  common = SMALL_JOB[:-3] + ["--steps_per_epoch=12", "--minibatch=8",
                             f"--checkpoint_dir={checkpoints}",
                             f"--results={results}"]
  first = launch(common + ["--epochs=1"])
  out, _ = first.communicate(timeout=300)
  assert first.returncode == 0, out
  assert json.loads(results.read_text())["gradients"] == 12
  second = launch(common + ["--epochs=2"])
  out, _ = second.communicate(timeout=300)
  assert second.returncode == 0, out
  assert "resumed from" in out and "after epoch 1" in out
  assert "epoch 2/2" in out and "epoch 1/2" not in out
  saved = json.loads(results.read_text())
  # The protocol state came back: counts continue from the first run.
  assert saved["gradients"] == 24 and saved["updates"] == 24
  assert sum(saved["staleness_histogram"]) == 24


def test_flag_validation_does_not_import_tensorflow():
  # The launcher supervises the tasks; it stays light and validates flags
  # (data files included) before anything imports TensorFlow.
  code = ("import sys, types; from launch import flags as f; "
          "v = types.SimpleNamespace(**%r); f.resolve_config(v, 2, 1); "
          "print('tensorflow' in sys.modules)") % dict(
              vars(flag_values(dataset="fashion_mnist")))
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, text=True,
                       capture_output=True, env=dict(os.environ,
                                                     PYTHONPATH=REPO),
                       timeout=60)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == "False"


def test_a_diverging_run_stops_after_the_epoch_and_says_so(tmp_path):
  results = tmp_path / "results.json"
  job = launch(SMALL_JOB[:-2] + ["--steps_per_epoch=6", "--epochs=3",
                                 "--lr=1e30", f"--results={results}",
                                 f"--log_dir={tmp_path / 'logs'}"])
  output, _ = job.communicate(timeout=300)
  assert job.returncode == 0, output
  assert "training diverged: the loss of epoch 1 is nan; stopped." in output
  def refuse(constant):
    raise AssertionError(f"not strict JSON: {constant}")
  saved = json.loads(results.read_text(), parse_constant=refuse)
  assert saved["diverged_at_epoch"] == 1 and len(saved["epochs"]) == 1
  assert saved["epochs"][0]["loss"] is None  # NaN, written as null
  assert saved["gradients"] == 6  # epochs 2 and 3 never ran
  assert (tmp_path / "logs" / "run.png").exists()


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
