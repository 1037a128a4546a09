"""launch/local_cluster.py: the local multi-process cluster trains, restarts a
learner, and leaves no process behind."""

import json
import re
import signal
import threading

import pytest

from launch import gpus
from tests.processes import (SMALL_JOB, assert_all_gone, descendants,
                             launch)
from tests.support import run_in_fresh_process


def test_local_cluster_trains_and_leaves_no_process(tmp_path):
  results = tmp_path / "results.json"
  job = launch(SMALL_JOB + [f"--results={results}",
                            f"--log_dir={tmp_path / 'logs'}"])
  children, lines = [], []
  for line in job.stdout:
    lines.append(line)
    if not children and line.startswith("[chief:0]"):
      children = descendants(job)
  job.wait(timeout=300)
  output = "".join(lines)
  assert job.returncode == 0, output
  assert len(children) == 4, children  # ps, 2 workers, chief
  assert_all_gone(children)
  for task in ("[ps:0]", "[worker:0]", "[worker:1]", "[chief:0]"):
    assert task in output
  assert "[chief:0] epoch 1/1: loss" in output and "staleness mean" in output
  if not gpus.nvidia_driver_installed():  # as on this project's machines
    assert "cudart_stub" not in output and "cuInit" not in output, output
  saved = json.loads(results.read_text())
  assert saved["gradients"] == 12 and saved["updates"] == 12
  assert sum(saved["staleness_histogram"]) == 12
  assert 0.0 <= saved["test_accuracy"] <= 1.0
  assert (tmp_path / "logs" / "run.png").stat().st_size > 10000
  assert any(p.name.startswith("events.out.tfevents")
             for p in (tmp_path / "logs").iterdir())
  # The trained model, saved where --log_dir puts it by default, loads
  # with plain tf_keras: no rudra_tf, no cluster.
  assert saved["model_path"] == str(tmp_path / "logs" / "model.keras")
  model = run_in_fresh_process(describe_saved_model,
                               path=saved["model_path"], dataset="synthetic")
  assert model["loaded_without_rudra_tf"] and model["optimizer"] == "SGD"
  # The trained weights: the chief's own test accuracy, reproduced.
  assert model["test_accuracy"] == pytest.approx(saved["test_accuracy"],
                                                 abs=1e-6)


def start_long_job(extra=()):
  """Starts a job that trains for long; returns it once the chief trains."""
  job = launch(SMALL_JOB[:-2] + ["--steps_per_epoch=100000", "--minibatch=8",
                                 *extra])
  for line in job.stdout:
    if line.startswith("[chief:0]") and "gradients per epoch" in line:
      return job, descendants(job)
  raise AssertionError(f"the chief never started: {job.wait()}")


def test_a_learner_beyond_its_restarts_stops_every_task():
  # tests/test_faults.py covers restarts; with none allowed, a dead learner
  # ends the job and takes every other task with it.
  job, children = start_long_job(["--learner_restarts=0"])
  worker = next(p for p in children
                if "worker" in json.loads(p.environ()["TF_CONFIG"])["task"]
                ["type"])
  worker.send_signal(signal.SIGKILL)
  output = job.stdout.read()
  job.wait(timeout=120)
  assert job.returncode == 2, output
  assert "task worker:" in output and "stopped every task" in output
  assert_all_gone(children)


def test_interrupting_the_launcher_stops_every_task():
  job, children = start_long_job(["--progress_every_s=0.2"])
  assert len(children) == 4
  # Inside the long epoch the chief says where it is (launch/progress.py);
  # the watchdog ends the job if no such line comes.
  watchdog = threading.Timer(120, job.kill)
  watchdog.start()
  line = next((line for line in job.stdout
               if line.startswith("[chief:0] epoch 1/1 step ")), "")
  watchdog.cancel()
  match = re.fullmatch(
      r"\[chief:0\] epoch 1/1 step (\d+)/100000 \| [\d.]+ updates/s \d+ "
      r"examples/s \| staleness mean [\d.]+ \| (\d+|\?) s left\n", line)
  assert match, line
  assert int(match.group(1)) <= 100000
  job.send_signal(signal.SIGINT)
  job.stdout.read()
  job.wait(timeout=120)
  assert job.returncode == 130
  assert_all_gone(children)


# ------------------------------------------------------------- scenarios
def describe_saved_model(path, dataset):
  """Loads a model launch/train.py saved, with plain tf_keras only, and
  evaluates it on `dataset`'s test split."""
  import sys  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  model = tf_keras.models.load_model(path)
  without_rudra = "rudra_tf" not in sys.modules
  from rudra_tf import datasets  # pylint: disable=g-import-not-at-top
  data = datasets.load_dataset(dataset)
  _, accuracy = model.evaluate(data.test_dataset(1000), verbose=0)
  return {"optimizer": type(model.optimizer).__name__,
          "loaded_without_rudra_tf": without_rudra,
          "test_accuracy": accuracy}
