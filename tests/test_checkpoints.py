"""A --checkpoint_dir that the run cannot resume from is refused, unchanged."""

import hashlib
import json
import os
import types

import pytest

from launch import checkpoints
from tests.processes import launch

JOB = ["--model=mlp", "--dataset=synthetic", "--learners=2", "--ps_tasks=1",
       "--protocol=async", "--epochs=1", "--steps_per_epoch=10",
       "--minibatch=8"]


def config(directory, **overrides):
  values = dict(model="mlp", dataset="synthetic", protocol="async",
                num_learners=2, num_ps=1, lr_policy="divide_by_n",
                steps_per_epoch=10, minibatch=8, compensation="none",
                checkpoint_dir=str(directory))
  values.update(overrides)
  return types.SimpleNamespace(**values)


def fingerprint(directory):
  """{file: sha256} of everything in a directory."""
  return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest()
          for name in sorted(os.listdir(directory))}


def fake_checkpoint(directory, files=(".index", ".data-00000-of-00002",
                                     ".data-00001-of-00002")):
  directory.mkdir(exist_ok=True)
  (directory / "checkpoint").write_text(
      'model_checkpoint_path: "ckpt-1"\nall_model_checkpoint_paths: "ckpt-1"\n')
  for suffix in files:
    (directory / f"ckpt-1{suffix}").write_bytes(b"x")


def test_a_fresh_or_matching_directory_is_accepted(tmp_path):
  checkpoints.check_resumable(config(tmp_path / "absent"))
  fake_checkpoint(tmp_path)
  checkpoints.record_run(config(tmp_path))
  checkpoints.check_resumable(config(tmp_path))


@pytest.mark.parametrize("change,fragment", [
    (dict(protocol="2-softsync"), "protocol 'async' there, '2-softsync' now"),
    (dict(model="small_cnn"), "model 'mlp' there, 'small_cnn' now"),
    (dict(num_learners=3), "num_learners 2 there, 3 now"),
    (dict(num_ps=2), "num_ps 1 there, 2 now"),
    (dict(lr_policy="none"), "lr_policy 'divide_by_n' there, 'none' now"),
    # A checkpoint's number counts steps: epochs of another length (or of
    # another μ, which sets the default length) would misplace it.
    (dict(steps_per_epoch=20), "steps_per_epoch 10 there, 20 now"),
    (dict(minibatch=16), "minibatch 8 there, 16 now"),
    # The checkpoint holds the rule's state (or none of it).
    (dict(compensation="gap_aware"), "compensation 'none' there, "
     "'gap_aware' now"),
])
def test_a_different_run_is_refused(tmp_path, change, fragment):
  fake_checkpoint(tmp_path)
  checkpoints.record_run(config(tmp_path))
  with pytest.raises(ValueError) as error:
    checkpoints.check_resumable(config(tmp_path, **change))
  assert fragment in str(error.value) and "Nothing was changed" in str(
      error.value)


def test_a_run_file_from_before_compensation_means_none(tmp_path):
  # Written before the compensation flag existed: it had no rule.
  fake_checkpoint(tmp_path)
  checkpoints.record_run(config(tmp_path))
  run_file = tmp_path / checkpoints.RUN_FILE
  identity = json.loads(run_file.read_text())
  del identity["compensation"]
  run_file.write_text(json.dumps(identity))
  checkpoints.check_resumable(config(tmp_path))
  with pytest.raises(ValueError, match="compensation 'none' there, 'delay' "
                     "now"):
    checkpoints.check_resumable(config(tmp_path, compensation="delay"))


def test_missing_or_corrupt_files_are_refused(tmp_path):
  fake_checkpoint(tmp_path, files=(".data-00000-of-00002",))
  checkpoints.record_run(config(tmp_path))
  with pytest.raises(ValueError, match="lacks ckpt-1.index, "
                     "ckpt-1.data-00001-of-00002"):
    checkpoints.check_resumable(config(tmp_path))
  fake_checkpoint(tmp_path)
  (tmp_path / checkpoints.RUN_FILE).write_text("{oops")
  with pytest.raises(ValueError, match="is corrupt \\(not JSON\\)"):
    checkpoints.check_resumable(config(tmp_path))
  (tmp_path / checkpoints.RUN_FILE).unlink()
  with pytest.raises(ValueError, match="not written by launch/train.py"):
    checkpoints.check_resumable(config(tmp_path))
  (tmp_path / "checkpoint").write_text("garbage")
  with pytest.raises(ValueError, match="no model_checkpoint_path"):
    checkpoints.check_resumable(config(tmp_path))


def test_the_launcher_refuses_before_any_server_and_changes_nothing(tmp_path):
  directory = tmp_path / "ckpt"
  first = launch(JOB + [f"--checkpoint_dir={directory}"])
  out, _ = first.communicate(timeout=300)
  assert first.returncode == 0, out
  saved = fingerprint(directory)
  assert json.loads((directory / checkpoints.RUN_FILE).read_text())[
      "protocol"] == "async"

  # A different protocol: refused by the launcher, no task started.
  other = launch([a.replace("async", "hardsync") for a in JOB] +
                 [f"--checkpoint_dir={directory}"])
  out, _ = other.communicate(timeout=60)
  assert other.returncode == 2, out
  assert "belongs to a different run (protocol 'async' there, 'hardsync' " \
      "now)" in out
  assert "[ps:0]" not in out and "[chief:0]" not in out
  assert fingerprint(directory) == saved

  # Corrupt data: the chief refuses to restore, before any training step.
  for data in directory.glob("ckpt-*.data-*"):
    data.write_bytes(data.read_bytes()[:100])
  saved = fingerprint(directory)
  corrupt = launch(JOB + [f"--checkpoint_dir={directory}", "--epochs=2"])
  out, _ = corrupt.communicate(timeout=300)
  assert corrupt.returncode == 2, out
  assert "error: cannot resume from" in out and "Nothing was changed" in out
  assert "epoch 2/2" not in out
  assert fingerprint(directory) == saved


@pytest.mark.parametrize("directory", ["/proc/nope", "/dev/null/ckpt"])
def test_a_directory_that_cannot_be_written_is_refused_before_any_server(
    directory):
  job = launch(JOB + [f"--checkpoint_dir={directory}"])
  out, _ = job.communicate(timeout=60)
  assert job.returncode == 2, out
  assert out.startswith(f"error: --checkpoint_dir={directory} cannot be "
                        "created or written ("), out
  assert "give a folder this task can write" in out
  assert "[ps:0]" not in out and "[chief:0]" not in out
  assert "Traceback" not in out and "resume" not in out


def test_a_writable_directory_is_created_by_the_check(tmp_path):
  directory = tmp_path / "new" / "ckpt"
  checkpoints.check_resumable(config(directory))
  assert directory.is_dir() and not os.listdir(directory)
