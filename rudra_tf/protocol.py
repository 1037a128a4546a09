"""Rudra's protocol math as small pure functions.

Nothing here touches TensorFlow's runtime: the parameter-server code in
`shard_state.py` and any simulator call these same functions, so a protocol
rule is written once.

Symbols follow the paper (Gupta, Zhang, Wang, ICDM 2016):

* λ (`num_learners`): the number of learners (worker tasks).
* n: the softsync parameter, 1 <= n <= λ.
* c = floor(λ / n): gradients the parameter server aggregates per update.
* σ (staleness): timestamp at push time minus timestamp at pull time.

Worked trajectories (λ = 4):

* "hardsync":   c = 4, learners wait for the update, σ is always 0.
* "1-softsync": c = 4, no barrier.
* "2-softsync": c = 2; "divide_by_n" scales α0 by 1/2.
* "async":      c = 1 (= "4-softsync"); "divide_by_n" scales α0 by 1/4.
* "1-backup-hardsync": c = 3; each round takes the first 3 gradients of
  the current version and drops the late one (σ = 1; the accepted ones
  all have σ = 0). Chen et al., "Revisiting Distributed Synchronous SGD"
  (arXiv 1604.00981); TF1's SyncReplicasOptimizer with
  replicas_to_aggregate = λ − b.
* "divide_by_staleness" weighs each gradient by 1/σ (σ > 0) and by 1 (σ = 0):
  staleness 0, 1, 2, 4 give weights 1, 1, 1/2, 1/4.
"""

import dataclasses
import re

HARDSYNC = "hardsync"
ASYNC = "async"
SOFTSYNC_SUFFIX = "-softsync"
BACKUP_SUFFIX = "-backup-hardsync"
VALID_PROTOCOLS_TEXT = ('"hardsync", "async", "<n>-softsync" with 1 <= n <= λ '
                        'or "<b>-backup-hardsync" with 1 <= b < λ')

# lr_policy values.
LR_NONE = "none"
LR_DIVIDE_BY_N = "divide_by_n"
LR_DIVIDE_BY_STALENESS = "divide_by_staleness"
LR_POLICIES = (LR_NONE, LR_DIVIDE_BY_N, LR_DIVIDE_BY_STALENESS)

_SOFTSYNC_RE = re.compile(r"^(\d+)-softsync$")
_BACKUP_RE = re.compile(r"^(\d+)-backup-hardsync$")


@dataclasses.dataclass(frozen=True)
class Protocol:
  """A parsed synchronization protocol for a given number of learners.

  Attributes:
    name: the canonical spelling ("hardsync", "async" or "<n>-softsync").
    num_learners: λ.
    n: the softsync parameter (λ for async, 1 for hardsync).
    gradients_per_update: c = floor(λ / n).
    barrier: True for hardsync: a learner may not pull new weights while the
      update its previous gradient belongs to is still pending.
    backup: b, hardsync's backup learners: each round takes the first
      c = λ − b gradients of its version and drops the late ones (0: plain
      hardsync, and every other protocol).
  """
  name: str
  num_learners: int
  n: int
  gradients_per_update: int
  barrier: bool
  backup: int = 0


