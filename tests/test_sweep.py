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
  keys = [sweep.point_key(p) for p in points]
  assert keys == ["hardsync__none__mu4__lambda2",
                  "hardsync__none__mu4__lambda4",
                  "3-softsync__none__mu4__lambda4",
                  "async__none__mu4__lambda2",
                  "async__none__mu4__lambda4"]
  assert [(s[0], s[3]) for s in skipped] == [("3-softsync", "2")]
  assert [p["n"] for p in points] == [1, 1, 3, 2, 4]
  with pytest.raises(ValueError, match="lr_policy"):
    sweep.grid(["async"], ["half"], ["4"], ["2"])


def run_sweep(out_dir):
  return subprocess.run(
      [sys.executable, "-m", "launch.sweep", "--backend=simulator",
       "--dataset=synthetic", "--model=mlp", "--learners=2,4",
       "--minibatches=4", "--protocols=hardsync,3-softsync",
       "--lr_policies=none", "--steps_per_epoch=20", "--lr=0.05",
       f"--out_dir={out_dir}"], cwd=REPO, capture_output=True, text=True,
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
