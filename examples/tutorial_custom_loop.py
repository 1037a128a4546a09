r"""TensorFlow's tutorial "Parameter server training with
ParameterServerStrategy", part 2 (a custom training loop), on rudra_tf.

The tutorial's steps, as it writes them, with tf_keras and its legacy
RMSprop: StringLookup preprocessing made under the strategy's scope and
applied in the dataset function, a model with a 16384-wide embedding that
the MinSizePartitioner splits over the two ps tasks, a training step that
calls `strategy.run` and `strategy.reduce`, per-worker datasets made by
the ClusterCoordinator, epochs of scheduled steps joined at their ends, a
fetched loss, evaluation on the coordinator and distributed evaluation on
the workers, and a CheckpointManager. The one line that differs between
the two strategies is the strategy's:

  python -m examples.tutorial_custom_loop --strategy=rudra
  python -m examples.tutorial_custom_loop --strategy=stock
"""

import os
import random
import tempfile

from absl import app
from absl import flags

from examples.strategies import tutorial_strategy

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FLAGS = flags.FLAGS
flags.DEFINE_integer("seed", 1, "Seeds the toy examples.")

FEATURE_VOCAB = ["avenger", "ironman", "batman", "hulk", "spiderman",
                 "kingkong", "wonder_woman"]
LABEL_VOCAB = ["yes", "no"]


def feature_and_label_gen(num_examples=200):
  """Toy examples: three distinct heroes; "yes" when one is "avenger"."""
  examples = {"features": [], "label": []}
  for _ in range(num_examples):
    features = random.sample(FEATURE_VOCAB, 3)
    examples["features"].append(features)
    examples["label"].append(["yes"] if "avenger" in features else ["no"])
  return examples


