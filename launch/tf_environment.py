"""The environment TensorFlow starts with in every launched task.

TensorFlow's C++ runtime reads these variables when it starts, so they are
applied before anything imports TensorFlow (`launch/train.py` does it first
thing); the tasks the local launcher starts inherit them, and
`share_cores` gives each computing task of a local cluster its share of
the machine. A variable the environment already sets is left as it is.
"""

import os
import re

# Quiets TensorFlow's C++ start-up logging.
LOG_LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
# TensorFlow takes CPU tensors from malloc unless this is "true", and glibc
# served a learner's per-step buffers (0.7-18 MB: Conv2D backprop scratch,
# activations, received weights) with fresh mmap'd pages every step: page
# faults and munmap took about a fifth of a learner's CPU. The BFC allocator
# keeps and reuses them (docs/performance.md, "Allocator"); "false" opts out.
CPU_ALLOCATOR_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"
DEFAULTS = {LOG_LEVEL_VARIABLE: "2", CPU_ALLOCATOR_VARIABLE: "true"}
# TensorFlow gives every process (and every server's devices) an intra-op
# thread pool of one thread per core. The learners of a local cluster share
# one machine, so λ such pools oversubscribe it: on 2 cores, two learners
# of one thread each pushed 1-13% more gradients per second, at 4-13% less
# CPU per gradient, than two of two threads (docs/performance.md).
INTRA_OP_THREADS_VARIABLE = "TF_NUM_INTRAOP_THREADS"
# Set (to anything) by launch/gpu_check: every task prints the GPUs it sees,
# and the chief turns on TensorFlow's placement log, which the learners'
# contexts take from it, so each learner logs where each op of its step runs.
PRINT_DEVICES_VARIABLE = "RUDRA_PRINT_DEVICES"
# TensorFlow takes nearly all of a GPU's free memory when a process starts;
# learners that share a GPU (more learners than GPUs) then starve each other.
# "true" makes each take only what it uses.
GPU_ALLOW_GROWTH_VARIABLE = "TF_FORCE_GPU_ALLOW_GROWTH"


# What every TensorFlow process prints as it starts on a machine without an
# NVIDIA driver, whatever TF_CPP_MIN_LOG_LEVEL says (absl logs to stderr
# before it is initialized): a CPU-only machine needs no driver, so the
# local launcher drops these lines there (`noise_on_machines_without_cuda`).
_STARTUP_LINES_WITHOUT_CUDA = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called "
    r"are written to STDERR"
    r"|I\d{4} [\d:.]+ +\d+ cudart_stub\.cc:\d+\] Could not find cuda "
    r"drivers on your machine, GPU will not be used\."
    r"|E\d{4} [\d:.]+ +\d+ cuda_platform\.cc:\d+\] failed call to cuInit: "
    r".*)$")


def noise_on_machines_without_cuda(line):
  """Whether `line` is TensorFlow's start-up notice that CUDA is absent."""
  return _STARTUP_LINES_WITHOUT_CUDA.match(line.rstrip("\n")) is not None


# TensorFlow's INFO notice that its oneDNN custom operations are on (each
# process on a CPU that has them, a dozen times for a local cluster), also
# printed before absl logging starts, so TF_CPP_MIN_LOG_LEVEL >= 1 does not
# hide it: the local launcher drops it where that level asks for no INFO.
_ONEDNN_NOTICE = re.compile(
    r"^I\d{4} [\d:.]+ +\d+ port\.cc:\d+\] oneDNN custom operations are "
    r"on\..*$")


def onednn_notice(line):
  """Whether `line` is TensorFlow's notice that oneDNN operations are on."""
  return _ONEDNN_NOTICE.match(line.rstrip("\n")) is not None


def startup_noise(environment, nvidia_driver_installed):
  """What the local launcher drops of its tasks' output: a predicate over
  lines, or None (nothing). CUDA's absence is noise without a driver (with
  one, a failed cuInit is worth seeing); the oneDNN notice is, unless the
  tasks' TF_CPP_MIN_LOG_LEVEL (`environment`, else DEFAULTS) is 0."""
  level = environment.get(LOG_LEVEL_VARIABLE, DEFAULTS[LOG_LEVEL_VARIABLE])
  checks = [check for check, applies in (
      (noise_on_machines_without_cuda, not nvidia_driver_installed),
      (onednn_notice, level.strip() not in ("", "0"))) if applies]
  if not checks:
    return None
  return lambda line: any(check(line) for check in checks)


def apply_defaults(environment=None):
  """Sets each of DEFAULTS that `environment` (os.environ) does not set."""
  environment = os.environ if environment is None else environment
  for name, value in DEFAULTS.items():
    environment.setdefault(name, value)
  return environment


def available_cores():
  """Cores this process may run on (its affinity mask, else all)."""
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def share_cores(environment, computing_tasks, cores=None):
  """Gives one of `computing_tasks` tasks on this machine its intra-op share.

  Sets TF_NUM_INTRAOP_THREADS to cores // computing_tasks (at least 1)
  unless `environment` already sets it.
  """
  if computing_tasks < 1:
    raise ValueError(f"computing_tasks must be >= 1, got {computing_tasks}.")
  cores = available_cores() if cores is None else cores
  environment.setdefault(INTRA_OP_THREADS_VARIABLE,
                         str(max(1, cores // computing_tasks)))
  return environment
