"""barrier.py: hardsync's tokens by hand (its docstring's trajectory), and
the conservation rule after every transition, with no cluster."""

import numpy as np
import pytest

from rudra_tf import barrier
from rudra_tf import protocol as protocol_lib
from rudra_tf import transition

OPS = transition.NUMPY_OPS
BINS = 8


def tokens(counters):
  return (int(counters.available), counters.holding.tolist(),
          int(counters.pending))


def test_the_docstring_trajectory():
  parsed = protocol_lib.parse_protocol("hardsync", 2)
  counters = transition.Counters.initial(parsed, BINS)
  assert tokens(counters) == (2, [0, 0], 0)

  def take(learner):
    nonlocal counters
    taken, changes = barrier.take(counters, learner, True, OPS)
    counters = transition.apply(counters, changes)
    return bool(taken)

  def push(learner):
    nonlocal counters
    result = transition.push(counters, 0 if counters.timestamp == 0 else 1,
                             parsed, BINS, learner=learner)
    counters = transition.apply(counters, result.changes)

  assert take(0) and tokens(counters) == (1, [1, 0], 0)
  assert take(1) and tokens(counters) == (0, [1, 1], 0)
  assert not take(0) and tokens(counters) == (0, [1, 1], 0)  # waits
  push(0)
  assert tokens(counters) == (0, [0, 1], 1)
  push(1)  # the round: λ = 2 tokens back
  assert tokens(counters) == (2, [0, 0], 0) and counters.timestamp == 1
  assert take(0) and tokens(counters) == (1, [1, 0], 0)
  held, changes = barrier.release(counters, 0, OPS)
  counters = transition.apply(counters, changes)
  assert held == 1 and tokens(counters) == (2, [0, 0], 0)
  counters = transition.apply(counters, barrier.open_barrier(2))
  assert tokens(counters) == (4, [0, 0], 0)  # OPENED
  counters = transition.apply(counters, barrier.refill(counters, 2))
  assert tokens(counters) == (2, [0, 0], 0)  # EXACT


def test_a_dead_incarnation_takes_nothing_and_its_push_returns_nothing():
  parsed = protocol_lib.parse_protocol("hardsync", 2)
  counters = transition.Counters.initial(parsed, BINS)
  taken, changes = barrier.take(counters, 1, False, OPS)
  assert not taken
  assert tokens(transition.apply(counters, changes)) == (2, [0, 0], 0)
  push = transition.push(counters, 0, parsed, BINS, learner=1, live=False)
  after = transition.apply(counters, push.changes)
  assert tokens(after) == (2, [0, 0], 0) and after.duplicates == 1


def test_refill_keeps_the_pending_gradients_tokens():
  # λ = 3 with one gradient pending and a token held by a learner that is
  # gone: refill makes λ - pending = 2 available and none held.
  parsed = protocol_lib.parse_protocol("hardsync", 3)
  counters = transition.apply(transition.Counters.initial(parsed, BINS), [
      ("available", None, -2), ("holding", 0, 1), ("pending", None, 1)])
  counters = transition.apply(counters, barrier.refill(counters, 3))
  assert tokens(counters) == (2, [0, 0, 0], 1)
  assert barrier.tokens_in_play(counters) == 3


def test_the_docstring_backup_trajectory():
  # λ = 3, one backup (c = 2): the round takes learners 0 and 1; learner 2's
  # gradient of version 0 arrives late, is dropped, and its token stays with
  # it for its pull of version 1, which no fast learner can take.
  parsed = protocol_lib.parse_protocol("1-backup-hardsync", 3)
  counters = transition.Counters.initial(parsed, BINS)
  pulled = {}

  def take(learner):
    nonlocal counters
    if barrier.reuse(counters, learner, True, OPS):
      pulled[learner] = int(counters.timestamp)
      return "reused"
    taken, changes = barrier.take(counters, learner, True, OPS)
    counters = transition.apply(counters, changes)
    if taken:
      pulled[learner] = int(counters.timestamp)
    return bool(taken)

  def push(learner):
    nonlocal counters
    result = transition.push(counters, pulled.pop(learner), parsed, BINS,
                             learner=learner)
    counters = transition.apply(counters, result.changes)
    return int(result.staleness), bool(result.accepted)

  assert all(take(learner) for learner in range(3))
  assert tokens(counters) == (0, [1, 1, 1], 0)
  assert push(0) == (0, True) and tokens(counters) == (0, [0, 1, 1], 1)
  assert push(1) == (0, True)  # the round: c = 2 tokens back
  assert tokens(counters) == (2, [0, 0, 1], 0) and counters.timestamp == 1
  assert take(0) and take(1) and tokens(counters) == (0, [1, 1, 1], 0)
  assert push(2) == (1, False)  # late: dropped, token kept
  assert tokens(counters) == (0, [1, 1, 1], 0) and counters.dropped == 1
  assert push(0) == (0, True)
  assert take(0) is False  # learner 0 waits for the round...
  assert take(2) == "reused" and pulled[2] == 1  # ...learner 2 does not
  assert push(2) == (0, True) and counters.timestamp == 2
  assert tokens(counters) == (2, [0, 1, 0], 0)
  # timestamp * c + pending == received - dropped
  assert 2 * 2 + 0 == counters.received - counters.dropped


