"""benchmarks/: which contenders run where, the ratios, and one real run."""

import json
import os
import subprocess
import sys
import time

import pytest

from benchmarks import cpu_meter
from benchmarks import ps_capacity
from benchmarks import throughput

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_contenders_that_apply_at_each_lambda():
  def names(num_learners, straggler=()):
    return [c for c in throughput.CONTENDERS
            if throughput.applicable(c, num_learners, straggler)]
  # λ = 1: every Rudra protocol is async (c = 1); no all-reduce peer.
  assert names(1) == ["single", "parameter_server", "parameter_server:fast",
                      "rudra:async", "rudra:async:fast", "rudra:async:keras3"]
  # λ = 2: 2-softsync is async.
  assert names(2) == ["single:global_batch", "parameter_server",
                      "parameter_server:fast",
                      "multi_worker_mirrored",
                      "rudra:hardsync", "rudra:1-softsync", "rudra:async",
                      "rudra:async:fast", "rudra:hardsync:keras3",
                      "rudra:async:keras3"]
  assert {"rudra:2-softsync", "rudra:2-softsync:keras3"} <= set(names(4))
  # A straggler needs per-learner input pipelines (stock PS has one).
  assert not any(name.startswith("parameter_server")
                 for name in names(4, ("600", "150")))
  with pytest.raises(ValueError, match="'warp'; valid contenders are single"):
    throughput.validate_contenders(["single", "warp"])


def test_ratios_against_stock_ps_and_single_process():
  rows = [
      {"contender": "single", "model": "m", "learners": 1, "straggler": "",
       "examples_per_s": 1000.0, "updates_per_s": 40.0},
      {"contender": "parameter_server", "model": "m", "learners": 2,
       "straggler": "", "examples_per_s": 400.0, "updates_per_s": 16.0},
      {"contender": "rudra:hardsync", "model": "m", "learners": 2,
       "straggler": "", "examples_per_s": 500.0, "updates_per_s": 10.0},
      {"contender": "rudra:async", "model": "m", "learners": 2,
       "straggler": "600,150", "examples_per_s": 300.0, "updates_per_s": 12.0},
      {"contender": "rudra:hardsync:keras3", "model": "m", "learners": 2,
       "straggler": "", "examples_per_s": 450.0, "updates_per_s": 9.0},
      {"contender": "single:global_batch", "model": "m", "learners": 2,
       "straggler": "", "examples_per_s": 1600.0, "updates_per_s": 25.0}]
  throughput.add_ratios(rows)
  # λ = 2 against one process at μλ per step: 500 / 1600.
  assert rows[2]["vs_single_global_batch"] == 0.3125
  assert rows[1]["vs_single_global_batch"] == 0.25
  # A straggler row too, as "vs single": against one process, no straggler.
  assert rows[3]["vs_single_global_batch"] == 0.1875
  # Keras 3 beside the same protocol with tf_keras: 450 / 500.
  assert rows[4]["vs_tf_keras"] == 0.9
  assert rows[2]["vs_tf_keras"] is None
  assert "| 0.90 |" in throughput.markdown(
      [dict(row, pushes_per_s=1.0, staleness_mean=0.0, cpu_ms_per_push=1.0,
            cpu_cores={"total": 1.0}, memory_mb={}) for row in rows[4:5]])
  assert rows[2]["vs_parameter_server"] == 1.25
  assert rows[2]["vs_single"] == 0.5
  # hardsync: λ = 2 gradients per update.
  assert rows[2]["updates_vs_parameter_server"] == 0.625
  assert rows[2]["updates_vs_single"] == 0.25
  assert rows[3]["vs_parameter_server"] is None  # no stock run with it
  assert rows[3]["updates_vs_parameter_server"] is None
  assert rows[3]["vs_single"] == 0.3
  assert rows[3]["updates_vs_single"] == 0.3


def test_capacity_pushes_shrink_for_big_models():
  assert ps_capacity.steps_for(1, 1000) == 1000
  assert ps_capacity.steps_for(100, 1000) == 100
  assert ps_capacity.steps_for(1000, 1000) == 20  # one closure at least


def test_cpu_between_two_instants_interpolates_the_samples():
  # (monotonic s, cumulative CPU s): 0.5 cores from 10 to 12 s, then 2 cores.
  samples = [(10.0, 1.0), (12.0, 2.0), (13.0, 4.0)]
  # 11 s: 1.0 + 0.5 * 1 = 1.5; 12.5 s: 2.0 + 2 * 0.5 = 3.0.
  assert cpu_meter.cpu_seconds_between(samples, 11.0, 12.5) == 1.5
  assert cpu_meter.cpu_seconds_between(samples, 10.0, 13.0) == 3.0
  assert cpu_meter.cpu_seconds_between(samples, 12.0, 12.0) == 0.0
  # Samples that do not cover the interval give no figure, not a guess.
  assert cpu_meter.cpu_seconds_between(samples, 9.0, 12.0) is None
  assert cpu_meter.cpu_seconds_between(samples, 11.0, 13.5) is None
  assert cpu_meter.cpu_seconds_between([], 1.0, 2.0) is None


def test_cpu_meter_counts_this_process_busy_and_idle():
  meter = cpu_meter.CpuMeter(interval_s=0.05)
  begin = time.monotonic()
  while time.monotonic() - begin < 0.6:  # busy: about one core
    pass
  middle = time.monotonic()
  time.sleep(0.6)  # idle
  end = time.monotonic()
  samples = meter.samples()
  busy = cpu_meter.cpu_seconds_between(samples, begin, middle)
  idle = cpu_meter.cpu_seconds_between(samples, middle, end)
  assert 0.3 < busy / (middle - begin) < 1.2
  assert idle / (end - middle) < 0.2


