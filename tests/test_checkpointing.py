"""Checkpoints inside epochs and fit resumed mid-epoch (rudra_tf/checkpointing.py)."""

import os

import pytest

from tests.support import assert_invariants
from tests.support import run_in_fresh_process

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


# -------------------------------------------------------------------- pure
def test_fit_segments_train_exactly_the_steps_left():
  from rudra_tf import checkpointing  # pylint: disable=g-import-not-at-top
  # 2 epochs of 500: from scratch, one fit of both epochs.
  assert checkpointing.fit_segments(0, 2, 500) == [
      dict(initial_epoch=0, epochs=2, steps_per_epoch=500)]
  # After 700 steps (epoch 2, step 200): the 300 left of epoch 2 only.
  assert checkpointing.fit_segments(700, 2, 500) == [
      dict(initial_epoch=1, epochs=2, steps_per_epoch=300)]
  # After 250 of 3 epochs: the rest of epoch 1, then epochs 2 and 3.
  assert checkpointing.fit_segments(250, 3, 500) == [
      dict(initial_epoch=0, epochs=1, steps_per_epoch=250),
      dict(initial_epoch=1, epochs=3, steps_per_epoch=500)]
  # At an epoch's end, whole epochs; when done, nothing.
  assert checkpointing.fit_segments(500, 2, 500) == [
      dict(initial_epoch=1, epochs=2, steps_per_epoch=500)]
  assert checkpointing.fit_segments(1000, 2, 500) == []


def test_a_checkpoints_number_is_its_steps():
  from rudra_tf import checkpointing  # pylint: disable=g-import-not-at-top
  assert checkpointing.steps_done(None) == 0
  assert checkpointing.steps_done("/runs/c/ckpt-1700") == 1700
  with pytest.raises(ValueError, match="has no step number"):
    checkpointing.steps_done("/runs/c/model")


def test_bad_arguments_are_refused():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from rudra_tf import checkpointing  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="needs a tf.train.CheckpointManager"):
    checkpointing.PeriodicCheckpoint("ckpts", every_steps=10)
  manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(), "/tmp/rudra_unused", max_to_keep=1)
  for name, value in (("every_steps", 0), ("every_steps", 2.5),
                      ("every_secs", -1), ("every_steps", True)):
    with pytest.raises(ValueError, match=f"{name} must be None or a "
                       f"positive number, got {value!r}"):
      checkpointing.PeriodicCheckpoint(manager, **{name: value})


# -------------------------------------------------------------- on a cluster
def _saves_and_resumes(directory, protocol, every_steps=None, every_secs=None,
                       epochs=2, steps=20, resume_from=None):
  """Trains with PeriodicCheckpoint; then, for each checkpoint, restores it
  and reads the shard's counters; then resumes from `resume_from`."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  from rudra_tf import checkpointing  # pylint: disable=g-import-not-at-top
  from tests import cluster_fixtures  # pylint: disable=g-import-not-at-top
  _, strategy = cluster_fixtures.connect_cluster(1, 2, protocol)
  model = cluster_fixtures.compiled_mlp(strategy, "sgd_momentum", "none")
  x, y = cluster_fixtures.synthetic_data()
  dataset = cluster_fixtures.repeated_batches(x, y, 8)
  checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
  manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=100)
  saved_lines = []
  callback = rudra_tf.PeriodicCheckpoint(
      manager, every_steps=every_steps, every_secs=every_secs,
      out=saved_lines.append)
  model.fit(dataset, epochs=epochs, steps_per_epoch=steps, verbose=0,
            callbacks=[callback])
  numbers = [checkpointing.steps_done(p) for p in manager.checkpoints]
  gradients_at = {}
  for path in manager.checkpoints:
    checkpoint.restore(path).assert_existing_objects_matched()
    gradients_at[checkpointing.steps_done(path)] = (
        strategy.staleness_report().gradients)
  resumed = None
  if resume_from is not None:
    path = os.path.join(directory, f"ckpt-{resume_from}")
    checkpoint.restore(path).assert_existing_objects_matched()
    before = cluster_fixtures.report_as_dict(strategy)
    histories = checkpointing.fit_from(
        model, dataset, steps_done=checkpointing.steps_done(path),
        epochs=epochs, steps_per_epoch=steps, verbose=0)
    resumed = {"before": before, "after": cluster_fixtures.report_as_dict(strategy),
               "fits": [(h.epoch, h.params["steps"]) for h in histories],
               "finite": bool(all(np.isfinite(h.history["loss"]).all()
                                  for h in histories))}
  return {"numbers": numbers, "gradients_at": gradients_at,
          "lines": saved_lines, "resumed": resumed}


@pytest.mark.parametrize("protocol", ["hardsync", "1-softsync", "async"])
def test_each_checkpoint_holds_exactly_its_steps_and_resumes_mid_epoch(
    tmp_path, protocol):
  # 2 epochs of 20 steps, a save every 7 steps and at each epoch's end:
  # 7, 14, 20 | 21, 28, 35, 40. Restored, each holds exactly its number of
  # gradients (the save drained every scheduled step first).
  result = run_in_fresh_process(
      _saves_and_resumes, directory=str(tmp_path), protocol=protocol,
      every_steps=7, resume_from=28)
  assert result["numbers"] == [7, 14, 20, 21, 28, 35, 40]
  assert result["gradients_at"] == {n: n for n in result["numbers"]}
  assert result["lines"][0] == f"saved {tmp_path}/ckpt-7 (7 steps trained)"
  # From ckpt-28 (epoch 2, step 8): one fit of the 12 steps left, counted
  # as epoch 2; the run ends at exactly 40 gradients, clock continuous.
  resumed = result["resumed"]
  assert resumed["before"]["gradients"] == 28
  assert resumed["fits"] == [([1], 12)]
  assert resumed["after"]["gradients"] == 40 and resumed["finite"]
  assert_invariants(resumed["after"])
  assert resumed["after"]["duplicates"] == 0


def test_timed_checkpoints_are_exact_too(tmp_path):
  # every_secs tiny: every scheduled step is due, so the chief waits for
  # the learners (at most 4 closures per learner ahead) and saves after
  # each step: 1, 2, ..., 10, each holding exactly its gradients.
  result = run_in_fresh_process(
      _saves_and_resumes, directory=str(tmp_path), protocol="async",
      every_secs=1e-9, epochs=1, steps=10)
  assert result["numbers"] == list(range(1, 11))
  assert result["gradients_at"] == {n: n for n in range(1, 11)}
