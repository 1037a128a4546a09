"""launch/train.py as a command: one-line errors before any server, flags a
deploy refuses, resuming from --checkpoint_dir, a diverging run, a Keras 3
model (--keras=keras3)."""

import json
import socket

import pytest

from tests.processes import SMALL_JOB, launch


def finished(args):
  """Runs launch.train with `args` to its end; its output (it must succeed)."""
  job = launch(args)
  out, _ = job.communicate(timeout=300)
  assert job.returncode == 0, out
  return out


def test_cli_errors_are_one_line_before_any_server(tmp_path):
  bad = launch(["--learners=0"])
  out, _ = bad.communicate(timeout=60)
  assert bad.returncode == 2
  assert out.strip().splitlines()[-1] == "error: --learners must be >= 1, got 0."
  bad = launch(SMALL_JOB, env_extra={"TF_CONFIG": "{oops"})
  out, _ = bad.communicate(timeout=60)
  assert bad.returncode == 2 and "TF_CONFIG is not valid JSON" in out
  with socket.socket() as holder:  # a ps task whose port is taken
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],
               "ps": [f"127.0.0.1:{port}"]}
    bad = launch(SMALL_JOB, env_extra={"TF_CONFIG": json.dumps(
        {"cluster": cluster, "task": {"type": "ps", "index": 0}})})
    out, _ = bad.communicate(timeout=60)
  assert bad.returncode == 2 and f"127.0.0.1:{port}) is already in use" in out


@pytest.mark.parametrize("flag,fragment", [
    ("--gpus=1", "--gpus=1 works only in a local cluster"),
    ("--kill_task=worker:0@3", "--kill_task works only in a local cluster"),
])
def test_local_cluster_flags_are_refused_in_a_deploy(flag, fragment):
  # The same command runs every task of a deploy: a flag that only the local
  # launcher can honour is refused there, not ignored.
  cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],
             "ps": ["127.0.0.1:3"]}
  bad = launch(SMALL_JOB + [flag], env_extra={"TF_CONFIG": json.dumps(
      {"cluster": cluster, "task": {"type": "worker", "index": 0}})})
  out, _ = bad.communicate(timeout=60)
  assert bad.returncode == 2, out
  last = out.strip().splitlines()[-1]
  assert last.startswith(f"error: {fragment}") and "serving on" not in out


def test_checkpoint_dir_resumes_where_the_last_run_stopped(tmp_path):
  checkpoints, results = tmp_path / "ckpt", tmp_path / "results.json"
  common = SMALL_JOB[:-3] + ["--steps_per_epoch=12", "--minibatch=8",
                             f"--checkpoint_dir={checkpoints}",
                             f"--results={results}"]
  out = finished(common + ["--epochs=1"])
  assert json.loads(results.read_text())["gradients"] == 12
  out = finished(common + ["--epochs=2"])
  assert "resumed from" in out and "after epoch 1" in out
  assert "epoch 2/2" in out and "epoch 1/2" not in out
  saved = json.loads(results.read_text())
  # The protocol state came back: counts continue from the first run.
  assert saved["gradients"] == 24 and saved["updates"] == 24
  assert sum(saved["staleness_histogram"]) == 24


def test_a_diverging_run_stops_after_the_epoch_and_says_so(tmp_path):
  results = tmp_path / "results.json"
  job = launch(SMALL_JOB[:-2] + ["--steps_per_epoch=6", "--epochs=3",
                                 "--lr=1e30", f"--results={results}",
                                 f"--log_dir={tmp_path / 'logs'}"])
  output, _ = job.communicate(timeout=300)
  assert job.returncode == 0, output
  assert "training diverged: the loss of epoch 1 is nan; stopped." in output
  def refuse(constant):
    raise AssertionError(f"not strict JSON: {constant}")
  saved = json.loads(results.read_text(), parse_constant=refuse)
  assert saved["diverged_at_epoch"] == 1 and len(saved["epochs"]) == 1
  assert saved["epochs"][0]["loss"] is None  # NaN, written as null
  assert saved["gradients"] == 6  # epochs 2 and 3 never ran
  assert (tmp_path / "logs" / "run.png").exists()


def test_keras3_runs_resumes_and_saves_a_keras3_model(tmp_path):
  # --keras=keras3: the same job with a Keras 3 model (its fit through
  # rudra_tf), resumed from its checkpoint, saved as a Keras 3 model.
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  checkpoints, results = tmp_path / "ckpt", tmp_path / "results.json"
  model_path = tmp_path / "model.keras"
  common = SMALL_JOB[:-3] + ["--steps_per_epoch=12", "--minibatch=8",
                             "--keras=keras3",
                             f"--checkpoint_dir={checkpoints}",
                             f"--results={results}",
                             f"--save_model={model_path}"]
  out = finished(common + ["--epochs=1"])
  assert "mlp with keras3" in out
  assert json.loads(results.read_text())["gradients"] == 12
  out = finished(common + ["--epochs=2"])
  assert "resumed from" in out and "after epoch 1" in out
  saved = json.loads(results.read_text())
  assert saved["gradients"] == 24 and saved["updates"] == 24
  assert saved["config"]["keras"] == "keras3"
  served = keras.models.load_model(model_path)
  assert isinstance(served, keras.Model)
  probabilities = served.predict(np.zeros((2,) + served.input_shape[1:],
                                          "float32"), verbose=0)
  np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
  bad = launch(SMALL_JOB + ["--keras=keras2"])
  out, _ = bad.communicate(timeout=60)
  assert bad.returncode == 2
  assert out.strip().splitlines()[-1] == (
      "error: --keras='keras2' is unknown; valid values are tf_keras, keras3.")


def test_a_compensation_rule_trains_resumes_with_its_state_and_is_kept(
    tmp_path):
  # --compensation=gap_aware: the line at the start names it, the results
  # record it, the run resumes from its checkpoint (the rule's own state
  # coming back is tests/test_compensation_cluster.py's), and resuming under
  # another rule is refused.
  checkpoints, results = tmp_path / "ckpt", tmp_path / "results.json"
  common = SMALL_JOB[:-3] + ["--steps_per_epoch=12", "--minibatch=8",
                             "--compensation=gap_aware",
                             f"--checkpoint_dir={checkpoints}",
                             f"--results={results}"]
  out = finished(common + ["--epochs=1"])
  assert "lr_policy=divide_by_n, compensation=gap_aware, 12 gradients" in out
  out = finished(common + ["--epochs=2"])
  assert "resumed from" in out
  saved = json.loads(results.read_text())
  assert saved["gradients"] == 24
  assert saved["config"]["compensation"] == "gap_aware"
  assert saved["config"]["compensation_strength"] is None
  other = launch([f if not f.startswith("--compensation=") else
                  "--compensation=delay" for f in common] + ["--epochs=3"])
  out, _ = other.communicate(timeout=300)
  assert other.returncode != 0
  assert "compensation 'gap_aware' there, 'delay' now" in out
