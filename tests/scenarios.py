"""Cluster scenarios, each run in its own process by `support.run_in_fresh_process`.

Each starts a real in-process TensorFlow cluster on 127.0.0.1, trains, and
returns plain data (numpy arrays, dicts) for the test to assert on.
"""

import dataclasses
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _connect(num_ps, num_learners, protocol, **strategy_kwargs):
  import rudra_tf  # pylint: disable=g-import-not-at-top
  cluster = rudra_tf.LocalCluster(num_ps=num_ps, num_learners=num_learners)
  strategy = rudra_tf.RudraStrategy(cluster.resolver, protocol=protocol,
                                    **strategy_kwargs)
  return cluster, strategy


def _report(strategy):
  report = strategy.staleness_report()
  result = dataclasses.asdict(report)
  result["shards"] = [dataclasses.asdict(s) for s in report.shards]
  print(report.summary())
  return result


def _data(n=240, features=6, classes=3, seed=1):
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, features)).astype("float32")
  y = (np.abs(x[:, :classes]).argmax(1)).astype("int64")
  return x, y


def _dataset(x, y, batch):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)


def _mlp(features=6, hidden=8, classes=3, seed=2):
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


def _compiled_mlp(strategy, optimizer, lr_policy, **compile_kwargs):
  """The MLP, compiled under `strategy` with a StalenessAwareOptimizer."""
  import rudra_tf  # pylint: disable=g-import-not-at-top
  with strategy.scope():
    model = _mlp()
    model.compile(
        optimizer=rudra_tf.StalenessAwareOptimizer(
            _make_optimizer(optimizer), lr_policy=lr_policy),
        loss="sparse_categorical_crossentropy", **compile_kwargs)
  return model


def _make_optimizer(name):
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
  if name == "sgd_schedule":
    schedule = tf_keras.optimizers.schedules.PiecewiseConstantDecay(
        [10, 20], [0.1, 0.05, 0.01])
    return tf_keras.optimizers.SGD(schedule, momentum=0.9)
  raise ValueError(name)


# ----------------------------------------------------------------- oracle
def one_learner_matches_plain(optimizer, steps=30, dtype_policy=None):
  """One learner, async, lr_policy "none", against plain tf_keras (both
  under `dtype_policy`, e.g. "mixed_bfloat16", when given)."""
  if dtype_policy is not None:
    import tf_keras  # pylint: disable=g-import-not-at-top
    tf_keras.mixed_precision.set_global_policy(dtype_policy)
  _, strategy = _connect(1, 1, "async")
  x, y = _data()
  model = _compiled_mlp(strategy, optimizer, "none")
  model.fit(_dataset(x, y, 8), epochs=1, steps_per_epoch=steps, verbose=0)
  reference = _mlp()
  reference.compile(optimizer=_make_optimizer(optimizer),
                    loss="sparse_categorical_crossentropy")
  reference.fit(_dataset(x, y, 8), epochs=1, steps_per_epoch=steps,
                verbose=0)
  return {"rudra": model.get_weights(), "plain": reference.get_weights(),
          "compute_dtype": model.layers[0].compute_dtype,
          "report": _report(strategy)}


def counter_placement(steps=7, steps_per_execution=3):
  """Where tf_keras's counters and the weights live; a multi-step fit."""
  _, strategy = _connect(2, 1, "async")
  x, y = _data()
  model = _compiled_mlp(strategy, "sgd_momentum", "none",
                        steps_per_execution=steps_per_execution)
  devices = {"steps_per_execution": model._steps_per_execution.device,  # pylint: disable=protected-access
             "train_counter": model._train_counter.device,  # pylint: disable=protected-access
             "weights": [w.device for w in model.trainable_weights]}
  model.fit(_dataset(x, y, 4), epochs=1, steps_per_epoch=steps, verbose=0)
  return {"devices": devices, "report": _report(strategy),
          "train_counter": int(model._train_counter.numpy()),  # pylint: disable=protected-access
          "steps_per_execution": int(model._steps_per_execution.numpy())}  # pylint: disable=protected-access


