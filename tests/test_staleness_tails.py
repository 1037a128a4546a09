"""launch/staleness_tails.py: the tail statistics by hand, and its errors."""

import pytest

from launch import staleness_tails


def test_tail_statistics_by_hand():
  # n = 2: only σ = 5 is above 2n = 4, one push in four.
  assert staleness_tails.tail_statistics([0, 1, 5, 2], 2) == {
      "staleness_mean": 2.0, "staleness_max": 5, "tail_2n": 0.25}


def test_async_equal_speeds_row_by_hand():
  # λ = 4, equal speeds: σ = 0, 1, 2, 3, then 3 for every push (simulate.py),
  # so over 12 pushes the mean is (0 + 1 + 2 + 9 * 3) / 12 = 2.5. Steps of
  # one time unit from 0: the 12th push (the third of each learner) is at 3.
  row = staleness_tails.run(4, "async", "equal", 0, 12, None)
  assert (row["n"], row["staleness_mean"], row["staleness_max"],
          row["tail_2n"], row["simulated_time"]) == (4, 2.5, 3, 0.0, 3.0)
  assert row["histogram"][:5] == [1, 1, 1, 9, 0]
  assert len(row["histogram"]) == 17


def test_the_table_gives_the_tails_range_over_seeds():
  rows = [{"learners": 4, "protocol": "async", "n": 4, "speed": "normal:0.5",
           "staleness_mean": mean, "staleness_max": top, "tail_2n": tail,
           "simulated_time": time}
          for mean, top, tail, time in ((3.0, 12, 0.002, 30.2),
                                        (2.8, 13, 0.004, 31.8))]
  assert "| 4 | async | 4 | normal:0.5 | 2 | 2.90 | 13 | 0.003 " \
         "(0.002–0.004) | 31 |" in staleness_tails.markdown(rows)
  for row in rows:  # rows written before the time was kept
    del row["simulated_time"]
  assert "(0.002–0.004) | – |" in staleness_tails.markdown(rows)


def test_bad_speeds_are_refused_with_the_fix():
  with pytest.raises(ValueError, match="'normal:wide': the jitter after ':' "
                     "must be a number"):
    staleness_tails.parse_speed("normal:wide")
  with pytest.raises(ValueError, match="--speeds=measured plays a push "
                     "trace: give --speed_trace=FILE"):
    staleness_tails.speed_model("measured", 0, None)
  with pytest.raises(ValueError, match="Unknown speed model 'warp'"):
    staleness_tails.speed_model("warp:0.1", 0, None)
