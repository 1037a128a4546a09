"""launch/sweep.py: the grid, resumable points, and the reports."""

import csv
import json
import os
import subprocess
import sys

import pytest

from launch import sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_grid_skips_points_whose_n_exceeds_lambda():
  points, skipped = sweep.grid(["hardsync", "3-softsync", "async"],
                               ["none"], ["4"], ["2", "4"])
  keys = [sweep.point_key(p).rsplit("__seed0", 1)[0] for p in points]
  assert keys == ["hardsync__none__mu4__lambda2",
                  "hardsync__none__mu4__lambda4",
                  "3-softsync__none__mu4__lambda4",
                  "async__none__mu4__lambda2",
                  "async__none__mu4__lambda4"]
  assert [(s[0], s[3]) for s in skipped] == [("3-softsync", "2")]
  assert [p["n"] for p in points] == [1, 1, 3, 2, 4]
  with pytest.raises(ValueError, match="lr_policy"):
    sweep.grid(["async"], ["half"], ["4"], ["2"])


def test_grid_runs_each_point_once_per_seed():
  points, skipped = sweep.grid(["async", "3-softsync"], ["none"], ["4"],
                               ["2"], seeds=["0", "5"])
  assert [sweep.point_key(p) for p in points] == [
      "async__none__mu4__lambda2__seed0", "async__none__mu4__lambda2__seed5"]
  assert len(skipped) == 1  # 3-softsync at λ=2, reported once
  with pytest.raises(ValueError, match="seeds must be integers"):
    sweep.grid(["async"], ["none"], ["4"], ["2"], seeds=["x"])


def test_grid_crosses_compensations_and_momentums():
  points, _ = sweep.grid(["async"], ["none"], ["4"], ["2"],
                         compensations=["none", "gap_aware"],
                         momentums=["0.9", "0"])
  # Defaults stay out of the key: earlier sweeps' points keep theirs.
  assert [sweep.point_key(p) for p in points] == [
      "async__none__mu4__lambda2__seed0",
      "async__none__momentum0__mu4__lambda2__seed0",
      "async__none__gap_aware__mu4__lambda2__seed0",
      "async__none__gap_aware__momentum0__mu4__lambda2__seed0"]
  with pytest.raises(ValueError, match="Unknown compensation 'dc'"):
    sweep.grid(["async"], ["none"], ["4"], ["2"], compensations=["dc"])
  with pytest.raises(ValueError, match=r"momentums must be numbers in \[0, "
                     r"1\), got '1.5'"):
    sweep.grid(["async"], ["none"], ["4"], ["2"], momentums=["1.5"])


def test_table_averages_over_seeds():
  row = {"protocol": "async", "n": 2, "lr_policy": "none", "minibatch": 4,
         "learners": 2, "staleness_max": 1, "updates": 10, "wall_time_s": 1.0}
  rows = [dict(row, seed=0, test_error=0.2, staleness_mean=0.5),
          dict(row, seed=1, test_error=0.3, staleness_mean=1.0,
               staleness_max=3, wall_time_s=2.0)]
  line = sweep.markdown_table(rows).splitlines()[2]
  assert line == ("| async | 2 | none | none | 0.9 | 4 | 2 | 8 | 2 | 0.2500 "
                  "(0.2000–0.3000) | 0.75 | 3 | – | 10 | 1.5 |")
  # P(σ > 2n = 4), the mean over seeds: 0 of 4, then 1 of 4 (a σ = 5).
  rows[0]["staleness_histogram"] = [2, 2]
  rows[1]["staleness_histogram"] = [1, 1, 0, 0, 1, 1]
  line = sweep.markdown_table(rows).splitlines()[2]
  assert "| 0.75 | 3 | 0.12 | 10 | 1.5 |" in line
  # A seed whose test loss was NaN (null in launch.train's JSON) is counted.
  rows[1].update(test_error=0.9, diverged=sweep.diverged(None))
  assert sweep.diverged(float("nan")) and not sweep.diverged(0.4)
  line = sweep.markdown_table(rows).splitlines()[2]
  assert "| 0.5500 (0.2000–0.9000), 1 diverged |" in line


