"""The environment TensorFlow starts with in every launched task.

TensorFlow's C++ runtime reads these variables when it starts, so they are
applied before anything imports TensorFlow (`launch/train.py` does it first
thing); the tasks the local launcher starts inherit them. A variable the
environment already sets is left as it is.
"""

import os

# Quiets TensorFlow's C++ start-up logging.
LOG_LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
# TensorFlow takes CPU tensors from malloc unless this is "true", and glibc
# served a learner's per-step buffers (0.7-18 MB: Conv2D backprop scratch,
# activations, received weights) with fresh mmap'd pages every step: page
# faults and munmap took about a fifth of a learner's CPU. The BFC allocator
# keeps and reuses them (docs/performance.md, "Allocator"); "false" opts out.
CPU_ALLOCATOR_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"
DEFAULTS = {LOG_LEVEL_VARIABLE: "2", CPU_ALLOCATOR_VARIABLE: "true"}


def apply_defaults(environment=None):
  """Sets each of DEFAULTS that `environment` (os.environ) does not set."""
  environment = os.environ if environment is None else environment
  for name, value in DEFAULTS.items():
    environment.setdefault(name, value)
  return environment