# --------------------------------------------------------------- protocols
def fit_and_report(num_learners, protocol, epochs=1, steps=40, num_ps=1,
                   evaluate_between=False, more_steps=0,
                   consistent_pulls=True):
  """Fits the MLP and returns the staleness report."""
  _, strategy = _connect(num_ps, num_learners, protocol,
                         consistent_pulls=consistent_pulls)
  x, y = _data()
  model = _compiled_mlp(strategy, "sgd_momentum", "divide_by_n")
  dataset = _dataset(x, y, 4)
  model.fit(dataset, epochs=epochs, steps_per_epoch=steps, verbose=0)
  if evaluate_between:
    model.evaluate(dataset, steps=5, verbose=0)
  if more_steps:
    model.fit(dataset, epochs=1, steps_per_epoch=more_steps, verbose=0)
  result = _report(strategy)
  if strategy.protocol.barrier:
    result["tokens"] = [shard.token_counts() for shard in strategy._shards]  # pylint: disable=protected-access
  return result


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
  _, strategy = _connect(num_ps, num_learners, protocol,
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
      _dataset(x, np.zeros((64, 1), np.float32), 2), epochs=len(rates) or 1,
      steps_per_epoch=steps, verbose=0,
      callbacks=[tf_keras.callbacks.LearningRateScheduler(
          lambda epoch, _: rates[epoch])] if rates else [])
  kernel, bias = model.get_weights()
  return {"kernel": float(kernel[0, 0]), "bias": float(bias[0]),
          "logged_rates": history.history.get("lr"),
          "devices": [v.device for v in model.trainable_variables],
          "report": _report(strategy)}


# --------------------------------------------------------------- placement
def two_ps_training(partitioned, export_dir, steps=20):
  """One learner, two ps tasks, with or without a variable partitioner;
  exports the model with tf.saved_model.save and serves it back."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  partitioner = (tf.distribute.experimental.partitioners.FixedShardsPartitioner(2)
                 if partitioned else None)
  _, strategy = _connect(2, 1, "async", variable_partitioner=partitioner)
  x, y = _data(features=32)
  with strategy.scope():
    model = _mlp(features=32, hidden=64)
    model.compile(
        optimizer=rudra_tf.StalenessAwareOptimizer(
            _make_optimizer("sgd_momentum")),
        loss="sparse_categorical_crossentropy")
  model.fit(_dataset(x, y, 8), epochs=1, steps_per_epoch=steps, verbose=0)
  placement = []  # devices of each layer variable's parts
  for layer in model.layers:
    for variable in (layer.kernel, layer.bias):
      if isinstance(variable, tf.__internal__.distribute.ShardedVariable):
        placement.append([part.device for part in variable.variables])
      else:
        placement.append([variable.device])
  slot_devices = [v.device for v in model.optimizer.inner_optimizer.variables
                  if v.name.startswith("m/")]
  optimizer = model.optimizer
  every_variable = (list(model.variables) + list(optimizer.variables)
                    + [optimizer.inner_optimizer.iterations,
                       optimizer.inner_optimizer._learning_rate])  # pylint: disable=protected-access
  full_weights = [tf.convert_to_tensor(v).numpy() for layer in model.layers
                  for v in (layer.kernel, layer.bias)]
  tf.saved_model.save(model, export_dir)
  served = tf.saved_model.load(export_dir)(x[:16]).numpy()
  return {"weights": full_weights, "placement": placement,
          "served": served, "predicted": model.predict(x[:16], verbose=0),
          "slot_devices": slot_devices, "report": _report(strategy),
          "all_devices": sorted({
              part.device for v in every_variable for part in (
                  v.variables if isinstance(
                      v, tf.__internal__.distribute.ShardedVariable)
                  else [v])})}


# -------------------------------------------------------------- checkpoint
def checkpoint_round(path, restore, steps=7):
  """Trains 1-softsync (λ=2, c=2) and saves, or restores and reads back."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  _, strategy = _connect(1, 2, "1-softsync")
  x, y = _data()
  with strategy.scope():
    model = _mlp(seed=5 if restore else 2)
    optimizer = rudra_tf.StalenessAwareOptimizer(
        _make_optimizer("sgd_momentum"), lr_policy="divide_by_staleness")
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
  if restore:
    checkpoint.read(path).assert_existing_objects_matched()
    optimizer.build(model.trainable_variables)
  else:
    model.fit(_dataset(x, y, 4), epochs=1, steps_per_epoch=steps, verbose=0)
    checkpoint.write(path)
  state = {
      "weights": model.get_weights(),
      "slots": [v.numpy() for v in optimizer.inner_optimizer.variables],
      "accumulators": [a.numpy() for s in optimizer._rudra_shards  # pylint: disable=protected-access
                       for a in s.accumulators],
      "report": _report(strategy),
      "config": optimizer.get_config(),
  }
  if restore:
    model.fit(_dataset(x, y, 4), epochs=1, steps_per_epoch=steps, verbose=0)
    state["after_more_training"] = _report(strategy)
  return state


