"""Embedding tables under RudraStrategy: row gradients.

Every cluster runs in a fresh process (tests/support.py).
"""

import numpy as np
import pytest

from tests import embedding_scenarios
from tests.support import assert_invariants
from tests.support import run_in_fresh_process


# ------------------------------------------------------------------ oracle
@pytest.mark.parametrize("optimizer,partitioned,steps_per_execution", [
    # Adam's second moment tells a deduplicated row gradient from one that
    # repeats a row (the data repeat rows within every batch).
    ("adam", False, 1),
    # Adagrad's sparse rule reads its slot's rows (a lookup on the ps).
    ("adagrad", False, 1),
    ("sgd_momentum", True, 1),
    # Five steps per closure: the row pushes run inside a traced loop.
    ("sgd_momentum", False, 5)])
def test_one_learner_async_embedding_model_equals_plain_keras(
    optimizer, partitioned, steps_per_execution):
  result = run_in_fresh_process(
      embedding_scenarios.embedding_matches_plain, optimizer=optimizer,
      partitioned=partitioned, steps_per_execution=steps_per_execution)
  assert all(s["timestamp"] == 20 for s in result["report"]["shards"])
  for rudra, plain in zip(result["rudra"], result["plain"]):
    np.testing.assert_allclose(rudra, plain, rtol=1e-5, atol=1e-6)
  # Training moved the table's looked-up rows: not a vacuous comparison.
  assert not np.allclose(result["plain"][0][:7], result["initial"][0][:7],
                         atol=1e-3)
  if partitioned:
    assert len(set(result["table_devices"])) == 2, result["table_devices"]


# ---------------------------------------------------- hand-computed updates
# Batch [[0, 1, 1], [1, 4, 0]], loss = mean over the 2 examples of the sum of
# the looked-up rows: row 0 appears twice, row 1 three times, row 4 once, so
# the gradient of every row entry is count / 2: rows 0, 1, 4 -> 1.0, 1.5,
# 0.5; rows 2, 3, 5 -> 0. Every update (mean of c equal gradients) moves the
# table by -0.1 * that, so a shard at timestamp T holds initial - 0.1 T g.
ROW_GRADIENT = np.array([1.0, 1.5, 0.0, 0.0, 0.5, 0.0])


@pytest.mark.parametrize("num_learners,protocol,num_ps,consistent", [
    (2, "hardsync", 1, True),
    (4, "2-softsync", 1, True),
    (2, "async", 2, True),
    # Unlocked pulls; async updates outside the lock.
    (2, "async", 1, False),
    (3, "hardsync", 2, True)])
def test_row_gradients_update_exactly_the_looked_up_rows(
    num_learners, protocol, num_ps, consistent):
  steps = 12
  result = run_in_fresh_process(
      embedding_scenarios.table_updates, num_learners=num_learners,
      protocol=protocol, num_ps=num_ps, steps=steps,
      consistent_pulls=consistent)
  report = result["report"]
  assert_invariants(report)
  shards = report["shards"]
  assert len(shards) == num_ps
  # Rows 0-2 live on the first shard, rows 3-5 on the second (or all on one).
  timestamps = np.repeat([s["timestamp"] for s in shards], 6 // num_ps)
  assert all(s["gradients"] == steps for s in shards)
  expected = result["initial"] - 0.1 * (timestamps * ROW_GRADIENT)[:, None]
  np.testing.assert_allclose(result["table"], expected, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(result["table"][[2, 3, 5]],
                                result["initial"][[2, 3, 5]])
  if protocol == "hardsync":
    assert report["max"] == 0


# ----------------------------------------------------------------- transfer
def test_a_step_pushes_table_rows_not_the_table():
  # A 1000 x 4 table (4,000 values), a batch of 4 x 3 ids. The push carries
  # the looked-up rows (a [None, 4] tensor) and their indices, never a
  # table-sized gradient; the lookup gathers from the pulled snapshot on the
  # learner (TensorFlow would place it on the ps and ship the snapshot back).
  sent = run_in_fresh_process(embedding_scenarios.embedding_step_transfers)
  # The forward pass reads the table's rows from the pull, not live.
  assert sent.pop("variable_row_reads") == 0
  table_values = 1000 * embedding_scenarios.WIDTH

  def sizes(direction):
    return [np.prod(shape) if shape and None not in shape else None
            for shape in sent[direction].values()]
  assert all(s is None or s < table_values for s in sizes("to_ps")), sent
  assert [None, embedding_scenarios.WIDTH] in sent["to_ps"].values(), sent
  # The pull: one packed transfer, the table and the dense layer's weights.
  assert sizes("to_learner") == [table_values + 12 * 2 + 2], sent
