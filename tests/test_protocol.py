"""Protocol math, worked out by hand (no TensorFlow runtime involved)."""

import pytest

from rudra_tf import protocol as p


@pytest.mark.parametrize("text,num_learners,n,c,barrier", [
    ("hardsync", 4, 1, 4, True),
    ("async", 4, 4, 1, False),
    ("1-softsync", 4, 1, 4, False),
    ("2-softsync", 4, 2, 2, False),
    ("3-softsync", 4, 3, 1, False),   # floor(4 / 3) = 1
    ("4-softsync", 4, 4, 1, False),   # λ-softsync is async
    ("2-softsync", 5, 2, 2, False),   # floor(5 / 2) = 2
    ("15-softsync", 30, 15, 2, False),
    ("hardsync", 1, 1, 1, True),
    (" Async ", 3, 3, 1, False),      # spelling is forgiving about case/space
    ("1-backup-hardsync", 4, 1, 3, True),  # c = λ − b
    ("3-backup-hardsync", 4, 1, 1, True),
])
def test_parse_protocol(text, num_learners, n, c, barrier):
  parsed = p.parse_protocol(text, num_learners)
  assert (parsed.n, parsed.gradients_per_update, parsed.barrier) == (
      n, c, barrier)
  assert parsed.num_learners == num_learners


@pytest.mark.parametrize("text,fragment", [
    ("softsync", "Unknown protocol 'softsync'"),
    ("sync", "Unknown protocol 'sync'"),
    ("0-softsync", "n = 0"),
    ("5-softsync", "n = 5"),
    ("-1-softsync", "Unknown protocol"),
    (None, "Unknown protocol None"),
    ("0-backup-hardsync", "b = 0"),
    ("4-backup-hardsync", "b = 4"),   # no learner left for the round
    ("backup-hardsync", "Unknown protocol"),
])
def test_bad_protocols_name_value_and_valid_ones(text, fragment):
  with pytest.raises(ValueError) as error:
    p.parse_protocol(text, 4)
  assert fragment in str(error.value)
  assert ('"hardsync", "async", "<n>-softsync" with 1 <= n <= λ or '
          '"<b>-backup-hardsync" with 1 <= b < λ') in str(error.value)
  assert "λ = 4" in str(error.value)


def test_backup_hardsync_names_its_backups_and_keeps_hardsyncs_rate():
  parsed = p.parse_protocol(" 2-Backup-Hardsync", 5)
  assert (parsed.name, parsed.backup, parsed.n) == ("2-backup-hardsync", 2, 1)
  assert p.parse_protocol("hardsync", 5).backup == 0
  # σ of an accepted gradient is 0, as in hardsync: α0/n divides by nothing.
  assert p.learning_rate_multiplier("divide_by_n", parsed) == 1.0


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_bad_learner_counts(bad):
  with pytest.raises(ValueError, match="num_learners"):
    p.parse_protocol("async", bad)


@pytest.mark.parametrize("policy,protocol,num_learners,expected", [
    ("none", "2-softsync", 4, 1.0),
    ("divide_by_n", "hardsync", 4, 1.0),      # staleness 0: no division
    ("divide_by_n", "1-softsync", 4, 1.0),
    ("divide_by_n", "2-softsync", 4, 0.5),
    ("divide_by_n", "3-softsync", 30, 1 / 3),
    ("divide_by_n", "async", 4, 0.25),        # async is λ-softsync
    ("divide_by_staleness", "async", 4, 1.0),  # per gradient instead
])
def test_learning_rate_multiplier(policy, protocol, num_learners, expected):
  parsed = p.parse_protocol(protocol, num_learners)
  assert p.learning_rate_multiplier(policy, parsed) == pytest.approx(expected)


def test_staleness_weights_by_hand():
  # σ:          0    1    2    3     4
  # 1/max(σ,1): 1    1   1/2  1/3   1/4
  weights = [p.staleness_weight("divide_by_staleness", s)
             for s in range(5)]
  assert weights == pytest.approx([1, 1, 0.5, 1 / 3, 0.25])
  assert [p.staleness_weight("none", s) for s in range(5)] == [1.0] * 5
  assert [p.staleness_weight("divide_by_n", s) for s in range(5)] == [1.0] * 5


def test_update_trajectory_by_hand():
  # 2-softsync, λ = 4, c = 2, α0 = 0.1, divide_by_staleness, every gradient
  # g = 1. Pushes arrive with σ = 0, 2, 1, 4:
  #   update 1: (1/2)(1·1 + 1/2·1) = 0.75  -> w = -0.075
  #   update 2: (1/2)(1·1 + 1/4·1) = 0.625 -> w = -0.1375
  c, w = 2, 0.0
  pending = []
  for sigma in (0, 2, 1, 4):
    pending.append(p.staleness_weight("divide_by_staleness", sigma) * 1.0)
    if len(pending) == c:
      w -= 0.1 * sum(pending) / c
      pending = []
  assert w == pytest.approx(-0.1375)


def test_lr_policy_and_max_staleness_validation():
  with pytest.raises(ValueError, match="'divide_by_2'.*'none', "
                     "'divide_by_n', 'divide_by_staleness'"):
    p.validate_lr_policy("divide_by_2")
  for bad in (0, -3, 1.5, True, "2"):
    with pytest.raises(ValueError, match="max_staleness"):
      p.validate_max_staleness(bad)
  assert p.validate_max_staleness(None) is None
  assert p.validate_max_staleness(3) == 3
  assert p.accepts_gradient(3, 3) and not p.accepts_gradient(4, 3)
  assert p.accepts_gradient(100, None)


def test_histogram_bins_cover_twice_the_paper_range():
  # The paper saw σ in 0..2n <= 2λ; bins leave room up to 4λ.
  assert p.histogram_bins(1) == 64
  assert p.histogram_bins(30) == 121


def test_a_learning_rate_policy_holds_its_multiplier_and_weight():
  # λ = 4, 2-softsync: α0/n multiplies by 1/2 and weighs every σ as 1;
  # α0/σ multiplies by 1 and weighs σ = 0, 1, 2, 4 as 1, 1, 1/2, 1/4.
  two_softsync = p.parse_protocol("2-softsync", 4)
  by_n = p.LearningRatePolicy.create("divide_by_n", two_softsync)
  assert (by_n.name, by_n.multiplier) == ("divide_by_n", 0.5)
  assert [by_n.weight(s) for s in (0, 1, 2, 4)] == [1.0] * 4
  by_sigma = p.LearningRatePolicy.create("divide_by_staleness",
                                                    two_softsync)
  assert by_sigma.multiplier == 1.0
  assert [by_sigma.weight(s) for s in (0, 1, 2, 4)] == [1.0, 1.0, 0.5, 0.25]
  hardsync = p.parse_protocol("hardsync", 4)
  assert p.LearningRatePolicy.create("divide_by_n",
                                                hardsync).multiplier == 1.0
  with pytest.raises(ValueError, match="'divide_by_two'.*'none'"):
    p.LearningRatePolicy.create("divide_by_two", hardsync)