SAVE_FORMATS = {"keras": "model.keras", "h5": "model.h5",
                "savedmodel": "savedmodel"}
UNTRAINED = "untrained.keras"  # saved after compile, before any step


def _optimizer_state(model):
  return {"weights": model.get_weights(),
          # Called, as tf_keras code does: the property is callable too.
          "optimizer": [v.numpy() for v in model.optimizer.variables()]}


def saved_model_round(directory, load_format=None, protocol="hardsync",
                      steps=7):
  """Trains hardsync (λ=2, c=2) and saves in every format, or loads one
  format inside a new cluster's strategy and trains on."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  _, strategy = _connect(1, 2, protocol)
  x, y = _data()
  if load_format is None:
    model = _compiled_mlp(strategy, "sgd_momentum", "divide_by_n")
    model.save(os.path.join(directory, UNTRAINED))
    model.fit(_dataset(x, y, 4), epochs=1, steps_per_epoch=steps, verbose=0)
    for save_format, name in SAVE_FORMATS.items():
      model.save(os.path.join(directory, name),
                 save_format="tf" if save_format == "savedmodel" else None)
    return dict(_optimizer_state(model), report=_report(strategy),
                predictions=model.predict(x[:16], verbose=0))
  path = os.path.join(directory, SAVE_FORMATS.get(load_format, UNTRAINED))
  try:
    with strategy.scope():
      model = tf_keras.models.load_model(path)  # no custom_objects
      model.optimizer.build(model.trainable_variables)
  except ValueError as error:
    return {"error": str(error)}
  state = dict(_optimizer_state(model), report=_report(strategy),
               optimizer_class=type(model.optimizer).__name__,
               predictions=model.predict(x[:16], verbose=0))
  model.fit(_dataset(x, y, 4), epochs=1, steps_per_epoch=3, verbose=0)
  state["after_more_training"] = _report(strategy)
  return state


def describe_saved_model(path, dataset):
  """Loads a model launch/train.py saved, with plain tf_keras only, and
  evaluates it on `dataset`'s test split."""
  import sys  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  model = tf_keras.models.load_model(path)
  without_rudra = "rudra_tf" not in sys.modules
  from rudra_tf import datasets  # pylint: disable=g-import-not-at-top
  data = datasets.load_dataset(dataset)
  _, accuracy = model.evaluate(data.test_dataset(1000), verbose=0)
  return {"optimizer": type(model.optimizer).__name__,
          "loaded_without_rudra_tf": without_rudra,
          "test_accuracy": accuracy}


def standard_callbacks(directory, epochs=3, steps=4):
  """fit with validation data and tf_keras's usual epoch-level callbacks."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  _, strategy = _connect(1, 2, "2-softsync")
  x, y = _data()
  model = _compiled_mlp(strategy, "sgd_momentum", "divide_by_n",
                        metrics=["accuracy"])
  history = model.fit(
      _dataset(x, y, 4), epochs=epochs, steps_per_epoch=steps, verbose=0,
      validation_data=_dataset(x, y, 8), validation_steps=2,
      callbacks=[
          tf_keras.callbacks.ModelCheckpoint(
              os.path.join(directory, "epoch_{epoch}.keras")),
          tf_keras.callbacks.ModelCheckpoint(
              os.path.join(directory, "best.weights.h5"),
              save_weights_only=True, save_best_only=True),
          tf_keras.callbacks.CSVLogger(os.path.join(directory, "log.csv")),
          tf_keras.callbacks.TensorBoard(os.path.join(directory, "tb")),
          # min_delta so large that no epoch improves on the first.
          tf_keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5,
                                               patience=0, min_delta=100),
          tf_keras.callbacks.EarlyStopping(monitor="val_loss", patience=100),
      ])
  return {"history": history.history, "files": sorted(os.listdir(directory)),
          "report": _report(strategy),
          "learning_rate": float(model.optimizer.learning_rate.numpy())}


def staleness_logged(directory, protocol, epochs=3, steps=10):
  """fit with StalenessLogger before a CSVLogger."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  _, strategy = _connect(1, 3, protocol)
  x, y = _data()
  model = _compiled_mlp(strategy, "sgd_momentum", "divide_by_n")
  history = model.fit(
      _dataset(x, y, 4), epochs=epochs, steps_per_epoch=steps, verbose=0,
      callbacks=[rudra_tf.StalenessLogger(), tf_keras.callbacks.CSVLogger(
          os.path.join(directory, "log.csv"))])
  return {"history": history.history, "report": _report(strategy)}


