"""benchmarks/: which contenders run where, the ratios, and one real run."""

import json
import os
import subprocess
import sys
import time

import pytest

from benchmarks import cpu_meter
from benchmarks import protocols_on_links
from benchmarks import ps_capacity
from benchmarks import throughput
from launch import emulated_hosts

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
       "straggler": "", "examples_per_s": 1600.0, "updates_per_s": 25.0},
      {"contender": "parameter_server:fast", "model": "m", "learners": 2,
       "straggler": "", "examples_per_s": 800.0, "updates_per_s": 25.0},
      {"contender": "rudra:async:fast", "model": "m", "learners": 2,
       "straggler": "", "examples_per_s": 1000.0, "updates_per_s": 31.25}]
  throughput.add_ratios(rows)
  # A ":fast" row against stock's ":fast" too: 1000 / 800; and against
  # stock at one step per closure, as every row: 1000 / 400.
  assert rows[7]["vs_parameter_server_fast"] == 1.25
  assert rows[7]["vs_parameter_server"] == 2.5
  assert rows[6]["vs_parameter_server_fast"] == 1.0
  assert rows[2]["vs_parameter_server_fast"] is None  # not a ":fast" row
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
  cpu_begin = time.process_time()
  # Busy until this process has used 0.5 s of CPU: on a loaded machine the
  # loop gets less than a core and takes longer, and the meter must say so.
  while time.process_time() - cpu_begin < 0.5:
    pass
  middle = time.monotonic()
  # The reference: this process's own CPU clock over the busy window.
  busy_reference = time.process_time() - cpu_begin
  time.sleep(0.6)  # idle
  end = time.monotonic()
  samples = meter.samples()
  busy = cpu_meter.cpu_seconds_between(samples, begin, middle)
  idle = cpu_meter.cpu_seconds_between(samples, middle, end)
  # Samples every 50 ms, interpolated: off by at most about one interval's
  # CPU at each end of the window.
  assert busy == pytest.approx(busy_reference, abs=0.12)  # 0.5 s or more
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


def test_ps_capacity_ratios_pair_each_rule_with_its_plain_point():
  # 10 MB: 1 ps 4.0 and 2 ps 7.0 pushes/s without a rule; with "delay"
  # 3.0 and 6.0. vs 1 ps: 7/4 = 1.75 and 6/3 = 2.0 (each rule against its
  # own 1-ps point); vs none: 3/4 = 0.75 and 6/7 = 0.857.
  rows = ps_capacity.add_ratios([
      {"size_mb": 10, "ps_tasks": 1, "pushes_per_s": 4.0},
      {"size_mb": 10, "ps_tasks": 2, "pushes_per_s": 7.0},
      {"size_mb": 10, "ps_tasks": 1, "compensation": "delay",
       "pushes_per_s": 3.0},
      {"size_mb": 10, "ps_tasks": 2, "compensation": "delay",
       "pushes_per_s": 6.0}])
  assert [r["vs_one_ps"] for r in rows] == [1.0, 1.75, 1.0, 2.0]
  assert [r["vs_no_compensation"] for r in rows] == pytest.approx(
      [1.0, 1.0, 0.75, 6 / 7])


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


def test_protocol_ratios_pair_each_repeat_and_skip_a_missed_target():
  # Two repeats. Stock 300 and 400 examples/s; async 330 and 360: ratios
  # 1.1 and 0.9, median 1.0. Time to the target: hardsync 100 s and 200 s,
  # async 50 s and (missed) None: one ratio, 0.5; stock missed both.
  figures = {("parameter_server", 0): (300, None),
             ("parameter_server", 1): (400, None),
             ("rudra:hardsync", 0): (200, 100.0),
             ("rudra:hardsync", 1): (200, 200.0),
             ("rudra:async", 0): (330, 50.0),
             ("rudra:async", 1): (360, None)}
  rows = [{"scenario": "equal", "contender": contender, "repeat": repeat,
           "examples_per_s": float(examples), "time_to_target_s": time_s}
          for (contender, repeat), (examples, time_s) in figures.items()]
  combined = {row["contender"]: row for row in
              protocols_on_links.combine_repeats(
                  protocols_on_links.add_ratios(rows))}
  rudra = combined["rudra:async"]
  assert rudra["vs_parameter_server"] == pytest.approx(1.0)
  assert rudra["vs_parameter_server_range"] == pytest.approx([0.9, 1.1])
  assert rudra["time_vs_hardsync"] == pytest.approx(0.5)
  assert "time_vs_hardsync_range" not in rudra  # one repeat has it
  assert (rudra["reached"], rudra["repeats"]) == (1, 2)
  assert combined["parameter_server"]["time_to_target_s"] is None
  assert combined["rudra:hardsync"]["time_to_target_s_range"] == [100, 200]
  table = protocols_on_links.markdown(list(combined.values()), 0.8)
  assert "| equal | rudra:async | 345 | 1.00 (0.90–1.10) |" in table
  assert "| 1 of 2 |" in table