def test_curves_average_each_epoch_over_the_seeds():
  row = {"protocol": "hardsync", "n": 1, "lr_policy": "none", "minibatch": 8,
         "learners": 1, "staleness_mean": 0.0, "staleness_max": 0,
         "updates": 10, "wall_time_s": 1.0, "test_error": 0.1}
  assert sweep.curves_table([dict(row, seed=0, epoch_test_errors=[])]) is None
  # Epoch 1: 0.5, 0.7, 0.6 -> 0.6 (0.5–0.7); epoch 2: 0.3, 0.5, 0.1 -> 0.3.
  rows = [dict(row, seed=s, epoch_test_errors=curve) for s, curve in
          enumerate(([0.5, 0.3], [0.7, 0.5], [0.6, 0.1]))]
  averaged, = sweep.average_over_seeds(rows)
  assert averaged["curve"] == pytest.approx([0.6, 0.3])
  assert (averaged["curve_min"], averaged["curve_max"]) == ([0.5, 0.1],
                                                            [0.7, 0.5])
  header, _, line = sweep.curves_table(rows).splitlines()
  assert header == "| protocol | lr_policy | μ | λ | seeds | epoch 1 | epoch 2 |"
  assert line == ("| hardsync | none, momentum 0.9 | 8 | 1 | 3 | "
                  "0.6000 (0.5000–0.7000) | 0.3000 (0.1000–0.5000) |")


def test_plot_labels_name_the_rule_and_bars_span_the_seeds():
  row = {"protocol": "async", "n": 4, "lr_policy": "divide_by_n",
         "minibatch": 32, "learners": 4, "staleness_max": 3, "updates": 10,
         "wall_time_s": 1.0, "staleness_mean": 1.5}
  assert sweep.rule_label(row) == "divide_by_n, momentum 0.9"
  assert (sweep.rule_label(dict(row, compensation="delay", momentum=0.0)) ==
          "divide_by_n+delay, momentum 0")
  # Seeds at 0.2, 0.3 and 0.7: mean 0.4, the bar 0.2 below and 0.3 above.
  averaged, = sweep.average_over_seeds(
      [dict(row, seed=s, test_error=e) for s, e in enumerate((0.2, 0.3, 0.7))])
  assert sweep.seed_range(averaged) == pytest.approx((0.2, 0.3))


def run_sweep(out_dir, *overrides):
  return subprocess.run(
      [sys.executable, "-m", "launch.sweep", "--backend=simulator",
       "--dataset=synthetic", "--model=mlp", "--learners=2,4",
       "--minibatches=4", "--protocols=hardsync,3-softsync",
       "--lr_policies=none", "--steps_per_epoch=20", "--lr=0.05",
       f"--out_dir={out_dir}", *overrides], cwd=REPO, capture_output=True,
      text=True,
      env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2"),
      timeout=600)


def test_sweep_writes_rows_table_and_plot_and_resumes(tmp_path):
  first = run_sweep(tmp_path)
  assert first.returncode == 0, first.stderr
  assert "skipped 3-softsync/none/μ=4/λ=2" in first.stdout
  assert first.stdout.count(": running") == 3
  rows = json.loads((tmp_path / "results.json").read_text())
  assert len(rows) == 3
  for row in rows:
    assert row["gradients"] == 20
    assert sum(row["staleness_histogram"]) == 20
    assert row["test_error"] == pytest.approx(1 - row["test_accuracy"])
    assert row["epoch_test_errors"] == []  # one epoch: no curve
  hardsync = [r for r in rows if r["protocol"] == "hardsync"]
  assert all(r["staleness_max"] == 0 for r in hardsync)
  with open(tmp_path / "results.csv") as stream:
    assert len(list(csv.DictReader(stream))) == 3
  table = (tmp_path / "table.md").read_text().splitlines()
  assert len(table) == 2 + 3 and table[0].startswith("| protocol |")
  assert (tmp_path / "sweep.png").stat().st_size > 10000
  second = run_sweep(tmp_path)  # every point finished: nothing reruns
  assert second.returncode == 0, second.stderr
  assert second.stdout.count("done before") == 3
  assert ": running" not in second.stdout
  assert json.loads((tmp_path / "results.json").read_text()) == rows
  # Another sweep into the same folder (a rule, no momentum, two epochs):
  # its point joins the reports beside the earlier ones, with its curve.
  third = run_sweep(tmp_path, "--learners=2", "--protocols=hardsync",
                    "--compensations=gap_aware", "--momentums=0",
                    "--epochs=2")
  assert third.returncode == 0, third.stderr
  assert third.stdout.count(": running") == 1
  every = json.loads((tmp_path / "results.json").read_text())
  assert len(every) == 4
  added, = [r for r in every if r.get("compensation") == "gap_aware"]
  assert added["momentum"] == 0.0 and added["gradients"] == 40
  first_epoch, last_epoch = added["epoch_test_errors"]
  assert last_epoch == pytest.approx(added["test_error"])
  assert 0 <= first_epoch <= 1
  assert "| hardsync | 1 | none | gap_aware | 0 | 4 | 2 |" in (
      tmp_path / "table.md").read_text()
  assert added["lr"] == 0.05 and added["epochs"] == 2
  curves = (tmp_path / "curves.md").read_text().splitlines()
  assert len(curves) == 3  # only the two-epoch point has a curve
  assert curves[2].startswith("| hardsync | none+gap_aware, momentum 0 | 4 "
                              "| 2 | 1 | ")
