"""Keras 3 models in hand-written loops over ClusterCoordinator under
RudraStrategy, as TensorFlow's PS tutorial writes them for tf_keras: the
optimizer plain (its gradients gathered from `extended.update`) or wrapped
in rudra_tf.StalenessAwareOptimizer, against plain Keras 3 training.

Keras 3's own `fit` under RudraStrategy: tests/test_keras3_fit.py.
Every cluster runs in a fresh process (tests/support.py).
"""

import numpy as np
import pytest

from tests.support import run_in_fresh_process

# μ rows per learner step; steps per learner.
MINIBATCH = 8
STEPS = 8


def _data():
  x = np.random.RandomState(0).randn(64, 4).astype("float32")
  y = np.random.RandomState(1).randn(64, 2).astype("float32")
  return x, y


def _make_optimizer(name):
  import keras  # pylint: disable=g-import-not-at-top
  if name == "sgd_momentum":
    return keras.optimizers.SGD(0.1, momentum=0.9)
  if name == "adam":
    return keras.optimizers.Adam(0.01)
  if name == "sgd_schedule":
    return keras.optimizers.SGD(
        keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5))
  if name == "adamw":
    return keras.optimizers.AdamW(0.01, weight_decay=0.1)
  raise ValueError(name)


def _make_model():
  import keras  # pylint: disable=g-import-not-at-top
  return keras.Sequential([keras.Input((4,)),
                           keras.layers.Dense(3, activation="tanh"),
                           keras.layers.Dense(2)])


def _mse(model, x, y):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.reduce_mean((model(x, training=True) - y) ** 2)


def _train_in_a_custom_loop(num_learners, protocol, optimizer_name, wrapped,
                            one_batch=False):
  """The tutorial's loop with a Keras 3 model; learner l reads rows l,
  l + λ, ... (its input pipeline), μ at a time, or every learner the first
  μ rows at every step (`one_batch`). Returns the initial and trained
  weights and the shard's report."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  cluster = rudra_tf.LocalCluster(num_ps=1, num_learners=num_learners)
  strategy = rudra_tf.RudraStrategy(cluster.resolver, protocol=protocol)
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
      strategy)
  keras.utils.set_random_seed(0)
  with strategy.scope():
    model = _make_model()
    optimizer = _make_optimizer(optimizer_name)
    if wrapped:
      optimizer = rudra_tf.StalenessAwareOptimizer(optimizer)
  initial = [w.numpy() for w in model.weights]
  x, y = _data()

  def dataset_fn(input_context):
    if one_batch:
      return (tf.data.Dataset.from_tensors((x[:MINIBATCH], y[:MINIBATCH]))
              .repeat())
    return (tf.data.Dataset.from_tensor_slices((x, y))
            .shard(input_context.num_input_pipelines,
                   input_context.input_pipeline_id)
            .batch(MINIBATCH).repeat())

  iterator = iter(coordinator.create_per_worker_dataset(
      lambda: strategy.distribute_datasets_from_function(dataset_fn)))

  @tf.function
  def train_step(iterator):
    def replica_fn(batch):
      with tf.GradientTape() as tape:
        loss = _mse(model, *batch)
      gradients = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(gradients, model.trainable_variables))
      return loss
    return strategy.run(replica_fn, args=(next(iterator),))

  for _ in range(STEPS * num_learners):
    coordinator.schedule(train_step, args=(iterator,))
  coordinator.join()
  report = strategy.staleness_report()
  return {"initial": initial, "trained": [w.numpy() for w in model.weights],
          "gradients": report.gradients,
          "timestamp": int(report.shards[0].timestamp),
          "max_staleness": int(report.shards[0].max)}


def _plain_keras3(initial, optimizer_name, batches):
  """Plain Keras 3 (no strategy) from `initial` over `batches`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  model = _make_model()
  model.set_weights(initial)
  optimizer = _make_optimizer(optimizer_name)
  for x, y in batches:
    with tf.GradientTape() as tape:
      loss = _mse(model, x, y)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
  return model.get_weights()


def one_learner_matches_plain(optimizer_name, wrapped):
  result = _train_in_a_custom_loop(1, "async", optimizer_name, wrapped)
  x, y = _data()
  batches = [(x[i:i + MINIBATCH], y[i:i + MINIBATCH])
             for i in range(0, MINIBATCH * STEPS, MINIBATCH)]
  result["plain"] = _plain_keras3(result["initial"], optimizer_name, batches)
  return result


def hardsync_matches_sgd_with_batch_mu_lambda():
  # λ = 2, every learner step on the same μ rows. A round is any λ
  # gradients computed on the round's weights (one learner may give two),
  # so the batches are equal to make the rounds' batch known: the k-th
  # update is the mean of λ gradients at the k-th weights, plain SGD's step
  # on the μλ rows (λ copies of the μ). A stale gradient, or a sum for the
  # mean, would change it.
  result = _train_in_a_custom_loop(2, "hardsync", "sgd_momentum", False,
                                   one_batch=True)
  x, y = _data()
  rows = np.concatenate([np.arange(MINIBATCH)] * 2)
  result["plain"] = _plain_keras3(result["initial"], "sgd_momentum",
                                  [(x[rows], y[rows])] * STEPS)
  return result