def test_one_run_side_by_side(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.throughput", "--models=mlp",
       "--dataset=synthetic", "--learners=1",
       "--contenders=single,parameter_server,rudra:async",
       "--steps_per_epoch=20", f"--out_dir={tmp_path}"],
      cwd=REPO, capture_output=True, text=True, timeout=600,
      env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2"))
  assert result.returncode == 0, result.stderr[-3000:]
  rows = json.loads((tmp_path / "throughput.json").read_text())
  assert [r["contender"] for r in rows] == ["single", "parameter_server",
                                            "rudra:async"]
  single, stock, rudra = rows
  assert single["vs_single"] == 1.0 and stock["vs_parameter_server"] == 1.0
  # One learner, async: 20 timed gradients, each one update.
  assert rudra["pushes_per_s"] == pytest.approx(rudra["updates_per_s"])
  assert rudra["examples_per_s"] == pytest.approx(32 * rudra["pushes_per_s"])
  assert rudra["staleness_mean"] == 0.0
  for row in (stock, rudra):  # every task reported its memory and CPU
    assert set(row["memory_mb"]) == {"chief", "worker", "ps"}
    assert min(row["memory_mb"].values()) > 50
    cores = row["cpu_cores"]
    assert set(cores) == {"chief", "worker", "ps", "total"}
    assert cores["total"] == pytest.approx(
        cores["chief"] + cores["worker"] + cores["ps"])
    assert cores["worker"] > 0.05  # the learner computed the gradients
  for row in rows:  # CPU of all tasks per gradient, from the same epoch
    assert row["cpu_ms_per_push"] == pytest.approx(
        1000 * row["cpu_cores"]["total"] / row["pushes_per_s"])
  assert set(single["cpu_cores"]) == {"single", "total"}
  assert "| mlp | 1 | – | rudra:async |" in (
      tmp_path / "throughput.md").read_text()


def test_embedding_tables_side_by_side(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.embeddings", "--rows=2000",
       "--steps=3", "--contenders=parameter_server,rudra:dense_push,rudra",
       f"--out_dir={tmp_path}"],
      cwd=REPO, capture_output=True, text=True, timeout=600,
      env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2"))
  assert result.returncode == 0, result.stderr[-3000:]
  written = json.loads((tmp_path / "embeddings.json").read_text())
  figures = written["figures"]
  assert [f["contender"] for f in figures] == [
      "parameter_server", "rudra:dense_push", "rudra"]
  stock = figures[0]["steps_per_s"]
  for entry in figures:
    assert entry["rows"] == 2000
    assert entry["table_mb"] == pytest.approx(2000 * 32 * 4 / 2**20)
    assert entry["ms_per_step"] == pytest.approx(1000 / entry["steps_per_s"])
    assert entry["vs_stock_ps"] == pytest.approx(entry["steps_per_s"] / stock)
  assert "| 2000 | 0.2 | rudra |" in (tmp_path / "embeddings.md").read_text()


def test_embedding_benchmark_refuses_an_unknown_contender(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.embeddings", "--contenders=rudra:fast",
       f"--out_dir={tmp_path}"],
      cwd=REPO, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2"))
  assert result.returncode != 0
  assert ("Unknown contender 'rudra:fast'; valid contenders are "
          "parameter_server, rudra:dense_push, rudra") in result.stderr


def test_network_bound_of_ps_capacity_on_links():
  # 10 MB = 80 Mbit at B = 40 Mbit/s each way. A ps host sends pulls and
  # takes pushes side by side: k ps allow k · 40/80 = k/2 steps/s; a
  # learner pulls then pushes: 40/160 = 1/4 step/s, λ learners λ/4.
  bound = ps_capacity.network_bound
  assert bound(1, 8, 40, 10) == 0.5    # the ps host's link
  assert bound(2, 8, 40, 10) == 1.0
  assert bound(4, 8, 40, 10) == 2.0    # = the learners' 8/4: both limit
  assert bound(4, 2, 40, 10) == 0.5    # two learners cannot feed 4 ps
  assert bound(1, 8, 0, 10) is None    # no rate limit: no bound


def test_repeats_give_median_ratios_with_their_range():
  # Three repeats of a pair: stock PS 400, 500, 600 examples/s; Rudra 440,
  # 450, 900. Each repeat's ratio is of its own pair: 1.1, 0.9, 1.5; the
  # median 1.1, the range 0.9–1.5 (the median of the figures alone would
  # give 450 / 500 = 0.9).
  rows = []
  for repeat, (stock, rudra) in enumerate([(400, 440), (500, 450),
                                           (600, 900)]):
    for contender, examples in (("parameter_server", stock),
                                ("rudra:async", rudra)):
      rows.append({"contender": contender, "model": "m", "learners": 2,
                   "straggler": "", "repeat": repeat,
                   "examples_per_s": float(examples),
                   "updates_per_s": examples / 32})
  combined = throughput.combine_repeats(throughput.add_ratios(rows))
  rudra = [row for row in combined if row["contender"] == "rudra:async"][0]
  assert rudra["repeats"] == 3 and "repeat" not in rudra
  assert rudra["examples_per_s"] == 450.0
  assert rudra["vs_parameter_server"] == pytest.approx(1.1)
  assert rudra["vs_parameter_server_range"] == pytest.approx([0.9, 1.5])
  assert "1.10 (0.90–1.50)" in throughput._ratio(rudra, "vs_parameter_server")  # pylint: disable=protected-access
