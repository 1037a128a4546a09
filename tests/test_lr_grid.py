"""launch/lr_grid.py: sweeps at several α0 side by side, by hand and end to
end on two small simulated sweeps."""

import json
import os
import subprocess
import sys

import pytest

from launch import lr_grid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def row(protocol, n, policy, seed, error, **extra):
  return {"protocol": protocol, "n": n, "lr_policy": policy, "minibatch": 4,
          "learners": 30, "seed": seed, "test_error": error,
          "staleness_mean": float(n), "staleness_max": n, "updates": 10,
          "wall_time_s": 1.0, **extra}


def test_bad_sweeps_are_refused_with_an_example():
  with pytest.raises(ValueError, match=r"ALPHA=DIR with ALPHA > 0, got "
                     r"'runs/a' \(e.g. 0.02=runs/lr_grid/lr0.02\)"):
    lr_grid.parse_sweeps(["runs/a"])
  with pytest.raises(ValueError, match="got '0=runs/a'"):
    lr_grid.parse_sweeps(["0=runs/a"])
  with pytest.raises(ValueError, match="names an α0 twice"):
    lr_grid.parse_sweeps(["0.02=runs/a", "2e-2=runs/b"])
  assert lr_grid.parse_sweeps(["0.005=runs/a"]) == [(0.005, "runs/a")]


def test_a_row_run_at_another_rate_is_refused():
  with pytest.raises(ValueError, match=r"α0 = 0.02 sweep ran at lr = 0.05: "
                     r"async__none__mu4__lambda30__seed0"):
    lr_grid.rows_at(0.02, [row("async", 30, "none", 0, 0.2, lr=0.05)])


def test_hardsync_stands_for_every_policy_it_was_not_run_with():
  rows = [row("hardsync", 1, "none", 0, 0.17),
          row("async", 30, "none", 0, 0.9),
          row("async", 30, "divide_by_n", 0, 0.19)]
  tagged = lr_grid.rows_at(0.01, rows)
  hardsync = sorted(r["lr_policy"] for r in tagged
                    if r["protocol"] == "hardsync")
  assert hardsync == ["divide_by_n", "none"]
  assert all(r["lr"] == 0.01 for r in tagged) and len(tagged) == 4
  # Run with both policies already: nothing is copied.
  both = rows + [row("hardsync", 1, "divide_by_n", 0, 0.16)]
  assert len(lr_grid.rows_at(0.01, both)) == 4


def test_a_results_file_must_hold_per_seed_rows(tmp_path):
  averaged_rows = tmp_path / "lr_grid.json"
  averaged_rows.write_text(json.dumps([{"protocol": "async", "n": 30}]))
  with pytest.raises(ValueError, match="is not a sweep's results.json"):
    lr_grid.sweep_rows(str(averaged_rows))
  with pytest.raises(ValueError, match="missing.json does not exist"):
    lr_grid.sweep_rows(str(tmp_path / "missing.json"))
  per_seed = tmp_path / "results.json"
  per_seed.write_text(json.dumps([row("async", 30, "none", 0, 0.2)]))
  assert lr_grid.sweep_rows(str(per_seed))[0]["test_error"] == 0.2


def test_table_gives_each_rate_its_column_with_the_seeds_range():
  # α0 = 0.01: async/none seeds at 0.2 and 0.4 -> 0.3 (0.2–0.4); α0 = 0.05:
  # both diverged at 0.9; async/divide_by_n only at α0 = 0.05.
  folders = {
      "a": [row("async", 30, "none", 0, 0.2), row("async", 30, "none", 1, 0.4)],
      "b": [row("async", 30, "none", 0, 0.9, diverged=True),
            row("async", 30, "none", 1, 0.9, diverged=True),
            row("async", 30, "divide_by_n", 0, 0.25)]}
  averaged = lr_grid.average([(0.01, "a"), (0.05, "b")], folders.__getitem__)
  lines = lr_grid.markdown(averaged).splitlines()
  assert lines[0] == ("| protocol | n | lr_policy | μ | λ | α0 = 0.01 | "
                      "α0 = 0.05 |")
  assert lines[2] == "| async | 30 | divide_by_n | 4 | 30 | – | 0.2500 |"
  assert lines[3] == ("| async | 30 | none | 4 | 30 | 0.3000 (0.2000–0.4000) "
                      "| 0.9000 (0.9000–0.9000), 2 diverged |")


def test_two_simulated_sweeps_side_by_side(tmp_path):
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
  pairs = []
  for lr in ("0.05", "0.1"):
    folder = tmp_path / f"lr{lr}"
    done = subprocess.run(
        [sys.executable, "-m", "launch.sweep", "--backend=simulator",
         "--dataset=synthetic", "--model=mlp", "--learners=2",
         "--minibatches=4", "--protocols=hardsync,async",
         "--lr_policies=none,divide_by_n", "--steps_per_epoch=20",
         f"--lr={lr}", f"--out_dir={folder}"], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    pairs.append(f"{lr}={folder}")
  grid = subprocess.run(
      [sys.executable, "-m", "launch.lr_grid", "--sweeps=" + ",".join(pairs),
       f"--out_dir={tmp_path / 'grid'}"], cwd=REPO, env=env,
      capture_output=True, text=True, timeout=600)
  assert grid.returncode == 0, grid.stderr
  rows = json.loads((tmp_path / "grid" / "lr_grid.json").read_text())
  assert sorted({r["lr"] for r in rows}) == [0.05, 0.1]
  assert len(rows) == 2 * 4  # hardsync and async, two policies, two rates
  table = (tmp_path / "grid" / "lr_grid.md").read_text()
  assert "| α0 = 0.05 | α0 = 0.1 |" in table
  assert (tmp_path / "grid" / "lr_grid.png").stat().st_size > 10000
  # A sweep named by the results.json it wrote gives the same grid.
  from_file = subprocess.run(
      [sys.executable, "-m", "launch.lr_grid",
       f"--sweeps=0.05={tmp_path / 'lr0.05' / 'results.json'},{pairs[1]}",
       f"--out_dir={tmp_path / 'grid_from_file'}"], cwd=REPO, env=env,
      capture_output=True, text=True, timeout=600)
  assert from_file.returncode == 0, from_file.stderr
  assert json.loads((tmp_path / "grid_from_file" / "lr_grid.json")
                    .read_text()) == rows
  wrong = subprocess.run(
      [sys.executable, "-m", "launch.lr_grid", f"--sweeps=0.05={tmp_path}"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert wrong.returncode == 2
  assert "has no points/: not a launch.sweep out_dir" in wrong.stderr
  swapped = subprocess.run(
      [sys.executable, "-m", "launch.lr_grid",
       f"--sweeps=0.05={tmp_path / 'lr0.1'}"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert swapped.returncode == 2
  assert "α0 = 0.05 sweep ran at lr = 0.1" in swapped.stderr
