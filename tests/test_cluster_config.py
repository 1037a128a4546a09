"""launch/cluster_config.py: TF_CONFIGs and a TFJob for a deploy, and a
cluster started from them."""

import json
import os
import subprocess
import sys

import pytest

from launch import flags as launch_flags
from tests.processes import REPO, SMALL_JOB, launch


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
