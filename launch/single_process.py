r"""Trains a model in one process, no servers: the λ = 1 reference.

  python -m launch.single_process --model=small_cnn --dataset=fashion_mnist \
      --epochs=10 --minibatch=64 --lr=0.02

Same models, data pipeline (per-pixel mean subtraction) and SGD with
momentum as launch/train.py, so the two compare directly.
"""

import json
import sys
import time

from absl import app
from absl import flags

flags.DEFINE_string("model", "small_cnn", "Model name (models.MODEL_NAMES).")
flags.DEFINE_string("dataset", "fashion_mnist", "Data set name.")
flags.DEFINE_string("data_dir", None, "Data folder.")
flags.DEFINE_integer("epochs", 10, "Epochs.")
flags.DEFINE_integer("minibatch", 64, "Examples per step.")
flags.DEFINE_float("lr", 0.02, "Learning rate (SGD with momentum).")
flags.DEFINE_float("momentum", 0.9, "SGD momentum.")
flags.DEFINE_integer("seed", 0, "Seed.")
flags.DEFINE_string("results", None, "Write the results JSON here.")
FLAGS = flags.FLAGS


def train(model_name, dataset_name, epochs, minibatch, lr, momentum=0.9,
          seed=0, data_dir=None, out=print):
  """Returns test accuracy, test loss, wall time and examples/s."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  import models  # pylint: disable=g-import-not-at-top
  from rudra_tf import datasets  # pylint: disable=g-import-not-at-top
  tf_keras.utils.set_random_seed(seed)
  data = datasets.load_dataset(dataset_name, data_dir)
  model = models.build_model(model_name, data.input_shape, data.num_classes)
  model.compile(optimizer=tf_keras.optimizers.SGD(lr, momentum=momentum),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
  steps = data.train_size // minibatch
  start = time.monotonic()
  for epoch in range(epochs):
    history = model.fit(data.learner_dataset(None, minibatch, seed=seed),
                        steps_per_epoch=steps, initial_epoch=epoch,
                        epochs=epoch + 1, verbose=0)
    out(f"epoch {epoch + 1}/{epochs}: loss {history.history['loss'][0]:.4f} "
        f"accuracy {history.history['accuracy'][0]:.4f}")
  wall_time_s = time.monotonic() - start
  test_loss, test_accuracy = model.evaluate(data.test_dataset(1000),
                                            verbose=0)
  return {"model": model_name, "dataset": dataset_name, "epochs": epochs,
          "minibatch": minibatch, "lr": lr, "test_accuracy": test_accuracy,
          "test_loss": test_loss, "wall_time_s": wall_time_s,
          "examples_per_s": steps * epochs * minibatch / wall_time_s}


def main(argv):
  del argv
  results = train(FLAGS.model, FLAGS.dataset, FLAGS.epochs, FLAGS.minibatch,
                  FLAGS.lr, FLAGS.momentum, FLAGS.seed, FLAGS.data_dir)
  print(f"test accuracy {results['test_accuracy']:.4f} (loss "
        f"{results['test_loss']:.4f}) | wall time "
        f"{results['wall_time_s']:.1f} s | "
        f"{results['examples_per_s']:.0f} examples/s")
  if FLAGS.results:
    with open(FLAGS.results, "w") as stream:
      json.dump(results, stream, indent=2)
  sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)
