"""Learners killed at random moments, from outside the job: totals exact.

The short version of `python -m benchmarks.chaos`: for every protocol, one
local run (λ = 3, 2 epochs of 600 steps; steps_per_execution 1 for
hardsync, 1-backup-hardsync and 2-softsync, 3 for 1-softsync and async) in which learners are SIGKILLed at random moments (seeded), as an
operator's `kill -9` would: not at closure boundaries nor at a gradient
count the fault injector picks. The launcher restarts each; TF re-runs its
closure. The run must end with exactly epochs × steps_per_epoch gradients,
`updates · c + pending == gradients`, and histogram and per-learner counts
that sum to it.
"""

import random

import pytest

from benchmarks import chaos

KILLS_PER_RUN = 3


@pytest.mark.parametrize("protocol,steps_per_execution", [
    ("hardsync", 1), ("1-backup-hardsync", 1), ("1-softsync", 3),
    ("2-softsync", 1), ("async", 3)])
def test_random_time_learner_kills_leave_the_totals_exact(
    tmp_path, protocol, steps_per_execution):
  rng = random.Random(f"{protocol}-{steps_per_execution}")
  result = chaos.learner_run(protocol, steps_per_execution, KILLS_PER_RUN,
                             str(tmp_path), rng, gap_s=2.0,
                             steps_per_epoch=600)
  print(result.line())
  # The kills landed while the job trained (the run is long enough).
  assert len(result.kills) >= 2, result.line()
  assert result.exact, result.line()


def test_check_totals_names_each_broken_count():
  good = {"gradients": 12, "dropped": 0, "gradients_per_update": 3,
          "updates": 4, "pending": 0, "staleness_histogram": [12],
          "learner_gradients": [6, 6]}
  assert chaos.check_totals(good, 12) == []
  # One gradient applied twice: every count is off by one.
  twice = dict(good, gradients=13, pending=1, staleness_histogram=[13],
               learner_gradients=[7, 6])
  assert chaos.check_totals(twice, 12) == ["gradients 13 != 12"]
  torn = dict(good, pending=2, learner_gradients=[6, 5])
  assert chaos.check_totals(torn, 12) == [
      "updates 4 * c 3 + pending 2 != 12", "learner counts sum to 11"]
