"""transition.push: a push's counters worked out by hand, with no cluster."""

import numpy as np
import pytest

from rudra_tf import barrier
from rudra_tf import protocol as protocol_lib
from rudra_tf import transition

BINS = 8


def play(protocol, num_learners, pushes, **kwargs):
  """Applies pushes [(pulled timestamp, learner), ...]; returns the
  counters after each and each Push."""
  parsed = protocol_lib.parse_protocol(protocol, num_learners)
  counters = transition.Counters.initial(parsed, BINS)
  trajectory = []
  for pulled, learner in pushes:
    push = transition.push(counters, pulled, parsed, BINS, learner=learner,
                           **kwargs)
    counters = transition.apply(counters, push.changes)
    trajectory.append((counters, push))
  return trajectory


def clock(trajectory):
  return [(int(c.timestamp), int(c.pending)) for c, _ in trajectory]


def test_two_softsync_trajectory_of_the_module_docstring():
  # λ = 4, c = 2: pulled 0,0 at t=0 (σ 0, 0: update 1), then pulled 0,0 at
  # t=1 (σ 1, 1: update 2).
  trajectory = play("2-softsync", 4, [(0, 0), (0, 1), (0, 2), (0, 3)])
  assert clock(trajectory) == [(0, 1), (1, 0), (1, 1), (2, 0)]
  assert [int(p.staleness) for _, p in trajectory] == [0, 0, 1, 1]
  assert [bool(p.complete) for _, p in trajectory] == [False, True, False,
                                                       True]
  last, _ = trajectory[-1]
  assert last.histogram.tolist() == [2, 2, 0, 0, 0, 0, 0, 0]
  assert (last.received, last.staleness_sum, last.staleness_max) == (4, 2, 1)
  assert last.learners.tolist() == [1, 1, 1, 1]
  assert (last.dropped, last.duplicates) == (0, 0)


def test_max_staleness_drops_and_counts():
  # The same pushes with max_staleness=0: σ = 1 twice is dropped, counted
  # as received and dropped, and neither pending nor the clock moves.
  trajectory = play("2-softsync", 4, [(0, 0), (0, 1), (0, 2), (0, 3)],
                    max_staleness=0)
  assert clock(trajectory) == [(0, 1), (1, 0), (1, 0), (1, 0)]
  assert [bool(p.accepted) for _, p in trajectory] == [True, True, False,
                                                       False]
  last, _ = trajectory[-1]
  assert (last.received, last.dropped) == (4, 2)
  assert last.histogram.tolist()[:2] == [2, 2]


def test_async_updates_at_every_push_and_the_last_bin_holds_the_tail():
  # λ = 2, c = 1. Pulls at 0, 0, 0, then one pulled at 0 after 12 updates:
  # σ = 0, 1, 2, then 12 -> bin 7 (the last, σ >= 7); the exact sum keeps
  # the mean.
  pushes = [(0, 0), (0, 1), (0, 0)] + [(3 + i, 1) for i in range(9)] + \
      [(0, 0)]
  trajectory = play("async", 2, pushes)
  last, push = trajectory[-1]
  assert int(push.staleness) == 12
  assert (last.timestamp, last.pending) == (13, 0)
  assert last.histogram.tolist() == [10, 1, 1, 0, 0, 0, 0, 1]
  assert (last.staleness_sum, last.staleness_max) == (15, 12)


def test_a_duplicate_and_a_dead_incarnation_change_only_duplicates():
  parsed = protocol_lib.parse_protocol("1-softsync", 2)
  start = transition.apply(transition.Counters.initial(parsed, BINS), [
      ("pending", None, 1), ("received", None, 1), ("histogram", 0, 1)])
  for kwargs in ({"fresh": False}, {"live": False}):
    push = transition.push(start, 0, parsed, BINS, learner=1, **kwargs)
    after = transition.apply(start, push.changes)
    assert not push.delivered and not push.complete
    assert _same(after._replace(duplicates=0), start)
    assert after.duplicates == 1


def _same(a, b):
  return all(np.array_equal(x, y) for x, y in zip(a, b))


def test_hardsync_round_with_tokens_conserved():
  # λ = 3, c = 3: three takes, three pushes; the third completes the round
  # and hands out 3 tokens. available + held + pending == 3 throughout.
  parsed = protocol_lib.parse_protocol("hardsync", 3)
  counters = transition.Counters.initial(parsed, BINS)
  seen = []
  for learner in range(3):
    taken, changes = barrier.take(counters, learner, True,
                                  transition.NUMPY_OPS)
    assert taken
    counters = transition.apply(counters, changes)
    seen.append(barrier.tokens_in_play(counters))
  assert (counters.available, counters.holding.tolist()) == (0, [1, 1, 1])
  backs = []
  for learner in range(3):
    push = transition.push(counters, 0, parsed, BINS, learner=learner)
    counters = transition.apply(counters, push.changes)
    backs.append(int(push.tokens_back))
    seen.append(barrier.tokens_in_play(counters))
  assert backs == [0, 0, 3]
  assert (counters.timestamp, counters.pending, counters.available) == (1, 0,
                                                                        3)
  assert counters.holding.tolist() == [0, 0, 0]
  assert seen == [3] * 6


@pytest.mark.parametrize("protocol,num_learners", [
    ("hardsync", 4), ("1-softsync", 4), ("2-softsync", 4), ("async", 4),
    ("3-softsync", 7)])
def test_invariant_after_random_pushes(protocol, num_learners):
  # timestamp * c + pending == received - dropped, whatever the order.
  rng = np.random.default_rng(0)
  parsed = protocol_lib.parse_protocol(protocol, num_learners)
  counters = transition.Counters.initial(parsed, BINS)
  c = parsed.gradients_per_update
  for _ in range(200):
    pulled = int(rng.integers(max(0, counters.timestamp - 5),
                              counters.timestamp + 1))
    push = transition.push(counters, pulled, parsed, BINS, max_staleness=3,
                           learner=int(rng.integers(num_learners)),
                           fresh=bool(rng.random() > 0.1))
    counters = transition.apply(counters, push.changes)
    assert counters.timestamp * c + counters.pending == \
        counters.received - counters.dropped
    assert 0 <= counters.pending < c
    assert counters.histogram.sum() == counters.received
    assert counters.learners.sum() == counters.received
