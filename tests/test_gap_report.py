"""launch/gap_report.py: gap-aware's logged divisor, by hand and end to end on
a small simulated sweep."""

import json
import math
import os
import subprocess
import sys

import pytest

from launch import gap_report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gaps(divisor, distance=0.1, step=0.01):
  return {"distance": distance, "typical_step": step, "divisor": divisor,
          "damping": 1 / divisor}


def row(seed, epoch_gaps, momentum=0.9):
  return {"protocol": "async", "n": 30, "lr_policy": "none",
          "compensation": "gap_aware", "momentum": momentum, "minibatch": 4,
          "learners": 30, "seed": seed, "epoch_gaps": epoch_gaps}


def test_seeds_are_averaged_per_epoch_and_a_nan_seed_left_out():
  # Seeds 0 and 1 at momentum 0.9, G per epoch [2, 4] and [4, NaN]: epoch 1
  # is (2 + 4) / 2 = 3 (2–4), epoch 2 only seed 0's 4 (seed 1 went NaN).
  rows = [row(0, [gaps(2.0), gaps(4.0)]),
          row(1, [gaps(4.0), gaps(math.nan)]),
          row(0, [gaps(5.0)], momentum=0.0),
          {"protocol": "async", "seed": 0}]  # not gap_aware: no epoch_gaps
  averaged = gap_report.averaged_gaps(rows)
  assert [(r["momentum"], r["statistic"]) for r in averaged] == [
      (0.0, name) for name, _ in gap_report.STATISTICS] + [
          (0.9, name) for name, _ in gap_report.STATISTICS]
  divisor = averaged[4 + 2]
  assert divisor["mean"] == [3.0, 4.0]
  assert (divisor["min"], divisor["max"], divisor["seeds"]) == (
      [2.0, 4.0], [4.0, 4.0], 1)
  damping = averaged[4 + 3]
  assert damping["mean"] == [pytest.approx(0.375), 0.25]
  table = gap_report.markdown(averaged)
  assert "| async | none | 0.9 | 4 | 30 | mean G | 1 | 3 (2–4) | 4 |" in table
  assert "| async | none | 0 | 4 | 30 | mean G | 1 | 5 |  |" in table


def test_a_seed_nan_from_the_start_shows_as_nan():
  averaged = gap_report.averaged_gaps([row(0, [gaps(math.nan)])])
  assert "| mean G | 0 | NaN |" in gap_report.markdown(averaged)


def test_rows_without_gaps_are_refused():
  with pytest.raises(ValueError, match="no row has epoch_gaps: only "
                     "simulated gap_aware points"):
    gap_report.averaged_gaps([{"protocol": "async", "seed": 0}])


def test_a_simulated_gap_aware_sweep_end_to_end(tmp_path):
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
  folder = tmp_path / "sweep"
  done = subprocess.run(
      [sys.executable, "-m", "launch.sweep", "--backend=simulator",
       "--dataset=synthetic", "--model=mlp", "--learners=1,3",
       "--minibatches=4", "--protocols=async", "--lr_policies=none",
       "--compensations=gap_aware", "--seeds=0,1", "--epochs=2",
       "--steps_per_epoch=20", "--lr=0.05", f"--out_dir={folder}"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr
  report = subprocess.run(
      [sys.executable, "-m", "launch.gap_report", f"--sweep={folder}",
       f"--out_dir={tmp_path / 'gaps'}"], cwd=REPO, env=env,
      capture_output=True, text=True, timeout=600)
  assert report.returncode == 0, report.stderr
  rows = json.loads((tmp_path / "gaps" / "gaps.json").read_text())
  by_key = {(r["learners"], r["statistic"]): r for r in rows}
  # One learner is never stale: G = 1 in both epochs, both seeds.
  assert by_key[(1, "divisor")]["mean"] == [1.0, 1.0]
  assert by_key[(1, "divisor")]["seeds"] == 2
  # Three learners: σ = 2, the weights moved, G > 1 in every epoch.
  assert all(g > 1 for g in by_key[(3, "divisor")]["mean"])
  assert "| epoch 1 | epoch 2 |" in report.stdout
  assert (tmp_path / "gaps" / "gaps.md").read_text() == report.stdout.rstrip(
      "\n") + "\n"
  empty = subprocess.run(
      [sys.executable, "-m", "launch.gap_report"], cwd=REPO, env=env,
      capture_output=True, text=True, timeout=600)
  assert empty.returncode == 2 and "--sweep is required" in empty.stderr