def main(argv):
  del argv
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  random.seed(FLAGS.seed)

  # The strategy line (examples/strategies.py), in the tutorial's cluster
  # (kept: its servers live as long as `cluster` does).
  cluster, strategy = tutorial_strategy(FLAGS.strategy)

  # Preprocessing layers under the scope, applied in the dataset function.
  with strategy.scope():
    feature_lookup_layer = tf_keras.layers.StringLookup(
        vocabulary=FEATURE_VOCAB, mask_token=None)
    label_lookup_layer = tf_keras.layers.StringLookup(
        vocabulary=LABEL_VOCAB, num_oov_indices=0, mask_token=None)
    raw_feature_input = tf_keras.layers.Input(shape=(3,), dtype=tf.string,
                                              name="feature")
    feature_preprocess_stage = tf_keras.Model(
        {"features": raw_feature_input},
        feature_lookup_layer(raw_feature_input))
    raw_label_input = tf_keras.layers.Input(shape=(1,), dtype=tf.string,
                                            name="label")
    label_preprocess_stage = tf_keras.Model(
        {"label": raw_label_input}, label_lookup_layer(raw_label_input))

  examples = feature_and_label_gen()

  def preprocess(x):
    return ({"features": feature_preprocess_stage(x["features"])},
            label_preprocess_stage(x["label"]))

  def dataset_fn(_):
    raw_dataset = tf.data.Dataset.from_tensor_slices(examples)
    return raw_dataset.map(preprocess).shuffle(200).batch(32).repeat()

  # The model and the rest, all under the scope.
  with strategy.scope():
    model_input = tf_keras.layers.Input(shape=(3,), dtype=tf.int64,
                                        name="model_input")
    emb_layer = tf_keras.layers.Embedding(
        input_dim=len(feature_lookup_layer.get_vocabulary()),
        output_dim=16384)
    emb_output = tf.reduce_mean(emb_layer(model_input), axis=1)
    dense_output = tf_keras.layers.Dense(units=1,
                                         activation="sigmoid")(emb_output)
    model = tf_keras.Model({"features": model_input}, dense_output)
    optimizer = tf_keras.optimizers.legacy.RMSprop(learning_rate=0.1)
    accuracy = tf_keras.metrics.Accuracy()

  # The partitioner split the embedding in two, one part per ps task.
  assert len(emb_layer.weights) == 2
  assert emb_layer.weights[0].shape == (4, 16384)
  assert emb_layer.weights[1].shape == (4, 16384)
  assert emb_layer.weights[0].device == "/job:ps/replica:0/task:0/device:CPU:0"
  assert emb_layer.weights[1].device == "/job:ps/replica:0/task:1/device:CPU:0"

  @tf.function
  def step_fn(iterator):

    def replica_fn(batch_data, labels):
      with tf.GradientTape() as tape:
        pred = model(batch_data, training=True)
        per_example_loss = tf_keras.losses.BinaryCrossentropy(
            reduction=tf_keras.losses.Reduction.NONE)(labels, pred)
        loss = tf.nn.compute_average_loss(per_example_loss)
        gradients = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(gradients, model.trainable_variables))
      actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
      accuracy.update_state(labels, actual_pred)
      return loss

    batch_data, labels = next(iterator)
    losses = strategy.run(replica_fn, args=(batch_data, labels))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
      strategy)

  @tf.function
  def per_worker_dataset_fn():
    return strategy.distribute_datasets_from_function(dataset_fn)

  per_worker_dataset = coordinator.create_per_worker_dataset(
      per_worker_dataset_fn)
  per_worker_iterator = iter(per_worker_dataset)

  checkpoint_dir = tempfile.mkdtemp(prefix="tutorial_custom_loop_")
  checkpoint_manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(model=model, optimizer=optimizer), checkpoint_dir,
      max_to_keep=3)

  num_epochs = 4
  steps_per_epoch = 5
  for i in range(num_epochs):
    accuracy.reset_states()
    for _ in range(steps_per_epoch):
      coordinator.schedule(step_fn, args=(per_worker_iterator,))
    # Wait at epoch boundaries.
    coordinator.join()
    checkpoint_manager.save()
    print(f"Finished epoch {i}, accuracy is {accuracy.result().numpy():f}.")

  loss = coordinator.schedule(step_fn, args=(per_worker_iterator,))
  print(f"Final loss is {loss.fetch():f}")

  # Evaluation on the coordinator, with the trained (distributed) model.
  eval_dataset = tf.data.Dataset.from_tensor_slices(
      feature_and_label_gen(num_examples=16)).map(preprocess).batch(8)
  eval_accuracy = tf_keras.metrics.Accuracy()
  for batch_data, labels in eval_dataset:
    pred = model(batch_data, training=False)
    actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
    eval_accuracy.update_state(labels, actual_pred)
  print(f"Evaluation accuracy: {eval_accuracy.result():f}")

  # Distributed evaluation on the workers.
  with strategy.scope():
    distributed_eval_accuracy = tf_keras.metrics.Accuracy()

  @tf.function
  def eval_step(iterator):

    def replica_fn(batch_data, labels):
      pred = model(batch_data, training=False)
      actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
      distributed_eval_accuracy.update_state(labels, actual_pred)

    batch_data, labels = next(iterator)
    strategy.run(replica_fn, args=(batch_data, labels))

  def eval_dataset_fn():
    return tf.data.Dataset.from_tensor_slices(
        feature_and_label_gen(num_examples=16)).map(preprocess).shuffle(
            16).repeat().batch(8)

  per_worker_eval_dataset = coordinator.create_per_worker_dataset(
      eval_dataset_fn)
  per_worker_eval_iterator = iter(per_worker_eval_dataset)
  eval_steps_per_epoch = 2
  for _ in range(eval_steps_per_epoch):
    coordinator.schedule(eval_step, args=(per_worker_eval_iterator,))
  coordinator.join()
  print("Distributed evaluation accuracy: "
        f"{distributed_eval_accuracy.result():f}")

  # What the CheckpointManager kept restores into the model.
  restored = tf.train.Checkpoint(model=model, optimizer=optimizer)
  restored.restore(checkpoint_manager.latest_checkpoint
                   ).assert_existing_objects_matched()
  print(f"Checkpoints: {len(checkpoint_manager.checkpoints)} kept, latest "
        f"{os.path.basename(checkpoint_manager.latest_checkpoint)}")
  if FLAGS.strategy == "rudra":
    print("tutorial_custom_loop (rudra): "
          f"{strategy.staleness_report().summary()}")


if __name__ == "__main__":
  app.run(main)