@pytest.mark.parametrize("optimizer_name,wrapped", [
    ("sgd_momentum", False), ("adamw", False),
    ("sgd_momentum", True), ("adam", True), ("sgd_schedule", True)])
def test_one_learner_async_equals_plain_keras3(optimizer_name, wrapped):
  result = run_in_fresh_process(one_learner_matches_plain,
                                optimizer_name=optimizer_name, wrapped=wrapped)
  assert result["gradients"] == STEPS and result["timestamp"] == STEPS
  assert result["max_staleness"] == 0
  for rudra, plain in zip(result["trained"], result["plain"]):
    np.testing.assert_allclose(rudra, plain, rtol=1e-5, atol=1e-7)
  # Training moved the weights: the comparison is not vacuous.
  assert not np.allclose(result["plain"][0], result["initial"][0], atol=1e-3)


def test_hardsync_equals_sgd_with_batch_mu_lambda_keras3():
  result = run_in_fresh_process(hardsync_matches_sgd_with_batch_mu_lambda)
  # 16 gradients, c = 2: 8 updates, none stale.
  assert result["gradients"] == 2 * STEPS and result["timestamp"] == STEPS
  assert result["max_staleness"] == 0
  for rudra, plain in zip(result["trained"], result["plain"]):
    np.testing.assert_allclose(rudra, plain, rtol=1e-5, atol=1e-7)
  assert not np.allclose(result["plain"][0], result["initial"][0], atol=1e-3)


def mixing_the_two_kerases():
  """Each mix in a scheduled step; returns each error (None if none) and
  the gradients the shards counted."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  cluster = rudra_tf.LocalCluster(num_ps=1, num_learners=1)
  strategy = rudra_tf.RudraStrategy(cluster.resolver, protocol="async")
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
      strategy)
  mixes = {
      "tf_keras_wrapped_on_keras3": (
          lambda: _make_model(),
          lambda: rudra_tf.StalenessAwareOptimizer(
              tf_keras.optimizers.SGD(0.1))),
      "keras3_wrapped_on_tf_keras": (
          lambda: tf_keras.Sequential([tf_keras.Input((4,)),
                                       tf_keras.layers.Dense(2)]),
          lambda: rudra_tf.StalenessAwareOptimizer(keras.optimizers.SGD(0.1))),
      "keras3_plain_on_tf_keras": (
          lambda: tf_keras.Sequential([tf_keras.Input((4,)),
                                       tf_keras.layers.Dense(2)]),
          lambda: keras.optimizers.SGD(0.1)),
  }
  errors = {}
  for name, (make_model, make_optimizer) in mixes.items():
    with strategy.scope():
      model, optimizer = make_model(), make_optimizer()

    @tf.function
    def train_step(model=model, optimizer=optimizer):
      def replica_fn():
        with tf.GradientTape() as tape:
          loss = tf.reduce_sum(model(tf.ones((1, 4))))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
      strategy.run(replica_fn)

    try:
      coordinator.schedule(train_step)
      coordinator.join()
      errors[name] = None
    except Exception as error:  # pylint: disable=broad-except
      errors[name] = str(error)
  compile_errors = {}
  for name, (make_model, make_optimizer) in dict(
      mixes, tf_keras_plain_on_keras3=(
          lambda: _make_model(), lambda: tf_keras.optimizers.SGD(0.1))).items():
    with strategy.scope():
      model = make_model()
      try:
        model.compile(optimizer=make_optimizer(), loss="mse")
        compile_errors[name] = None
      except ValueError as error:
        compile_errors[name] = str(error)
  return {"errors": errors, "compile_errors": compile_errors,
          "gradients": strategy.staleness_report().gradients}


def test_mixing_tf_keras_and_keras3_is_refused_naming_both_and_the_fix():
  result = run_in_fresh_process(mixing_the_two_kerases)
  errors = result["errors"]
  assert "A tf_keras optimizer (SGD) cannot train the Keras 3 model" in (
      errors["tf_keras_wrapped_on_keras3"])
  assert "use keras.optimizers.SGD with a Keras 3 model" in (
      errors["tf_keras_wrapped_on_keras3"])
  for name in ("keras3_wrapped_on_tf_keras", "keras3_plain_on_tf_keras"):
    assert "A Keras 3 optimizer (keras.optimizers.SGD) cannot train the " \
        "tf_keras model variable" in errors[name], errors[name]
    assert "use tf_keras.optimizers.SGD with a tf_keras model" in (
        errors[name])
  assert result["gradients"] == 0  # refused before any push
  # compile refuses every mix, naming both Kerases and the fix.
  compile_errors = result["compile_errors"]
  for name in ("tf_keras_wrapped_on_keras3", "tf_keras_plain_on_keras3"):
    assert ("A tf_keras optimizer (SGD) cannot train the Keras 3 model "
            "'sequential") in compile_errors[name], compile_errors[name]
    assert "use keras.optimizers.SGD with a Keras 3 model" in (
        compile_errors[name])
  for name in ("keras3_wrapped_on_tf_keras", "keras3_plain_on_tf_keras"):
    assert ("A Keras 3 optimizer (keras.optimizers.SGD) cannot train the "
            "tf_keras model 'sequential") in compile_errors[name]
