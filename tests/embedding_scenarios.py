"""Cluster scenarios with embedding tables (row gradients).

Each runs in its own process (`support.run_in_fresh_process`) and returns
plain data for tests/test_embeddings.py.
"""

from tests import scenarios  # (sets TF_CPP_MIN_LOG_LEVEL for the children)

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
  _, strategy = scenarios._connect(2 if partitioned else 1, 1, "async",  # pylint: disable=protected-access
                                   **kwargs)
  x, y = _ids_data()
  with strategy.scope():
    model = _embedding_model()
    model.compile(optimizer=rudra_tf.StalenessAwareOptimizer(
        scenarios._make_optimizer(optimizer)),  # pylint: disable=protected-access
                  loss="sparse_categorical_crossentropy",
                  steps_per_execution=steps_per_execution)
  model.fit(scenarios._dataset(x, y, 8), epochs=1, steps_per_epoch=steps,  # pylint: disable=protected-access
            verbose=0)
  reference = _embedding_model()
  reference.compile(optimizer=scenarios._make_optimizer(optimizer),  # pylint: disable=protected-access
                    loss="sparse_categorical_crossentropy")
  reference.fit(scenarios._dataset(x, y, 8), epochs=1, steps_per_epoch=steps,  # pylint: disable=protected-access
                verbose=0)
  table = model.layers[0].embeddings
  table_parts = table.variables if partitioned else [table]
  # Whole variables (a partitioned one's parts concatenated).
  weights = [tf.convert_to_tensor(v).numpy() for v in
             (table, model.layers[2].kernel, model.layers[2].bias)]
  return {"rudra": weights, "plain": reference.get_weights(),
          "initial": _embedding_model().get_weights(),
          "table_devices": [v.device for v in table_parts],
          "report": scenarios._report(strategy)}  # pylint: disable=protected-access


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
  _, strategy = scenarios._connect(num_ps, num_learners, protocol, **kwargs)  # pylint: disable=protected-access
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
  model.fit(scenarios._dataset(x, np.zeros(2, np.float32), 2),  # pylint: disable=protected-access
            epochs=1, steps_per_epoch=steps, verbose=0)
  table = tf.convert_to_tensor(model.layers[0].embeddings).numpy()
  return {"table": table, "initial": initial,
          "report": scenarios._report(strategy)}  # pylint: disable=protected-access


def embedding_step_transfers(rows=1000):
  """Static shapes of what one traced step sends each way (embedding model).

  As `scenarios.step_transfers`: each distinct non-resource tensor whose
  producer and consumer are on different sides of the learner/ps line.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  _, strategy = scenarios._connect(1, 1, "async")  # pylint: disable=protected-access
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
