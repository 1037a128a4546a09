"""What the cluster tests share: a local cluster and strategy, a small seeded
MLP and its data, optimizers by name, a report as plain data, and scenarios
that several test files run.

Scenarios run in a fresh process each (`support.run_in_fresh_process`):
TensorFlow connects a process to one cluster, and a deadlock must fail a
test, not hang the suite. Each starts a real in-process TensorFlow cluster
on 127.0.0.1 and returns plain data (numpy arrays, dicts)."""

import dataclasses
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def connect_cluster(num_ps, num_learners, protocol, **strategy_kwargs):
  import rudra_tf  # pylint: disable=g-import-not-at-top
  cluster = rudra_tf.LocalCluster(num_ps=num_ps, num_learners=num_learners)
  strategy = rudra_tf.RudraStrategy(cluster.resolver, protocol=protocol,
                                    **strategy_kwargs)
  return cluster, strategy


def report_as_dict(strategy):
  report = strategy.staleness_report()
  result = dataclasses.asdict(report)
  result["shards"] = [dataclasses.asdict(s) for s in report.shards]
  print(report.summary())
  return result


def synthetic_data(n=240, features=6, classes=3, seed=1):
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, features)).astype("float32")
  y = (np.abs(x[:, :classes]).argmax(1)).astype("int64")
  return x, y


def repeated_batches(x, y, batch):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)


def seeded_mlp(features=6, hidden=8, classes=3, seed=2):
  """A small MLP with numpy-seeded initial weights (identical everywhere)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  model = tf_keras.Sequential([
      tf_keras.layers.Input((features,)),
      tf_keras.layers.Dense(hidden, activation="tanh"),
      tf_keras.layers.Dense(classes, activation="softmax")])
  rng = np.random.default_rng(seed)
  model.set_weights([rng.normal(scale=0.5, size=w.shape).astype("float32")
                     for w in model.get_weights()])
  return model


def compiled_mlp(strategy, optimizer, lr_policy, handed="wrapped",
                 **compile_kwargs):
  """The MLP, compiled under `strategy`. `handed`: "wrapped" (in a
  StalenessAwareOptimizer with `lr_policy`), "plain" (the optimizer
  itself, as stock ParameterServerStrategy code passes it), or
  "outside_plain" / "outside_wrapped" (the optimizer made outside the
  strategy's scope, as tf_keras's own tests make it)."""
  import rudra_tf  # pylint: disable=g-import-not-at-top
  if handed not in ("wrapped", "plain", "outside_plain", "outside_wrapped"):
    raise ValueError(handed)
  inner = make_optimizer(optimizer) if handed.startswith("outside") else None
  with strategy.scope():
    model = seeded_mlp()
    inner = inner or make_optimizer(optimizer)
    if handed.endswith("wrapped"):
      inner = rudra_tf.StalenessAwareOptimizer(inner, lr_policy=lr_policy)
    model.compile(optimizer=inner, loss="sparse_categorical_crossentropy",
                  **compile_kwargs)
  return model


def make_optimizer(name):
  import tf_keras  # pylint: disable=g-import-not-at-top
  if name == "sgd_momentum":
    return tf_keras.optimizers.SGD(0.05, momentum=0.9)
  if name == "adam":
    return tf_keras.optimizers.Adam(0.01)
  if name == "adagrad":
    return tf_keras.optimizers.Adagrad(0.1)
  if name == "sgd_weight_decay_clipnorm":
    return tf_keras.optimizers.SGD(0.05, momentum=0.9, weight_decay=0.01,
                                   clipnorm=0.5)
  if name == "adamw_global_clipnorm":
    return tf_keras.optimizers.AdamW(0.01, weight_decay=0.05,
                                     global_clipnorm=1.0)
  if name == "legacy_sgd_momentum_decay":
    return tf_keras.optimizers.legacy.SGD(0.05, momentum=0.9, decay=0.01)
  if name == "legacy_rmsprop":
    return tf_keras.optimizers.legacy.RMSprop(0.01)
  if name == "legacy_rmsprop_clipnorm":
    return tf_keras.optimizers.legacy.RMSprop(0.01, clipnorm=0.5)
  if name == "legacy_adam_schedule":
    schedule = tf_keras.optimizers.schedules.PiecewiseConstantDecay(
        [10, 20], [0.01, 0.005, 0.001])
    return tf_keras.optimizers.legacy.Adam(schedule)
  if name == "sgd_schedule":
    schedule = tf_keras.optimizers.schedules.PiecewiseConstantDecay(
        [10, 20], [0.1, 0.05, 0.01])
    return tf_keras.optimizers.SGD(schedule, momentum=0.9)
  raise ValueError(name)


def linear_updates(num_learners, protocol, lr_policy, steps, learning_rate=0.1,
                   schedule=None, max_staleness=None, num_ps=1,
                   consistent_pulls=True, epoch_learning_rates=None):
  """Loss = mean(w·x) with x = 1: every learner's gradient is exactly 1.

  The final w is then a hand-computable function of the protocol, the policy
  and the recorded staleness histogram. With `epoch_learning_rates`, fit runs
  one epoch of `steps` per rate, and tf_keras's LearningRateScheduler
  callback sets each epoch's rate (on the wrapper, from the chief).
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  _, strategy = connect_cluster(num_ps, num_learners, protocol,
                         max_staleness=max_staleness,
                         consistent_pulls=consistent_pulls)
  if schedule is not None:
    boundaries, values = schedule
    learning_rate = tf_keras.optimizers.schedules.PiecewiseConstantDecay(
        boundaries, values)
  with strategy.scope():
    model = tf_keras.Sequential([
        tf_keras.layers.Input((1,)),
        tf_keras.layers.Dense(1, kernel_initializer="zeros",
                              bias_initializer="zeros")])
    model.compile(
        optimizer=rudra_tf.StalenessAwareOptimizer(
            tf_keras.optimizers.SGD(learning_rate), lr_policy=lr_policy),
        loss=lambda y_true, y_pred: tf.reduce_mean(y_pred))
  x = np.ones((64, 1), np.float32)
  rates = epoch_learning_rates or []
  history = model.fit(
      repeated_batches(x, np.zeros((64, 1), np.float32), 2), epochs=len(rates) or 1,
      steps_per_epoch=steps, verbose=0,
      callbacks=[tf_keras.callbacks.LearningRateScheduler(
          lambda epoch, _: rates[epoch])] if rates else [])
  kernel, bias = model.get_weights()
  return {"kernel": float(kernel[0, 0]), "bias": float(bias[0]),
          "logged_rates": history.history.get("lr"),
          "devices": [v.device for v in model.trainable_variables],
          "report": report_as_dict(strategy)}