def test_a_late_starter_leaves_its_token_to_a_fast_learner():
  # barrier.py's last trajectory (λ = 3, one backup, c = 2): learner 0 has
  # not come for its token yet, so learner 1, whose gradient is pending,
  # takes it and reads version 0 again. Learner 2's push completes the
  # round; learner 1's second gradient of version 0 is the late one,
  # dropped with σ = 1, though learner 1 is no straggler.
  parsed = protocol_lib.parse_protocol("1-backup-hardsync", 3)
  counters = transition.Counters.initial(parsed, BINS)

  def take(learner):
    nonlocal counters
    assert not barrier.reuse(counters, learner, True, OPS)
    taken, changes = barrier.take(counters, learner, True, OPS)
    counters = transition.apply(counters, changes)
    return bool(taken)

  def push(learner, pulled):
    nonlocal counters
    result = transition.push(counters, pulled, parsed, BINS, learner=learner)
    counters = transition.apply(counters, result.changes)
    return int(result.staleness), bool(result.accepted)

  assert take(1) and take(2) and tokens(counters) == (1, [0, 1, 1], 0)
  assert push(1, 0) == (0, True) and tokens(counters) == (1, [0, 0, 1], 1)
  assert take(1) and tokens(counters) == (0, [0, 1, 1], 1)  # version 0 again
  assert push(2, 0) == (0, True) and counters.timestamp == 1
  assert tokens(counters) == (2, [0, 1, 0], 0)
  assert push(1, 0) == (1, False)  # a fast learner's gradient is the late one
  assert tokens(counters) == (2, [0, 1, 0], 0) and counters.dropped == 1
  assert counters.learners.tolist() == [0, 2, 1]
  assert barrier.tokens_in_play(counters) == 3
  # Plain hardsync (λ = 2, c = 2) the same way: learner 0's two gradients
  # make the round while learner 1 has not pulled; both have σ = 0.
  parsed = protocol_lib.parse_protocol("hardsync", 2)
  counters = transition.Counters.initial(parsed, BINS)
  assert take(0) and push(0, 0) == (0, True)
  assert take(0) and push(0, 0) == (0, True)
  assert counters.timestamp == 1 and tokens(counters) == (2, [0, 0], 0)
  assert counters.learners.tolist() == [2, 0]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("protocol,num_learners", [
    ("hardsync", 1), ("hardsync", 2), ("hardsync", 4),
    ("1-backup-hardsync", 2), ("1-backup-hardsync", 4),
    ("3-backup-hardsync", 4)])
def test_conservation_through_random_transitions(seed, protocol,
                                                 num_learners):
  # Takes, pushes (kept, dropped by max_staleness, duplicates), deaths with
  # release: available + Σ held + pending == λ after each. An open breaks
  # it (OPENED) and a refill restores it. With backups, a late push keeps
  # its learner's token and that learner's next pull reuses it.
  rng = np.random.default_rng(seed)
  parsed = protocol_lib.parse_protocol(protocol, num_learners)
  counters = transition.Counters.initial(parsed, BINS)
  holding = [0] * num_learners  # tokens each learner's live steps hold
  kept = [False] * num_learners  # ... of which kept from a late push
  for _ in range(300):
    learner = int(rng.integers(num_learners))
    move = rng.random()
    if move < 0.45 and holding[learner] == 0:
      taken, changes = barrier.take(counters, learner, True, OPS)
      counters = transition.apply(counters, changes)
      holding[learner] += int(taken)
    elif move < 0.45 and kept[learner]:
      assert barrier.reuse(counters, learner, True, OPS)
      kept[learner] = False
    elif move < 0.9 and holding[learner] and not kept[learner]:
      # A pull of the previous version now and then, so that
      # max_staleness=0 drops some gradients.
      pulled = max(0, int(counters.timestamp) - int(rng.integers(2)))
      push = transition.push(
          counters, pulled, parsed, BINS, learner=learner,
          fresh=bool(rng.random() > 0.1),
          max_staleness=None if rng.random() > 0.1 else 0)
      counters = transition.apply(counters, push.changes)
      late = bool(push.delivered) and not bool(push.accepted)
      kept[learner] = bool(parsed.backup) and late
      holding[learner] -= not kept[learner]
    else:
      _, changes = barrier.release(counters, learner, OPS)
      counters = transition.apply(counters, changes)
      holding[learner] = 0
      kept[learner] = False
    assert barrier.tokens_in_play(counters) == num_learners
    assert counters.holding.tolist() == holding
    assert received_minus_dropped(counters, parsed)
  assert counters.dropped > 0 and counters.duplicates > 0
  counters = transition.apply(counters, barrier.open_barrier(num_learners))
  assert barrier.tokens_in_play(counters) == 2 * num_learners
  counters = transition.apply(counters, barrier.refill(counters,
                                                       num_learners))
  assert barrier.tokens_in_play(counters) == num_learners


def received_minus_dropped(counters, parsed):
  """The shard invariant: timestamp * c + pending == received - dropped."""
  return (counters.timestamp * parsed.gradients_per_update +
          counters.pending == counters.received - counters.dropped)