def test_a_lower_accuracy_is_timed_from_the_same_curve():
  # Epochs reached 0.70, 0.76, 0.81 after 10, 25 and 40 s of training.
  row = {"curve": [
      {"train_s": 10.0, "gradients": 100, "updates": 25, "test_accuracy": 0.70},
      {"train_s": 25.0, "gradients": 200, "updates": 50, "test_accuracy": 0.76},
      {"train_s": 40.0, "gradients": 300, "updates": 75, "test_accuracy": 0.81}]}
  at_75, = protocols_on_links.at_accuracy([row], 0.75)
  assert (at_75["time_to_target_s"], at_75["gradients_to_target"],
          at_75["updates_to_target"]) == (25.0, 200, 50)
  at_90, = protocols_on_links.at_accuracy([row], 0.9)
  assert at_90["time_to_target_s"] is None
  assert "time_to_target_s" not in row  # the run's own row is left as is


def test_a_contender_names_its_protocol_policy_and_rule():
  parse = protocols_on_links.parse_contender
  assert parse("rudra:async", "divide_by_n", 4) == (
      "rudra", "async", "divide_by_n", "none")
  assert parse("rudra:async:none+gap_aware", "divide_by_n", 4) == (
      "rudra", "async", "none", "gap_aware")
  assert parse("rudra:1-backup-hardsync+delay", "none", 4) == (
      "rudra", "1-backup-hardsync", "none", "delay")
  assert parse("parameter_server", "none", 4)[0] == "parameter_server"
  for bad in ("rudra:async:half", "rudra:async+dc", "stock:async"):
    with pytest.raises(ValueError, match="an lr_policy of none, divide_by_n"):
      parse(bad, "none", 4)


def test_protocols_on_links_refuses_bad_values_naming_the_valid_ones():
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.protocols_on_links",
       "--contenders=rudra:fast"], cwd=REPO, capture_output=True, text=True,
      timeout=120, env=dict(os.environ, PYTHONPATH=REPO))
  assert result.returncode == 2
  assert ("Unknown --contenders value 'rudra:fast'; valid values are "
          "parameter_server and rudra:<protocol>[:<lr_policy>]"
          '[+<compensation>] with a protocol of "hardsync", "async"'
          ) in result.stderr
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.protocols_on_links",
       "--contenders=rudra:4-backup-hardsync"], cwd=REPO,
      capture_output=True, text=True, timeout=120,
      env=dict(os.environ, PYTHONPATH=REPO))
  assert result.returncode == 2  # λ = 4 leaves no learner for the round
  assert "'rudra:4-backup-hardsync'" in result.stderr
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.protocols_on_links",
       "--report_accuracies=0.9"], cwd=REPO, capture_output=True, text=True,
      timeout=120, env=dict(os.environ, PYTHONPATH=REPO))
  assert result.returncode == 2
  assert ("--report_accuracies takes accuracies in (0, --target_accuracy = "
          "0.8], got '0.9'") in result.stderr
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.protocols_on_links",
       "--momentum=1"], cwd=REPO, capture_output=True, text=True,
      timeout=120, env=dict(os.environ, PYTHONPATH=REPO))
  assert result.returncode == 2
  assert "--momentum must be in [0, 1), got 1.0" in result.stderr


@pytest.mark.skipif(not emulated_hosts.available()[0],
                    reason=emulated_hosts.available()[1])
def test_a_protocol_trains_to_a_target_on_rate_limited_links(tmp_path):
  # Hardsync, λ = 2, epochs of 10 gradients (5 updates), a target no mlp
  # reaches in 2 epochs: both epochs run and the target is missed.
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.protocols_on_links",
       "--contenders=rudra:hardsync", "--scenarios=straggler",
       "--learners=2", "--model=mlp", "--steps_per_epoch=10",
       "--max_epochs=2", "--target_accuracy=0.99", "--link_mbit=100",
       "--momentum=0", f"--out_dir={tmp_path}"], cwd=REPO,
      capture_output=True, text=True,
      timeout=600, env=dict(os.environ, PYTHONPATH=REPO,
                            TF_CPP_MIN_LOG_LEVEL="2"))
  assert result.returncode == 0, result.stderr[-3000:]
  row, = json.loads((tmp_path / "protocols_on_links.json").read_text())
  assert [(r["epoch"], r["gradients"], r["updates"]) for r in row["curve"]
          ] == [(1, 10, 5), (2, 20, 10)]
  assert all(0.05 < r["test_accuracy"] < 0.99 for r in row["curve"])
  assert row["curve"][1]["train_s"] > row["curve"][0]["train_s"] > 0
  assert row["time_to_target_s"] is None and row["staleness_mean"] == 0.0
  assert row["momentum"] == 0
  # The rates are of epoch 2: 10 gradients, 5 updates.
  seconds = row["curve"][1]["train_s"] - row["curve"][0]["train_s"]
  assert row["pushes_per_s"] == pytest.approx(10 / seconds)
  assert row["updates_per_s"] == pytest.approx(5 / seconds)
  # A step pulls the whole model and pushes a whole gradient: 2M on the
  # learners' links per gradient, plus headers. The meter samples every
  # 0.1 s and interpolates between samples, so each end of this 1.5-second
  # epoch can be off by a period's traffic; one pull or push more or less
  # would be 1.5 or 2.5.
  assert 1.6 < row["learner_wire_m_per_gradient"] < 2.4
