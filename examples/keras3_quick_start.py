"""README's Keras 3 quick start, as a file: a Keras 3 model trained with
model.fit under RudraStrategy (2-softsync, 4 learners), then evaluated and
saved; tests/test_examples.py runs it.

  python -m examples.keras3_quick_start
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main():
  # --- README: Keras 3 quick start ---
  import keras
  import numpy as np
  import rudra_tf

  cluster = rudra_tf.LocalCluster(num_ps=1, num_learners=4)
  strategy = rudra_tf.RudraStrategy(cluster.resolver, protocol="2-softsync")
  with strategy.scope():
    model = keras.Sequential([
        keras.Input((20,)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(2)])
    model.compile(
        optimizer=rudra_tf.StalenessAwareOptimizer(
            keras.optimizers.SGD(0.05, momentum=0.9), lr_policy="divide_by_n"),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"])

  x = np.random.default_rng(0).normal(size=(1000, 20)).astype("float32")
  y = (x.sum(axis=1) > 0).astype("int64")
  # Each learner reads its quarter of the rows, 32 at a time; an epoch is
  # ceil(1000 / 32) = 32 learner steps, one gradient each.
  model.fit(x, y, batch_size=32, epochs=3,
            callbacks=[rudra_tf.StalenessLogger()])
  loss, accuracy = model.evaluate(x, y, verbose=0)   # on the chief, every row
  print(f"evaluate: loss {loss:.3f}, accuracy {accuracy:.3f}")
  print(strategy.staleness_report().summary())
  # --- end of the quick start ---


if __name__ == "__main__":
  main()
