r"""TensorFlow's tutorial "Parameter server training with
ParameterServerStrategy", part 1 (training with Model.fit), on rudra_tf.

The tutorial's steps, as it writes them, with tf_keras (the Keras its
ParameterServerStrategy fit runs with in TF 2.21) and its legacy SGD: a
dataset function wrapped in a DatasetCreator, a Sequential model with no
Input (built at its first step), compiled with steps_per_execution=10,
and fit with TensorBoard, ModelCheckpoint and BackupAndRestore. The one
line that differs between the two strategies is the strategy's:

  python -m examples.tutorial_fit --strategy=rudra   # RudraStrategy, async
  python -m examples.tutorial_fit --strategy=stock   # ParameterServerStrategy

The cluster is the tutorial's in-process one (3 workers, 2 ps tasks),
started by rudra_tf.LocalCluster instead of the tutorial's own
create_in_process_cluster (the same tf.distribute.Servers).
"""

import os
import tempfile

from absl import app
from absl import flags

from examples.strategies import tutorial_strategy

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FLAGS = flags.FLAGS
flags.DEFINE_string("working_dir", None,
                    "For the callbacks' files (default: a temporary dir).")



def main(argv):
  del argv
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top

  # The strategy line (examples/strategies.py), in the tutorial's cluster
  # (kept: its servers live as long as `cluster` does).
  cluster, strategy = tutorial_strategy(FLAGS.strategy)

  # Input: a function of the InputContext, each worker reading its shard.
  def dataset_fn(input_context):
    global_batch_size = 64
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    x = tf.random.uniform((10, 10))
    y = tf.random.uniform((10,))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10).repeat()
    dataset = dataset.shard(input_context.num_input_pipelines,
                            input_context.input_pipeline_id)
    return dataset.batch(batch_size).prefetch(2)

  dc = tf_keras.utils.experimental.DatasetCreator(dataset_fn)

  with strategy.scope():
    model = tf_keras.models.Sequential([tf_keras.layers.Dense(10)])
    model.compile(tf_keras.optimizers.legacy.SGD(), loss="mse",
                  steps_per_execution=10)

  working_dir = FLAGS.working_dir or tempfile.mkdtemp(prefix="tutorial_fit_")
  callbacks = [
      tf_keras.callbacks.TensorBoard(log_dir=os.path.join(working_dir, "log")),
      tf_keras.callbacks.ModelCheckpoint(
          filepath=os.path.join(working_dir, "ckpt")),
      tf_keras.callbacks.BackupAndRestore(
          backup_dir=os.path.join(working_dir, "backup")),
  ]
  history = model.fit(dc, epochs=5, steps_per_epoch=20, callbacks=callbacks)

  losses = ", ".join(f"{loss:.4f}" for loss in history.history["loss"])
  print(f"tutorial_fit ({FLAGS.strategy}): 5 epochs of 20 steps, "
        f"loss by epoch {losses}; optimizer iterations "
        f"{int(model.optimizer.iterations.numpy())}")
  if FLAGS.strategy == "rudra":
    print(f"tutorial_fit (rudra): {strategy.staleness_report().summary()}")


if __name__ == "__main__":
  app.run(main)