def load_without_cluster(path, compile_model):
  """Loads a saved model in a process with no cluster and no strategy."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  from rudra_tf import StalenessAwareOptimizer  # pylint: disable=g-import-not-at-top,unused-import
  try:
    model = tf_keras.models.load_model(path, compile=compile_model)
  except ValueError as error:
    return {"error": str(error)}
  x, _ = _data()
  return {"predictions": model.predict(x[:16], verbose=0)}


# ------------------------------------------------------------------ inputs
def input_kinds():
  """fit/evaluate/predict with numpy, tf.data and DatasetCreator input."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  _, strategy = _connect(1, 2, "2-softsync")
  x, y = _data()
  model = _compiled_mlp(strategy, "adam", "divide_by_n",
                        metrics=["accuracy"])
  with strategy.scope():
    config = model.optimizer.get_config()
    clone = rudra_tf.StalenessAwareOptimizer.from_config(config)
  results = {
      "config": config,
      "round_trip": [(type(o.inner_optimizer).__name__,
                      o.inner_optimizer.get_config(), o.lr_policy, o.name)
                     for o in (model.optimizer, clone)]}

  def dataset_fn(context):
    return (tf.data.Dataset.from_tensor_slices((x, y))
            .shard(context.num_input_pipelines, context.input_pipeline_id)
            .repeat().batch(4))

  history = [
      model.fit(x, y, batch_size=4, epochs=1, steps_per_epoch=6, verbose=0),
      model.fit(_dataset(x, y, 4), epochs=2, steps_per_epoch=5, verbose=0),
      model.fit(tf_keras.utils.experimental.DatasetCreator(dataset_fn),
                epochs=1, steps_per_epoch=7, verbose=0)]
  results["losses"] = [h.history["loss"] for h in history]
  results["evaluate"] = [
      model.evaluate(_dataset(x, y, 8), steps=4, verbose=0),
      model.evaluate(tf_keras.utils.experimental.DatasetCreator(dataset_fn),
                     steps=4, verbose=0)]
  results["predict_shapes"] = [
      model.predict(x[:40], batch_size=8, verbose=0).shape,
      model.predict(tf.data.Dataset.from_tensor_slices(x[:40]).batch(8),
                    steps=5, verbose=0).shape]
  expected = model.predict(x[:16], batch_size=8, verbose=0)
  results["predict_matches_weights"] = bool(np.allclose(
      expected, _mlp_forward(model.get_weights(), x[:16]), atol=1e-5))
  results["report"] = _report(strategy)
  return results


def _mlp_forward(weights, x):
  import numpy as np  # pylint: disable=g-import-not-at-top
  kernel1, bias1, kernel2, bias2 = weights
  logits = np.tanh(x @ kernel1 + bias1) @ kernel2 + bias2
  exp = np.exp(logits - logits.max(1, keepdims=True))
  return exp / exp.sum(1, keepdims=True)


