"""Which GPU each learner of a local run gets, and whether TensorFlow can use it.

`--gpus=N` hands N GPUs to the learners round-robin through
CUDA_VISIBLE_DEVICES. Before any task starts, the launcher checks that the
TensorFlow installed here sees at least N GPUs: otherwise learners told to
use a GPU would quietly train on the CPU instead (the pip package
`tensorflow` finds no GPU unless CUDA 12's libraries are installed beside
it, as `pip install 'tensorflow[and-cuda]==2.21.*'`, or rudra_tf's `gpu`
extra, does).
"""

import json
import os
import shutil
import subprocess
import sys

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
# The command that installs TensorFlow's CUDA libraries for this package.
INSTALL_HINT = "pip install -e '.[gpu]' (tensorflow[and-cuda]==2.21.*)"


def visible_device_ids(environment):
  """The GPU ids the launcher's own CUDA_VISIBLE_DEVICES allows, or None.

  None means the variable is unset: every GPU of the machine may be used.
  """
  value = environment.get(CUDA_VISIBLE_DEVICES)
  if value is None:
    return None
  return [entry.strip() for entry in value.split(",") if entry.strip()]


def learner_device_id(learner, gpus, environment):
  """The CUDA_VISIBLE_DEVICES value of learner `learner` with `gpus` GPUs.

  Learners take the first `gpus` GPUs round-robin; when the launcher runs
  under CUDA_VISIBLE_DEVICES, those are the first `gpus` ids it lists (a
  user who set CUDA_VISIBLE_DEVICES=2,3 keeps GPUs 0 and 1 free).
  """
  message = _visible_shortage(gpus, environment)
  if message:
    raise ValueError(message)
  allowed = visible_device_ids(environment)
  slot = learner % gpus
  return str(slot) if allowed is None else allowed[slot]


def _visible_shortage(requested, environment):
  """Why CUDA_VISIBLE_DEVICES cannot give `requested` GPUs, or None."""
  allowed = visible_device_ids(environment)
  if allowed is None or requested <= len(allowed):
    return None
  return (f"--gpus={requested} asks for {requested} GPU(s), but "
          f"{CUDA_VISIBLE_DEVICES}={environment[CUDA_VISIBLE_DEVICES]!r} "
          f"allows {len(allowed)}; pass --gpus={len(allowed)} or fewer, or "
          f"list more GPUs in {CUDA_VISIBLE_DEVICES}.")


def nvidia_driver_installed():
  """Whether this machine has an NVIDIA driver (its tool or its /proc entry)."""
  return (shutil.which("nvidia-smi") is not None
          or os.path.exists("/proc/driver/nvidia"))


def nvidia_smi_gpus():
  """GPUs the NVIDIA driver lists (`nvidia-smi -L`); 0 without a driver."""
  try:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                         text=True, timeout=30).stdout
  except (OSError, subprocess.TimeoutExpired):
    return 0
  return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def shortage_message(requested, environment, tensorflow_gpus, driver_gpus,
                     built_with_cuda, tensorflow_version):
  """Why `--gpus=requested` cannot be honoured here, or None when it can.

  Args:
    requested: the --gpus value.
    environment: the launcher's environment (its CUDA_VISIBLE_DEVICES).
    tensorflow_gpus: GPUs TensorFlow lists here (`tensorflow_gpus()`).
    driver_gpus: GPUs nvidia-smi lists (the driver's view).
    built_with_cuda: tf.test.is_built_with_cuda().
    tensorflow_version: tf.__version__, for the message.
  """
  visible_shortage = _visible_shortage(requested, environment)
  if visible_shortage or requested <= tensorflow_gpus:
    return visible_shortage
  fallback = ("pass --gpus=0 to train on the CPU" if tensorflow_gpus == 0
              else f"pass --gpus={tensorflow_gpus} or fewer")
  if tensorflow_gpus == 0 and driver_gpus > 0:
    cause = (f"nvidia-smi lists {driver_gpus} while TensorFlow "
             f"{tensorflow_version} sees none: "
             + ("its CUDA 12 libraries are missing or do not load; install "
                "them" if built_with_cuda else
                "it is built without CUDA; install TensorFlow's CUDA build")
             + f" with {INSTALL_HINT}, or {fallback}")
  else:
    cause = (f"TensorFlow {tensorflow_version} sees {tensorflow_gpus} GPU(s) "
             f"on this machine; {fallback}")
  return f"--gpus={requested} asks for {requested} GPU(s), but {cause}."


# Run in a child process: the launcher itself never imports TensorFlow (it
# stays light, and TensorFlow's start-up log and CUDA initialization stay
# out of the launcher), and the probe sees the environment the tasks get.
_PROBE = ("import json, tensorflow as tf; print(json.dumps(["
          "len(tf.config.list_physical_devices('GPU')), "
          "tf.test.is_built_with_cuda(), tf.__version__]))")


def tensorflow_gpus(environment):
  """(GPUs TensorFlow sees, built with CUDA, version), from a child process.

  Raises ValueError, naming TensorFlow's own error, when it cannot start.
  """
  probe = subprocess.run([sys.executable, "-c", _PROBE], env=environment,
                         capture_output=True, text=True, timeout=300)
  if probe.returncode != 0:
    last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
    raise ValueError(f"could not start TensorFlow to count the GPUs it "
                     f"sees ({last}); fix its installation, or pass --gpus=0.")
  seen, built_with_cuda, version = json.loads(probe.stdout.splitlines()[-1])
  return seen, built_with_cuda, version


def check_gpus(requested, environment):
  """Raises ValueError when TensorFlow here sees fewer than `requested` GPUs.

  Starts TensorFlow in a child process, so the launcher calls it only when
  --gpus > 0.
  """
  if requested <= 0:
    return
  seen, built_with_cuda, version = tensorflow_gpus(environment)
  message = shortage_message(requested, environment, seen, nvidia_smi_gpus(),
                             built_with_cuda, version)
  if message:
    raise ValueError(message)
