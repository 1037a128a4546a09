r"""Embedding tables, side by side: how a step's cost grows with the table.

  python -m benchmarks.embeddings --rows=10000,100000,1000000 \
      --out_dir=runs/embeddings

A recommender-shaped model (ids -> Embedding(rows, width) -> mean ->
Dense(1)) trains on random ids with Adagrad on an in-process cluster of
1 ps task and --learners learners, one contender after the other in this
one run, each in a fresh process (TensorFlow allows one cluster per
process). Contenders:

* parameter_server: TensorFlow's stock ParameterServerStrategy (a lookup
  reads its rows from the ps; the gradient goes back as rows);
* rudra:dense_push: RudraStrategy pushing the table's gradient densely, as
  rudra_tf did before row gradients (the wrapper densifies it first);
* rudra: RudraStrategy as it is: whole-table pulls, row pushes.

All async (c = 1), consistent pulls. Adagrad, the usual optimizer for
embeddings, updates only the rows a gradient names; tf_keras's SGD keeps a
momentum slot even at momentum 0 and rewrites it and the whole table at
every update, under any strategy. Each contender trains one epoch of
--steps steps to warm up, then a timed one. Figures: steps/s (pushes per
second, all learners together), milliseconds per step, and the ratio of
steps/s to the stock ParameterServerStrategy's at the same table size.
Writes OUT_DIR/embeddings.json and OUT_DIR/embeddings.md.
"""

import concurrent.futures
import json
import multiprocessing
import os
import time

from absl import app
from absl import flags

CONTENDERS = ("parameter_server", "rudra:dense_push", "rudra")

FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_list("rows", ["10000", "100000", "1000000"],
                    "Table sizes (rows) to time.")
  flags.DEFINE_integer("width", 32, "Embedding width.")
  flags.DEFINE_integer("ids", 16, "Ids looked up per example.")
  flags.DEFINE_integer("minibatch", 64, "μ: examples per learner step.")
  flags.DEFINE_integer("learners", 2, "λ.")
  flags.DEFINE_integer("steps", 40, "Steps per epoch (one warm-up epoch, "
                       "one timed).")
  flags.DEFINE_list("contenders", list(CONTENDERS), "Contenders to time.")
  flags.DEFINE_string("out_dir", "runs/embeddings", "Where results go.")


def _model(tf_keras, rows, width, ids):
  return tf_keras.Sequential([
      tf_keras.layers.Input((ids,), dtype="int64"),
      tf_keras.layers.Embedding(rows, width),
      tf_keras.layers.GlobalAveragePooling1D(),
      tf_keras.layers.Dense(1, activation="sigmoid")])


def time_contender(contender, rows, width, ids, minibatch, learners, steps):
  """Trains one contender in this (fresh) process; returns its figures."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top

  class DensePushOptimizer(rudra_tf.StalenessAwareOptimizer):
    """Pushes every gradient densely (rudra_tf before row gradients)."""

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
      return super().apply_gradients(
          [(tf.convert_to_tensor(g), v) for g, v in grads_and_vars],
          *args, **kwargs)

  cluster = rudra_tf.LocalCluster(num_ps=1, num_learners=learners)
  if contender == "parameter_server":
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        cluster.resolver)
  else:
    strategy = rudra_tf.RudraStrategy(cluster.resolver, protocol="async")
  with strategy.scope():
    model = _model(tf_keras, rows, width, ids)
    adagrad = tf_keras.optimizers.Adagrad(0.05)
    optimizer = {"parameter_server": lambda: adagrad,
                 "rudra:dense_push": lambda: DensePushOptimizer(adagrad)}.get(
                     contender,
                     lambda: rudra_tf.StalenessAwareOptimizer(adagrad))()
    model.compile(optimizer=optimizer, loss="binary_crossentropy")
  rng = np.random.default_rng(0)
  x = rng.integers(0, rows, size=(50 * minibatch, ids)).astype("int64")
  y = rng.integers(0, 2, size=(50 * minibatch, 1)).astype("float32")
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
      minibatch)
  times = []
  timer = tf_keras.callbacks.LambdaCallback(
      on_epoch_begin=lambda epoch, logs: times.append(time.monotonic()),
      on_epoch_end=lambda epoch, logs: times.append(time.monotonic()))
  model.fit(dataset, epochs=2, steps_per_epoch=steps, verbose=0,
            callbacks=[timer])
  seconds = times[3] - times[2]
  return {"contender": contender, "rows": rows,
          "table_mb": rows * width * 4 / 2**20,
          "steps_per_s": steps / seconds, "ms_per_step": 1000 * seconds / steps}


def add_ratios(figures):
  stock = {f["rows"]: f["steps_per_s"] for f in figures
           if f["contender"] == "parameter_server"}
  for entry in figures:
    base = stock.get(entry["rows"])
    entry["vs_stock_ps"] = entry["steps_per_s"] / base if base else None


def markdown(figures, settings):
  lines = [f"λ = {settings['learners']}, μ = {settings['minibatch']}, "
           f"{settings['ids']} ids per example, width {settings['width']}, "
           "async, Adagrad, 1 ps task; in-process cluster.", "",
           "| rows | table MB | contender | steps/s | ms per step | "
           "vs stock PS |", "|---|---|---|---|---|---|"]
  for f in figures:
    ratio = "–" if f["vs_stock_ps"] is None else f"{f['vs_stock_ps']:.2f}"
    lines.append(f"| {f['rows']} | {f['table_mb']:.1f} | {f['contender']} | "
                 f"{f['steps_per_s']:.1f} | {f['ms_per_step']:.1f} | "
                 f"{ratio} |")
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  for name in FLAGS.contenders:
    if name not in CONTENDERS:
      raise app.UsageError(f"Unknown contender {name!r}; valid contenders "
                           f"are {', '.join(CONTENDERS)}.")
  rows = [int(r) for r in FLAGS.rows]
  settings = {name: getattr(FLAGS, name)
              for name in ("width", "ids", "minibatch", "learners", "steps")}
  figures = []
  for table_rows in rows:
    for contender in FLAGS.contenders:
      with concurrent.futures.ProcessPoolExecutor(
          max_workers=1,
          mp_context=multiprocessing.get_context("spawn")) as pool:
        entry = pool.submit(time_contender, contender, table_rows,
                            **settings).result()
      print(f"embeddings: {table_rows} rows, {contender}: "
            f"{entry['steps_per_s']:.1f} steps/s", flush=True)
      figures.append(entry)
  add_ratios(figures)
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  with open(os.path.join(FLAGS.out_dir, "embeddings.json"), "w") as stream:
    json.dump({"settings": settings, "figures": figures}, stream, indent=1)
  table = markdown(figures, settings)
  with open(os.path.join(FLAGS.out_dir, "embeddings.md"), "w") as stream:
    stream.write(table)
  print(table)


if __name__ == "__main__":
  define_flags()
  app.run(main)