def errors_with_cluster():
  """Misuse that needs a live strategy: each returns its error message."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  _, strategy = _connect(1, 1, "async")
  x, y = _data()
  messages = {}

  def capture(name, fn):
    try:
      fn()
      messages[name] = None
    except (ValueError, TypeError, RuntimeError) as error:
      messages[name] = f"{type(error).__name__}: {error}"

  outside_optimizer = tf_keras.optimizers.SGD(0.1)
  with strategy.scope():
    plain_model = _mlp()
    plain_model.compile(optimizer=tf_keras.optimizers.SGD(0.1),
                        loss="sparse_categorical_crossentropy")
    capture("inner_created_outside_scope",
            lambda: rudra_tf.StalenessAwareOptimizer(outside_optimizer))
    capture("wraps_itself", lambda: rudra_tf.StalenessAwareOptimizer(
        rudra_tf.StalenessAwareOptimizer(tf_keras.optimizers.SGD(0.1))))
    capture("legacy_optimizer", lambda: rudra_tf.StalenessAwareOptimizer(
        tf_keras.optimizers.legacy.SGD(0.1)))
    capture("bad_lr_policy", lambda: rudra_tf.StalenessAwareOptimizer(
        tf_keras.optimizers.SGD(0.1), lr_policy="divide_by_two"))
    wrapper = rudra_tf.StalenessAwareOptimizer(tf_keras.optimizers.SGD(0.1))
  capture("plain_optimizer_fit", lambda: plain_model.fit(
      _dataset(x, y, 4), epochs=1, steps_per_epoch=2, verbose=0))
  capture("fit_without_steps", lambda: plain_model.fit(
      _dataset(x, y, 4), epochs=1, verbose=0))
  capture("fit_numpy_without_steps", lambda: plain_model.fit(
      x, y, batch_size=4, epochs=1, verbose=0))
  capture("evaluate_without_steps", lambda: plain_model.evaluate(
      _dataset(x, y, 4), verbose=0))
  variable = plain_model.trainable_variables[0]
  capture("apply_outside_step", lambda: wrapper.apply_gradients(
      [(tf.zeros(variable.shape), variable)]))
  return messages


def exhausted_input(protocol, num_learners=3):
  """Learner 0's dataset holds 3 batches and ends; the others repeat."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  _, strategy = _connect(1, num_learners, protocol)
  x, y = _data()
  model = _compiled_mlp(strategy, "sgd_momentum", "divide_by_n")

  def dataset_fn(context):
    dataset = tf.data.Dataset.from_tensor_slices((x[:12], y[:12])).batch(4)
    return dataset if context.input_pipeline_id == 0 else dataset.repeat()
  try:
    model.fit(tf_keras.utils.experimental.DatasetCreator(dataset_fn),
              epochs=2, steps_per_epoch=30, verbose=0)
    error = None
  except ValueError as raised:
    error = str(raised)
  report = _report(strategy)
  # The same model trains on once its data repeats.
  model.fit(_dataset(x, y, 4), epochs=1, steps_per_epoch=9, verbose=0)
  return {"error": error, "report": report, "retry": _report(strategy)}


def leftover_pull_after_failed_fit(retire=True, round_wait_s=60):
  """A pull of a failed hardsync fit that TF's cancellation did not reach.

  λ = 2, one shard. The chief takes both tokens of the round as learners 0
  and 1 (incarnation 0), then a third pull of learner 0 waits on the ps:
  the leftover. The failed fit is then over: the barriers are restored
  (`retire=False`: tokens refilled only, as before the fix). Returns the
  tokens once the leftover's wait has ended, and a round trained after it.
  """
  import threading  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  strategy, coordinator, w, replica_step = counting_weight("hardsync", 0.5)
  shard, = strategy._ensure_shards()  # pylint: disable=protected-access

  @tf.function
  def take(learner):
    with tf.device(shard.device):
      return shard._take_token(learner, tf.constant(0, tf.int64))  # pylint: disable=protected-access
  take(tf.constant(0, tf.int64))
  take(tf.constant(1, tf.int64))
  before = shard.token_counts()
  leftover = threading.Thread(target=take, args=(tf.constant(0, tf.int64),))
  leftover.start()
  leftover.join(2)
  waited = leftover.is_alive()
  if retire:
    strategy._restore_barriers_after_failure()  # pylint: disable=protected-access
  else:
    strategy._refill_tokens()  # pylint: disable=protected-access
  leftover.join(60)
  after = shard.token_counts()

  @tf.function
  def closure():
    strategy.run(replica_step)
  for _ in range(2):  # one round of the next fit
    coordinator.schedule(closure)
  finished = threading.Event()
  threading.Thread(target=lambda: (coordinator.join(), finished.set()),
                   daemon=True).start()
  return {"before": before, "waited": waited,
          "leftover_ended": not leftover.is_alive(), "after": after,
          "round_finished": finished.wait(round_wait_s),
          "w": float(np.asarray(w.read_value())),
          "report": _report(strategy)}


