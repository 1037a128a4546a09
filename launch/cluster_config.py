r"""Prints every task's TF_CONFIG for a cluster and writes a Kubeflow TFJob.

From explicit addresses:

  python -m launch.cluster_config --chief=10.0.0.1:2222 \
      --workers=10.0.0.2:2222,10.0.0.3:2222 --ps=10.0.0.4:2222

or from counts and a host-name pattern (Kubernetes services):

  python -m launch.cluster_config --num_workers=4 --num_ps=1 \
      --pattern='rudra-{job}-{index}:2222' \
      --manifest=tfjob.yaml --image=registry/rudra:latest \
      --command='python -m launch.train --protocol=2-softsync' \
      --gpus_per_learner=1

Each task then runs the same training command with its TF_CONFIG. The
manifest is a `kubeflow.org/v1` TFJob (the training operator sets TF_CONFIG
in each pod itself); it is written as JSON, which is valid YAML.
"""

import json
import shlex
import sys

from absl import app
from absl import flags

from launch.flags import TASK_TYPES

flags.DEFINE_string("chief", None, "host:port of the chief.")
flags.DEFINE_list("workers", None, "host:port of each learner (worker).")
flags.DEFINE_list("ps", None, "host:port of each parameter-server task.")
flags.DEFINE_integer("num_workers", None, "Learners, with --pattern.")
flags.DEFINE_integer("num_ps", None, "ps tasks, with --pattern.")
flags.DEFINE_string("pattern", None, "Address pattern with {job} and {index},"
                    " e.g. 'rudra-{job}-{index}:2222'.")
flags.DEFINE_enum("format", "shell", ["shell", "json"], "shell: one "
                  "`TF_CONFIG='...'` line a task; json: one object.")
flags.DEFINE_string("manifest", None, "Write a Kubeflow TFJob here.")
flags.DEFINE_string("job_name", "rudra", "TFJob metadata.name.")
flags.DEFINE_string("image", None, "Container image (with --manifest).")
flags.DEFINE_string("command", "python -m launch.train",
                    "Training command each pod runs (with --manifest).")
flags.DEFINE_integer("gpus_per_learner", 0, "1: each Worker pod asks "
                     "Kubernetes for one GPU (nvidia.com/gpu) and the Chief "
                     "and PS pods see none (with --manifest).")
FLAGS = flags.FLAGS

# The TFJob operator names replica types this way.
_REPLICA_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS"}
# A learner task is one replica on one device (RudraStrategy's limitation).
GPUS_PER_LEARNER_VALUES = (0, 1)
# The resource NVIDIA's Kubernetes device plugin schedules GPUs by.
GPU_RESOURCE = "nvidia.com/gpu"


def cluster_from_addresses(chief, workers, ps):
  for name, value in (("--chief", chief), ("--workers", workers),
                      ("--ps", ps)):
    if not value:
      raise ValueError(f"{name} is required (or give --num_workers, "
                       "--num_ps and --pattern instead).")
  cluster = {"chief": [chief], "worker": list(workers), "ps": list(ps)}
  addresses = [a for job in TASK_TYPES for a in cluster[job]]
  for address in addresses:
    if not address.rpartition(":")[2].isdigit():
      raise ValueError(f'address {address!r} is not "host:port".')
  duplicates = {a for a in addresses if addresses.count(a) > 1}
  if duplicates:
    raise ValueError(f"addresses used twice: {', '.join(sorted(duplicates))}.")
  return cluster


def cluster_from_pattern(num_workers, num_ps, pattern):
  if not num_workers or num_workers < 1 or not num_ps or num_ps < 1:
    raise ValueError("--num_workers and --num_ps must be >= 1 with "
                     f"--pattern (got {num_workers} and {num_ps}).")
  if "{index}" not in pattern or "{job}" not in pattern:
    raise ValueError(f"--pattern {pattern!r} needs both {{job}} and "
                     "{index}.")
  return cluster_from_addresses(
      pattern.format(job="chief", index=0),
      [pattern.format(job="worker", index=i) for i in range(num_workers)],
      [pattern.format(job="ps", index=i) for i in range(num_ps)])


def tf_configs(cluster):
  """{"chief:0": TF_CONFIG dict, "worker:0": ..., ...}, one per task."""
  return {f"{job}:{index}": {"cluster": cluster,
                             "task": {"type": job, "index": index}}
          for job in TASK_TYPES for index in range(len(cluster[job]))}


def tfjob_manifest(cluster, name, image, command, gpus_per_learner=0):
  """A kubeflow.org/v1 TFJob with Chief, Worker and PS replicas.

  With `gpus_per_learner=1` each Worker container asks for one GPU, which
  the device plugin makes the only one it sees, and the Chief and PS
  containers get CUDA_VISIBLE_DEVICES="": CUDA images expose every GPU of
  the node by default, and a ps task that sees one puts its variables there.
  """
  if not image:
    raise ValueError("--image is required with --manifest.")
  if gpus_per_learner not in GPUS_PER_LEARNER_VALUES:
    raise ValueError(
        f"--gpus_per_learner={gpus_per_learner} is not supported: a learner "
        "task trains one replica on one device; valid values are "
        f"{', '.join(map(str, GPUS_PER_LEARNER_VALUES))}.")
  port = int(cluster["chief"][0].rpartition(":")[2])
  specs = {}
  for job in TASK_TYPES:
    container = {
        "name": "tensorflow",  # the operator looks for this name
        "image": image,
        "command": shlex.split(command),
        "ports": [{"name": "tfjob-port", "containerPort": port}],
    }
    if gpus_per_learner and job == "worker":
      container["resources"] = {"limits": {GPU_RESOURCE: gpus_per_learner}}
    elif gpus_per_learner:
      container["env"] = [{"name": "CUDA_VISIBLE_DEVICES", "value": ""}]
    specs[_REPLICA_TYPES[job]] = {
        "replicas": len(cluster[job]),
        "restartPolicy": "OnFailure" if job == "worker" else "Never",
        "template": {"spec": {"containers": [container]}},
    }
  return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
          "metadata": {"name": name},
          "spec": {"runPolicy": {"cleanPodPolicy": "All"},
                   "tfReplicaSpecs": specs}}


def main(argv):
  del argv
  try:
    if FLAGS.pattern:
      cluster = cluster_from_pattern(FLAGS.num_workers, FLAGS.num_ps,
                                     FLAGS.pattern)
    else:
      cluster = cluster_from_addresses(FLAGS.chief, FLAGS.workers, FLAGS.ps)
    configs = tf_configs(cluster)
    if FLAGS.gpus_per_learner and not FLAGS.manifest:
      raise ValueError("--gpus_per_learner sets the GPUs of the TFJob's "
                       "pods: give --manifest (and --image) with it; a "
                       "local run takes launch.train --gpus instead.")
    manifest = (tfjob_manifest(cluster, FLAGS.job_name, FLAGS.image,
                               FLAGS.command, FLAGS.gpus_per_learner)
                if FLAGS.manifest else None)
  except ValueError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  if FLAGS.format == "json":
    print(json.dumps(configs, indent=2))
  else:
    for task, config in configs.items():
      print(f"# {task}\nTF_CONFIG={shlex.quote(json.dumps(config))}")
  if manifest:
    with open(FLAGS.manifest, "w") as stream:
      json.dump(manifest, stream, indent=2)
    print(f"# wrote {FLAGS.manifest}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  app.run(main)