def parse_protocol(protocol, num_learners):
  """Parses "hardsync", "async", "<n>-softsync" or "<b>-backup-hardsync"
  for λ learners.

  Raises:
    ValueError: naming the bad value and the valid ones.
  """
  if isinstance(num_learners, bool) or not isinstance(num_learners, int) \
      or num_learners < 1:
    raise ValueError(
        f"num_learners must be a positive integer, got {num_learners!r}.")
  text = protocol.strip().lower() if isinstance(protocol, str) else protocol
  if text == HARDSYNC:
    return Protocol(HARDSYNC, num_learners, 1, num_learners, barrier=True)
  if text == ASYNC:
    return Protocol(ASYNC, num_learners, num_learners, 1, barrier=False)
  backup = _BACKUP_RE.match(text) if isinstance(text, str) else None
  if backup:
    b = int(backup.group(1))
    if not 1 <= b < num_learners:
      raise ValueError(
          f"Protocol {protocol!r} needs 1 <= b < λ backup learners, but "
          f"b = {b} and the cluster has λ = {num_learners} learners; valid "
          f"protocols are {VALID_PROTOCOLS_TEXT}.")
    return Protocol(f"{b}{BACKUP_SUFFIX}", num_learners, 1, num_learners - b,
                    barrier=True, backup=b)
  match = _SOFTSYNC_RE.match(text) if isinstance(text, str) else None
  if not match:
    raise ValueError(
        f"Unknown protocol {protocol!r}; valid protocols are "
        f"{VALID_PROTOCOLS_TEXT} (here λ = {num_learners}).")
  n = int(match.group(1))
  if not 1 <= n <= num_learners:
    raise ValueError(
        f"Protocol {protocol!r} needs 1 <= n <= λ, but n = {n} and the "
        f"cluster has λ = {num_learners} learners; valid protocols are "
        f"{VALID_PROTOCOLS_TEXT}.")
  return Protocol(f"{n}-softsync", num_learners, n, num_learners // n,
                  barrier=False)


def validate_lr_policy(lr_policy):
  if lr_policy not in LR_POLICIES:
    raise ValueError(
        f"Unknown lr_policy {lr_policy!r}; valid values are "
        f"{', '.join(repr(p) for p in LR_POLICIES)}.")
  return lr_policy


def learning_rate_multiplier(lr_policy, protocol):
  """The factor the whole (scheduled) learning rate is multiplied by.

  "divide_by_n" is the ICDM rule α = α0 / <σ> with <σ> ≈ n: 1/n for
  n-softsync, 1/λ for async, 1 for hardsync (whose staleness is 0).
  """
  validate_lr_policy(lr_policy)
  if lr_policy == LR_DIVIDE_BY_N and not protocol.barrier:
    return 1.0 / protocol.n
  return 1.0


def staleness_weight(lr_policy, staleness, maximum=max):
  """The weight of one gradient of staleness σ inside an update.

  "divide_by_staleness" (IJCAI follow-up): α_l = α0 / σ_l for σ_l > 0 and α0
  for σ_l = 0, written as a per-gradient weight 1 / max(σ, 1). Every other
  policy weighs all gradients equally. `maximum` lets the parameter server
  pass `tf.maximum` for a float tensor σ; Python numbers use `max`.
  """
  validate_lr_policy(lr_policy)
  if lr_policy != LR_DIVIDE_BY_STALENESS:
    return 1.0
  return 1.0 / maximum(staleness, 1.0)


@dataclasses.dataclass(frozen=True)
class LearningRatePolicy:
  """A learning-rate policy, whole: the step's multiplier m and each
  gradient's weight w(σ), in one update of c gradients

      θ ← θ − m · α · (1/c) · Σ_l w(σ_l) · g_l

  (`learning_rate_multiplier` and `staleness_weight` above). The optimizer
  wrapper, the parameter-server shards and the simulator all use one.
  """
  name: str
  multiplier: float

  @classmethod
  def create(cls, name, protocol):
    """The policy `name` (one of LR_POLICIES) under `protocol`."""
    return cls(validate_lr_policy(name),
               learning_rate_multiplier(name, protocol))

  def weight(self, staleness, maximum=max):
    """w(σ); `maximum=tf.maximum` for a float tensor σ."""
    return staleness_weight(self.name, staleness, maximum)


def accepts_gradient(staleness, max_staleness):
  """The bounded-staleness guard: None accepts all, else σ <= max_staleness."""
  return max_staleness is None or staleness <= max_staleness


def validate_max_staleness(max_staleness):
  if max_staleness is None:
    return None
  if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) \
      or max_staleness < 1:
    raise ValueError(
        f"max_staleness must be None (no bound) or a positive integer, got "
        f"{max_staleness!r}.")
  return max_staleness


def histogram_bins(num_learners):
  """Staleness histogram length: bin i counts σ = i, the last bin σ >= it.

  The paper measured σ within 0..2n <= 2λ; 4λ leaves room for stragglers.
  """
  return max(64, 4 * num_learners + 1)
