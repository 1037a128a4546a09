"""Embedding tables under RudraStrategy: row gradients.

Every cluster runs in a fresh process (tests/support.py); the scenarios
each test runs are beside it, below the tests.
"""

import numpy as np
import pytest

from tests import cluster_fixtures
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
    ("sgd_momentum", False, 5),
    # A legacy optimizer's sparse rule (_resource_apply_sparse_duplicate_
    # indices), with clipnorm, and on a partitioned table as in TF's PS
    # tutorial (without clipnorm there: it clips each part of a partitioned
    # table by its own norm, under any parameter-server strategy, where the
    # unpartitioned reference clips the whole table).
    ("legacy_rmsprop_clipnorm", False, 1),
    ("legacy_rmsprop", True, 1)])
def test_one_learner_async_embedding_model_equals_plain_keras(
    optimizer, partitioned, steps_per_execution):
  result = run_in_fresh_process(
      embedding_matches_plain, optimizer=optimizer,
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
      table_updates, num_learners=num_learners,
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
  sent = run_in_fresh_process(embedding_step_transfers)
  # The forward pass reads the table's rows from the pull, not live.
  assert sent.pop("variable_row_reads") == 0
  table_values = 1000 * WIDTH

  def sizes(direction):
    return [np.prod(shape) if shape and None not in shape else None
            for shape in sent[direction].values()]
  assert all(s is None or s < table_values for s in sizes("to_ps")), sent
  assert [None, WIDTH] in sent["to_ps"].values(), sent
  # The pull: one packed transfer, the table and the dense layer's weights.
  assert sizes("to_learner") == [table_values + 12 * 2 + 2], sent


# ------------------------------------------------------------- scenarios

ROWS, WIDTH, IDS = 50, 4, 3


def _embedding_model(rows=ROWS, width=WIDTH, seed=0):
  """ids -> Embedding -> Flatten -> Dense softmax, numpy-seeded weights."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  model = tf_keras.Sequential([
      tf_keras.layers.Input((IDS,), dtype="int64"),
      tf_keras.layers.Embedding(rows, width),
      tf_keras.layers.Flatten(),
      tf_keras.layers.Dense(2, activation="softmax")])
  rng = np.random.default_rng(seed)
  model.set_weights([rng.normal(scale=0.5, size=w.shape).astype("float32")
                     for w in model.get_weights()])
  return model


def _ids_data(n=64, rows=ROWS, seed=1):
  """Batches that repeat ids (a row looked up twice in one batch)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  x = rng.integers(0, rows, size=(n, IDS)).astype("int64")
  x[:, 1] = x[:, 0] % 7  # rows 0-6 recur in every batch
  return x, (x[:, 0] % 2).astype("int64")


def embedding_matches_plain(optimizer, partitioned=False, steps=20,
                            steps_per_execution=1):
  """One learner, async, "none": an embedding model against plain tf_keras.

  `partitioned`: two ps tasks, every variable split in two parts.
  `steps_per_execution`: steps per scheduled closure (a traced loop).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  kwargs = {}
  if partitioned:
    kwargs["variable_partitioner"] = (
        tf.distribute.experimental.partitioners.FixedShardsPartitioner(2))
  _, strategy = cluster_fixtures.connect_cluster(2 if partitioned else 1, 1, "async",
                                   **kwargs)
  x, y = _ids_data()
  with strategy.scope():
    model = _embedding_model()
    model.compile(optimizer=rudra_tf.StalenessAwareOptimizer(
        cluster_fixtures.make_optimizer(optimizer)),
                  loss="sparse_categorical_crossentropy",
                  steps_per_execution=steps_per_execution)
  model.fit(cluster_fixtures.repeated_batches(x, y, 8), epochs=1, steps_per_epoch=steps,
            verbose=0)
  reference = _embedding_model()
  reference.compile(optimizer=cluster_fixtures.make_optimizer(optimizer),
                    loss="sparse_categorical_crossentropy")
  reference.fit(cluster_fixtures.repeated_batches(x, y, 8), epochs=1, steps_per_epoch=steps,
                verbose=0)
  table = model.layers[0].embeddings
  table_parts = table.variables if partitioned else [table]
  # Whole variables (a partitioned one's parts concatenated).
  weights = [tf.convert_to_tensor(v).numpy() for v in
             (table, model.layers[2].kernel, model.layers[2].bias)]
  return {"rudra": weights, "plain": reference.get_weights(),
          "initial": _embedding_model().get_weights(),
          "table_devices": [v.device for v in table_parts],
          "report": cluster_fixtures.report_as_dict(strategy)}


def table_updates(num_learners, protocol, num_ps=1, steps=12,
                  learning_rate=0.1, consistent_pulls=True):
  """Loss = mean over the batch of the sum of the looked-up rows.

  Every batch is the same two id lists, so every gradient is the same row
  gradient: row r gets (times r appears in the batch) / 2. Each update thus
  moves the table by -lr * that gradient, whatever the protocol (the mean of
  c equal gradients is the gradient): after a shard's T updates its rows
  are exactly initial - T * lr * gradient. Rows never looked up stay put.
  With two ps tasks the 6-row table is partitioned into rows 0-2 and 3-5.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  kwargs = {"consistent_pulls": consistent_pulls}
  if num_ps > 1:
    kwargs["variable_partitioner"] = (
        tf.distribute.experimental.partitioners.FixedShardsPartitioner(
            num_ps))
  _, strategy = cluster_fixtures.connect_cluster(num_ps, num_learners, protocol, **kwargs)
  initial = np.arange(12, dtype=np.float32).reshape(6, 2)
  with strategy.scope():
    model = tf_keras.Sequential([
        tf_keras.layers.Input((3,), dtype="int64"),
        tf_keras.layers.Embedding(
            6, 2, embeddings_initializer=tf_keras.initializers.Constant(
                initial)),
        tf_keras.layers.Lambda(lambda rows: tf.reduce_sum(rows, [1, 2]))])
    model.compile(optimizer=rudra_tf.StalenessAwareOptimizer(
        tf_keras.optimizers.SGD(learning_rate)),
                  loss=lambda y_true, y_pred: tf.reduce_mean(y_pred))
  x = np.array([[0, 1, 1], [1, 4, 0]], np.int64)
  model.fit(cluster_fixtures.repeated_batches(x, np.zeros(2, np.float32), 2),
            epochs=1, steps_per_epoch=steps, verbose=0)
  table = tf.convert_to_tensor(model.layers[0].embeddings).numpy()
  return {"table": table, "initial": initial,
          "report": cluster_fixtures.report_as_dict(strategy)}


def embedding_step_transfers(rows=1000):
  """Static shapes of what one traced step sends each way (embedding model).

  As `cluster_fixtures.step_transfers`: each distinct non-resource tensor whose
  producer and consumer are on different sides of the learner/ps line.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  _, strategy = cluster_fixtures.connect_cluster(1, 1, "async")
  with strategy.scope():
    model = _embedding_model(rows=rows)
    optimizer = rudra_tf.StalenessAwareOptimizer(
        tf_keras.optimizers.SGD(0.1, momentum=0.9))

  def step(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(
          tf_keras.losses.sparse_categorical_crossentropy(y, model(x)))
    variables = model.trainable_variables
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss

  @tf.function
  def train_step(x, y):
    return strategy.run(step, args=(x, y))

  graph = train_step.get_concrete_function(
      tf.TensorSpec([4, IDS], tf.int64), tf.TensorSpec([4], tf.int64)).graph

  def on_ps(op):
    return "/job:ps" in op.device

  sent = {"to_ps": {}, "to_learner": {}}
  for op in graph.get_operations():
    for tensor in op.inputs:
      if tensor.dtype == tf.resource or on_ps(tensor.op) == on_ps(op):
        continue
      sent["to_ps" if on_ps(op) else "to_learner"][tensor.name] = (
          tensor.shape.as_list() if tensor.shape.rank is not None else None)
  # A variable's own row read (TensorFlow's lookup of a live variable); the
  # update (SGD with momentum) reads no rows.
  sent["variable_row_reads"] = sum(
      op.type == "ResourceGather" for op in graph.get_operations())
  return sent