def counting_weight(protocol, learning_rate, num_learners=2,
                    **strategy_kwargs):
  """One weight w, loss = w, plain SGD: each update moves w by exactly
  -learning_rate. Returns (strategy, coordinator, w, replica_step)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  _, strategy = connect_cluster(1, num_learners, protocol, **strategy_kwargs)
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
      strategy)
  with strategy.scope():
    w = tf.Variable(0.0)
    optimizer = rudra_tf.StalenessAwareOptimizer(
        tf_keras.optimizers.SGD(learning_rate))
    optimizer.build([w])

  def replica_step():
    with tf.GradientTape() as tape:
      loss = w * 1.0
    optimizer.apply_gradients([(tape.gradient(loss, w), w)])
  return strategy, coordinator, w, replica_step


def step_transfers(protocol="async", num_learners=1):
  """The tensors a traced training step sends between learner and ps.

  Traces one `strategy.run` step (forward, gradients, push) of the MLP and
  lists, for each direction, the distinct non-resource tensors whose
  producer and consumer sit on different sides: each is one Send/Recv pair
  (TensorFlow sends a tensor once per destination device).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  _, strategy = connect_cluster(1, num_learners, protocol)
  model = compiled_mlp(strategy, "sgd_momentum", "none")

  def step(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(
          tf_keras.losses.sparse_categorical_crossentropy(y, model(x)))
    variables = model.trainable_variables
    model.optimizer.apply_gradients(zip(tape.gradient(loss, variables),
                                        variables))
    return loss

  @tf.function
  def train_step(x, y):
    return strategy.run(step, args=(x, y))

  graph = train_step.get_concrete_function(
      tf.TensorSpec([4, 6], tf.float32), tf.TensorSpec([4], tf.int64)).graph

  def on_ps(op):
    return "/job:ps" in op.device

  sent = {"to_ps": set(), "to_learner": set()}
  for op in graph.get_operations():
    for tensor in op.inputs:
      if tensor.dtype == tf.resource or on_ps(tensor.op) == on_ps(op):
        continue
      sent["to_ps" if on_ps(op) else "to_learner"].add(tensor.name)
  return {direction: sorted(names) for direction, names in sent.items()}