def learner_input_contexts(num_learners=3, steps=12):
  """Which InputContext each learner's dataset function was traced with."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  from rudra_tf import datasets  # pylint: disable=g-import-not-at-top
  _, strategy = _connect(1, num_learners, "async")
  data = datasets.load_synthetic(train_size=90, test_size=9,
                                 image_shape=(4, 4, 1), num_classes=3)
  seen = []

  def dataset_fn(context):
    seen.append((context.num_input_pipelines, context.input_pipeline_id))
    return data.learner_dataset(context, batch_size=2)

  with strategy.scope():
    model = tf_keras.Sequential([
        tf_keras.layers.Input((4, 4, 1)), tf_keras.layers.Flatten(),
        tf_keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=rudra_tf.StalenessAwareOptimizer(
        tf_keras.optimizers.SGD(0.1)), loss="sparse_categorical_crossentropy")
  history = model.fit(tf_keras.utils.experimental.DatasetCreator(dataset_fn),
                      epochs=1, steps_per_epoch=steps, verbose=0)
  return {"contexts": seen, "loss": history.history["loss"],
          "report": _report(strategy), "finite": bool(np.isfinite(
              history.history["loss"][0]))}


# ------------------------------------------------------ idempotent pushes
def counting_weight(protocol, learning_rate, num_learners=2,
                    **strategy_kwargs):
  """One weight w, loss = w, plain SGD: each update moves w by exactly
  -learning_rate. Returns (strategy, coordinator, w, replica_step)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  _, strategy = _connect(1, num_learners, protocol, **strategy_kwargs)
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


def rerun_closures(protocol="async", consistent_pulls=True, steps=3,
                   runs_per_step=1, reruns=(2,), learning_rate=0.1):
  """Schedules `steps` keyed closures, then runs some again with their key.

  Loss = mean(w·x) with x = 1, plain SGD: every accepted gradient moves w by
  exactly -learning_rate, so w counts the applied gradients. A closure runs
  `runs_per_step` training steps: 1 (one strategy.run), k > 1 (tf_keras's
  convention: a tf.range loop over a `steps_per_execution` argument), or
  "two_runs" (two strategy.run calls: the limit cannot be known).
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  strategy, coordinator, w, replica_step = counting_weight(
      protocol, learning_rate, consistent_pulls=consistent_pulls)
  if runs_per_step == "two_runs":
    @tf.function
    def closure(dummy):
      del dummy
      strategy.run(replica_step)
      strategy.run(replica_step)
    args = (tf.constant(0),)
  elif runs_per_step == 1:
    @tf.function
    def closure(dummy):
      del dummy
      strategy.run(replica_step)
    args = (tf.constant(0),)
  else:
    @tf.function
    def closure(dummy, steps_per_execution):
      del dummy
      for _ in tf.range(steps_per_execution):
        strategy.run(replica_step)
    args = (tf.constant(0), tf.constant(runs_per_step, tf.int64))
  for _ in range(steps):
    coordinator.schedule(closure, args=args)
  coordinator.join()
  keyed = coordinator._keyed_function(closure)  # pylint: disable=protected-access
  first_key = coordinator._first_key  # pylint: disable=protected-access
  for closure_number in reruns:
    # As TF's put_back does after a worker failure (with RudraCoordinator's
    # hook): pin the key on every shard, then queue the closure again.
    key = first_key + closure_number - 1
    strategy._pin_push_key(key)  # pylint: disable=protected-access
    coordinator._schedule_keyed(keyed, key, args, None)  # pylint: disable=protected-access
  coordinator.join()
  return {"w": float(np.asarray(w.read_value())), "report": _report(strategy),
          "limit": keyed.limit(args)}


def step_transfers(protocol="async", num_learners=1):
  """The tensors a traced training step sends between learner and ps.

  Traces one `strategy.run` step (forward, gradients, push) of the MLP and
  lists, for each direction, the distinct non-resource tensors whose
  producer and consumer sit on different sides: each is one Send/Recv pair
  (TensorFlow sends a tensor once per destination device).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  _, strategy = _connect(1, num_learners, protocol)
  model = _compiled_mlp(strategy, "sgd_momentum", "none")

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
