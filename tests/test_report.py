"""report.py's pure helpers, by hand."""

import pytest

from rudra_tf import report


def test_fraction_above_counts_the_tail():
  # σ = 0: 5, 1: 3, 2: 1, 4: 1 (10 gradients). P(σ > 2) = 1/10 (the σ = 4),
  # P(σ > 1) = 2/10, P(σ > 0) = 5/10; an empty histogram has no tail.
  histogram = [5, 3, 1, 0, 1, 0, 0]
  assert report.fraction_above(histogram, 2) == 0.1
  assert report.fraction_above(histogram, 1) == 0.2
  assert report.fraction_above(histogram, 0) == 0.5
  assert report.fraction_above([0] * 7, 2) == 0.0


def test_fraction_above_refuses_a_threshold_the_last_bin_blurs():
  # The last bin counts σ >= 6: P(σ > 6) cannot be told from it.
  with pytest.raises(ValueError, match=r"P\(σ > 6\) needs more than 7 "
                     "histogram bins; this one has 7"):
    report.fraction_above([1] * 7, 6)


def test_mean_and_max_between_two_histograms():
  # Before: [2, 1]; after: [3, 1, 0, 2]: in between one σ = 0 and two σ = 3.
  mean, largest = report.histogram_delta_stats([2, 1, 0, 0], [3, 1, 0, 2])
  assert (mean, largest) == (2.0, 3)
