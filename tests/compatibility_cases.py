"""tf_keras 2.21's parameter-server tests, ported: each case as tf_keras
writes it, run under whichever strategy the caller makes.

The sources (tf-keras v2.21.0): tf_keras/distribute/
dataset_creator_model_fit_test_base.py, dataset_creator_model_fit_test.py
(its ParameterServerStrategy cases), dataset_creator_model_fit_ps_only_test.py
(both `use_dataset_creator` values), the two parameter-server cases of
tf_keras/utils/dataset_creator_test.py, and tf_keras/integration_test/
parameter_server_keras_preprocessing_test.py (a lookup layer made in a
dataset function; its four training-and-serving combinations run apart,
each on a cluster of its own: see KPL_TRAIN_AND_SERVE). The port changes
what a port must: absltest assertions become plain ones, tf_keras's
private module paths become the public `tf_keras.*` names, and the cluster
is made by the caller.
The strategy line is the only other difference: each case receives the
strategy, stock ParameterServerStrategy or RudraStrategy, and builds its
model, optimizer (tf_keras's legacy SGD, made outside the scope, as the
originals do) and data exactly as the originals.

`run_cases(kind)` starts one in-process cluster (2 learners, 1 ps; the
originals use 3 and 2, or 2 and 1), runs
every case on it, one after another (each case builds its own model; one
RudraStrategy trains the newest), and returns each case's outcome: "pass",
or the error's type and message; `run_alone(kind, name)` runs one case of
KPL_TRAIN_AND_SERVE on a cluster of its own. tests/test_compatibility.py
runs them in fresh processes; `python -m benchmarks.compatibility` prints
the table.
"""

import os
import shutil
import tempfile

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# The tf_keras messages the originals assert on.
NO_STEPS_MESSAGE = (
    "When using a `tf.keras.utils.experimental.DatasetCreator`, "
    "`steps_per_epoch`, `validation_steps`, `steps`, or "
    "`pss_evaluation_shards` argument must be provided in "
    "`Model.fit`, `Model.evaluate`, or `Model.predict`.")
STRATEGY_KINDS = ("stock", "rudra_async", "rudra_hardsync")

CASES = {}


def case(fn):
  CASES[fn.__name__] = fn
  return fn


def _assert_raises(error_types, fn, message=None):
  try:
    fn()
  except error_types as error:  # pylint: disable=broad-except
    if message is not None and message not in str(error):
      raise AssertionError(
          f"expected a message with {message!r}, got {error}") from error
    return
  raise AssertionError(f"expected {error_types} to be raised")


def _lookup_dataset_fn(temp_dir):
  """The originals' dataset function with a StringLookup made inside it,
  over a vocabulary file (base._get_dataset_fn, and KPLCreatedIn...)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  filepath = os.path.join(temp_dir, "vocab")
  with open(filepath, "w") as f:
    f.write("\n".join(["earth", "wind", "and", "fire"]))

  def dataset_fn(input_context):
    del input_context
    lookup_layer = tf_keras.layers.StringLookup(num_oov_indices=1,
                                                vocabulary=filepath)
    x = np.array([["earth", "wind", "and", "fire"],
                  ["fire", "and", "earth", "michigan"]])
    y = np.array([0, 1])
    map_fn = lambda x, y: (lookup_layer(x), y)
    return (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10)
            .repeat().batch(2).map(map_fn))

  return dataset_fn


class _Base:
  """DatasetCreatorModelFitTestBase, ported."""

  def __init__(self, strategy, temp_dir):
    self.strategy = strategy
    self.temp_dir = temp_dir
    self._accuracy_metric = None

  def _get_dataset_fn(self, use_lookup_layer):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    if use_lookup_layer:
      return _lookup_dataset_fn(self.temp_dir)
    else:

      def dataset_fn(input_context):
        del input_context
        x = tf.random.uniform((10, 10))
        y = tf.random.uniform((10,))
        return (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10)
                .repeat().batch(2))

    return dataset_fn

  def _model_compile(self, steps_per_execution=1, run_eagerly=False,
                     with_normalization_layer=False, jit_compile=None):
    import tf_keras  # pylint: disable=g-import-not-at-top

    class ResultAssertingCallback(tf_keras.callbacks.Callback):
      """A callback that asserts the result of the tests."""

      def __init__(self):
        super().__init__()
        self._prev_epoch = -1

      def on_epoch_end(self, epoch, logs=None):
        if epoch <= self._prev_epoch:
          raise RuntimeError("Epoch is supposed to be larger than previous.")
        self._prev_epoch = epoch
        is_loss_float = (logs.get("loss", None) is not None and
                         isinstance(logs["loss"], (float, np.floating)))
        if not is_loss_float:
          raise RuntimeError("loss is supposed to be in the logs and float.")

    with self.strategy.scope():
      model = tf_keras.Sequential([tf_keras.layers.Dense(10)])
      if with_normalization_layer:
        norm = tf_keras.layers.BatchNormalization(
            axis=-1, input_shape=(4, 4, 3), momentum=0.8)
        model.add(norm)
      model.add(tf_keras.layers.Dense(1, activation="sigmoid"))
      self._accuracy_metric = tf_keras.metrics.Accuracy()

    model.compile(tf_keras.optimizers.legacy.SGD(), loss="binary_crossentropy",
                  metrics=[self._accuracy_metric],
                  steps_per_execution=steps_per_execution,
                  run_eagerly=run_eagerly, jit_compile=jit_compile)
    return model, [ResultAssertingCallback()]

  def _model_fit(self, steps_per_execution=1, validation_data=None, x=None,
                 y=None, shuffle=True, batch_size=None, steps_per_epoch=10,
                 run_eagerly=False, with_normalization_layer=False,
                 callbacks=None, use_lookup_layer=False,
                 use_dataset_creator=True, verbose="auto", jit_compile=None):
    import tf_keras  # pylint: disable=g-import-not-at-top
    creator = tf_keras.utils.experimental.DatasetCreator
    if callbacks is None:
      callbacks = []
    model, default_callbacks = self._model_compile(
        steps_per_execution, run_eagerly, with_normalization_layer,
        jit_compile)
    callbacks += default_callbacks
    if x is None:
      if use_dataset_creator:
        x = creator(self._get_dataset_fn(use_lookup_layer))
      else:
        x = self._get_dataset_fn(use_lookup_layer)(None)
    if validation_data is None:
      if use_dataset_creator:
        validation_data = creator(self._get_dataset_fn(use_lookup_layer))
      else:
        validation_data = self._get_dataset_fn(use_lookup_layer)(None)
    model.fit(x, y, shuffle=shuffle, batch_size=batch_size, epochs=10,
              steps_per_epoch=steps_per_epoch, callbacks=callbacks,
              validation_data=validation_data,
              validation_steps=steps_per_epoch, verbose=verbose)
    return model

  def _model_evaluate(self, steps_per_execution=1, x=None, y=None,
                      batch_size=None, steps=10, run_eagerly=False,
                      with_normalization_layer=False, callbacks=None,
                      use_dataset_creator=True):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tf_keras  # pylint: disable=g-import-not-at-top
    if callbacks is None:
      callbacks = []
    model, default_callbacks = self._model_compile(
        steps_per_execution, run_eagerly, with_normalization_layer)
    callbacks += default_callbacks

    def dataset_fn(input_context):
      del input_context
      x = tf.random.uniform((10, 10))
      y = tf.random.uniform((10, 1))
      return (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10)
              .repeat().batch(8))

    if x is None:
      if use_dataset_creator:
        x = tf_keras.utils.experimental.DatasetCreator(dataset_fn)
      else:
        x = dataset_fn(None)
    model.evaluate(x=x, y=y, steps=steps, callbacks=callbacks,
                   batch_size=batch_size)
    return model

  def _model_predict(self, model=None, steps_per_execution=1, test_data=None,
                     steps=10, with_normalization_layer=False):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    callbacks = []
    if model is None:
      model, default_callbacks = self._model_compile(
          steps_per_execution,
          with_normalization_layer=with_normalization_layer)
      callbacks += default_callbacks

    def create_test_data():
      x = tf.constant([[1.0], [2.0], [3.0], [1.0], [5.0], [1.0]])
      return tf.data.Dataset.from_tensor_slices(x).repeat().batch(2)

    if test_data is None:
      test_data = create_test_data()
    predictions = model.predict(x=test_data, steps=steps,
                                callbacks=callbacks)
    predictions = np.around(predictions, 4)
    return model, predictions


def _assert_repeated_inputs_predict_alike(predictions):
  # Inputs 0, 3 and 5 are the same (1.0); the others differ.
  assert all(predictions[0] == predictions[i] for i in [0, 3, 5])
  assert not all(predictions[0] == predictions[i] for i in [0, 1, 2, 4])


# ------------------------------------------ dataset_creator_model_fit_test
@case
def fit(t):
  model = t._model_fit()
  assert model.optimizer.iterations == 100, int(model.optimizer.iterations)


@case
def fit_with_steps_per_epoch_negative_one(t):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top

  def dataset_fn(input_context):
    del input_context
    x = tf.random.uniform((10, 10))
    y = tf.random.uniform((10,))
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10).batch(2)

  creator = tf_keras.utils.experimental.DatasetCreator
  _assert_raises(
      (tf.errors.OutOfRangeError, tf.errors.CancelledError),
      lambda: t._model_fit(steps_per_epoch=-1, x=creator(dataset_fn),
                           validation_data=creator(dataset_fn)))


@case
def fit_with_numpy_data(t):
  x = np.random.rand(100, 10)
  y = np.random.rand(100, 1)
  model = t._model_fit(x=x, y=y, batch_size=1, validation_data=(x, y))
  assert model.optimizer.iterations == 100, int(model.optimizer.iterations)


@case
def fit_with_tensor_data(t):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  x = tf.random.uniform((100, 10))
  y = tf.random.uniform((100,))
  model = t._model_fit(x=x, y=y, batch_size=1, validation_data=(x, y))
  assert model.optimizer.iterations == 100, int(model.optimizer.iterations)


@case
def fit_with_lookup_layer(t):
  model = t._model_fit(use_lookup_layer=True)
  assert model.optimizer.iterations == 100, int(model.optimizer.iterations)


@case
def fit_with_normalization_layer(t):
  model = t._model_fit(with_normalization_layer=True)
  assert model.optimizer.iterations == 100, int(model.optimizer.iterations)


@case
def fit_with_steps_per_execution(t):
  model = t._model_fit(steps_per_execution=10)
  assert model.optimizer.iterations == 100, int(model.optimizer.iterations)


@case
def fit_with_no_steps_per_epoch(t):
  _assert_raises(ValueError, lambda: t._model_fit(steps_per_epoch=None),
                 NO_STEPS_MESSAGE)


@case
def evaluate(t):
  t._model_evaluate()
  assert t._accuracy_metric.result() >= 0.0


@case
def evaluate_with_numpy_data(t):
  x = np.random.rand(100, 10)
  y = np.random.rand(100, 1)
  t._model_evaluate(x=x, y=y, batch_size=1)
  assert t._accuracy_metric.result() >= 0.0


@case
def evaluate_with_tensor_data(t):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  x = tf.random.uniform((100, 10))
  y = tf.random.uniform((100,))
  t._model_evaluate(x=x, y=y, batch_size=1)
  assert t._accuracy_metric.result() >= 0.0


@case
def evaluate_with_normalization_layer(t):
  t._model_evaluate(with_normalization_layer=True)
  assert t._accuracy_metric.result() >= 0.0


@case
def evaluate_with_steps_per_execution(t):
  t._model_evaluate(steps_per_execution=10)
  assert t._accuracy_metric.result() >= 0.0


@case
def evaluate_with_no_steps_per_epoch(t):
  _assert_raises(ValueError, lambda: t._model_evaluate(steps=None),
                 NO_STEPS_MESSAGE)


@case
def predict(t):
  _, predictions = t._model_predict(steps=3)
  _assert_repeated_inputs_predict_alike(predictions)


@case
def predict_with_numpy_data(t):
  x = np.array([[1.0], [2.0], [3.0], [1.0], [5.0], [1.0]])
  _, predictions = t._model_predict(test_data=x)
  _assert_repeated_inputs_predict_alike(predictions)


@case
def predict_with_tensor_data(t):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  x = tf.constant([[1.0], [2.0], [3.0], [1.0], [5.0], [1.0]])
  _, predictions = t._model_predict(test_data=x)
  _assert_repeated_inputs_predict_alike(predictions)


@case
def predict_with_normalization_layer(t):
  _, predictions = t._model_predict(with_normalization_layer=True, steps=3)
  _assert_repeated_inputs_predict_alike(predictions)


@case
def predict_with_steps_per_execution(t):
  _, predictions = t._model_predict(steps_per_execution=3, steps=3)
  _assert_repeated_inputs_predict_alike(predictions)


@case
def fit_and_predict(t):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top

  def fit_dataset_fn(input_context):
    del input_context
    x = tf.random.uniform((10, 1))
    y = tf.random.uniform((10,))
    return (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10).repeat()
            .batch(2))

  creator = tf_keras.utils.experimental.DatasetCreator
  model = t._model_fit(x=creator(fit_dataset_fn),
                       validation_data=creator(fit_dataset_fn))
  _, predictions = t._model_predict(model, steps=3)
  _assert_repeated_inputs_predict_alike(predictions)


@case
def predict_with_dataset_creator(t):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top

  def _dataset_fn(input_context):
    del input_context
    x = tf.constant([[1.0], [2.0], [3.0], [1.0], [5.0], [1.0]])
    return tf.data.Dataset.from_tensor_slices(x).repeat().batch(2)

  _, predictions = t._model_predict(
      steps=3, test_data=tf_keras.utils.experimental.DatasetCreator(
          _dataset_fn))
  _assert_repeated_inputs_predict_alike(predictions)


@case
def train_tf_function(t):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  model = t._model_fit()
  assert isinstance(model.train_tf_function,
                    tf.__internal__.function.Function)


# --------------------------------- dataset_creator_model_fit_ps_only_test
def _ps_only(fn):
  """Registers `fn` twice, as the original's use_dataset_creator combos."""
  for use_dataset_creator in (True, False):
    name = f"{fn.__name__}[dataset_creator={use_dataset_creator}]"
    CASES[name] = (lambda t, u=use_dataset_creator: fn(t, u))
  return fn


@_ps_only
def ps_fit_with_run_eagerly(t, use_dataset_creator):
  _assert_raises(
      ValueError, lambda: t._model_fit(
          run_eagerly=True, use_dataset_creator=use_dataset_creator),
      "When using `Model` with `ParameterServerStrategy`, `run_eagerly` is "
      "not supported.")


def ps_predict(t):
  # The original skips use_dataset_creator=True ("Unused option.").
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  model, _ = t._model_compile()
  test_data = (tf.data.Dataset.from_tensor_slices(
      [[1.0], [2.0], [3.0], [1.0], [5.0], [1.0]]).repeat().batch(2))
  model.predict(x=test_data, steps=3)


CASES["ps_predict[dataset_creator=False]"] = ps_predict


@_ps_only
def ps_cluster_coordinator_single_instance(t, use_dataset_creator):
  _assert_one_coordinator(
      t._model_fit(use_dataset_creator=use_dataset_creator))


def _batch_level_callback():
  import tf_keras  # pylint: disable=g-import-not-at-top

  class BatchLevelCallback(tf_keras.callbacks.Callback):

    def on_train_batch_end(self, batch, logs=None):
      pass

  return BatchLevelCallback()


def _assert_one_coordinator(model):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  strategy = model.distribute_strategy
  assert strategy._cluster_coordinator is (  # pylint: disable=protected-access
      tf.distribute.experimental.coordinator.ClusterCoordinator(strategy))


@_ps_only
def ps_fit_error_on_batch_level_callbacks(t, use_dataset_creator):
  _assert_raises(
      ValueError, lambda: t._model_fit(
          callbacks=[_batch_level_callback()],
          use_dataset_creator=use_dataset_creator),
      "Batch-level `Callback`s are not supported")


@_ps_only
def ps_fit_callback_supports_tf_logs(t, use_dataset_creator):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top

  class MyCallback(tf_keras.callbacks.Callback):

    def __init__(self):
      super().__init__()
      # Fetches the RemoteValues if necessary.
      self._supports_tf_logs = True

    def on_train_batch_end(self, batch, logs=None):
      assert isinstance(
          logs, tf.distribute.experimental.coordinator.RemoteValue)

  t._model_fit(callbacks=[MyCallback()],
               use_dataset_creator=use_dataset_creator)


@_ps_only
def ps_fit_verbosity(t, use_dataset_creator):
  import tf_keras  # pylint: disable=g-import-not-at-top

  class MyCallback(tf_keras.callbacks.Callback):
    pass

  my_callback = MyCallback()
  t._model_fit(callbacks=[my_callback],
               use_dataset_creator=use_dataset_creator)
  # PSStrategy should default to epoch-level logging.
  assert my_callback.params["verbose"] == 2, my_callback.params["verbose"]


@_ps_only
def ps_fit_tensorboard_epoch_level(t, use_dataset_creator):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  log_dir = tempfile.mkdtemp(dir=t.temp_dir)
  t._model_fit(callbacks=[tf_keras.callbacks.TensorBoard(log_dir)],
               use_dataset_creator=use_dataset_creator)
  assert tf.io.gfile.exists(log_dir)
  assert len(tf.io.gfile.listdir(log_dir)) >= 1


@_ps_only
def ps_fit_verbose_1(t, use_dataset_creator):
  _assert_raises(
      ValueError, lambda: t._model_fit(
          use_dataset_creator=use_dataset_creator, verbose=1),
      "`verbose=1` is not allowed with `ParameterServerStrategy` for "
      "performance reasons. Received: verbose=1")


@_ps_only
def ps_evaluate_error_on_batch_level_callbacks(t, use_dataset_creator):
  _assert_raises(
      ValueError, lambda: t._model_evaluate(
          callbacks=[_batch_level_callback()],
          use_dataset_creator=use_dataset_creator),
      "Batch-level `Callback`s are not supported")


@_ps_only
def ps_cluster_coordinator_single_instance_with_jit_compile_true(
    t, use_dataset_creator):
  _assert_one_coordinator(
      t._model_fit(use_dataset_creator=use_dataset_creator, jit_compile=True))


# ---------------------------------------------------- dataset_creator_test
def _sharded_dataset_fn():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def dataset_fn(input_context):
    global_batch_size = 64
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = tf.data.Dataset.from_tensors(([1.0], [1.0])).repeat()
    dataset = dataset.shard(input_context.num_input_pipelines,
                            input_context.input_pipeline_id)
    dataset = dataset.batch(batch_size)
    dataset = dataset.prefetch(2)
    return dataset

  return dataset_fn


def dataset_creator_usage_in_parameter_server_model_fit(t, use_input_options):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  with t.strategy.scope():
    model = tf_keras.Sequential([tf_keras.layers.Dense(10)])
  model.compile(tf_keras.optimizers.legacy.SGD(), loss="mse")
  input_options = tf.distribute.InputOptions() if use_input_options else None
  history = model.fit(
      tf_keras.utils.experimental.DatasetCreator(_sharded_dataset_fn(),
                                                 input_options),
      epochs=10, steps_per_epoch=10, verbose=0)
  assert len(history.history["loss"]) == 10


for _use_input_options in (True, False):
  CASES["dataset_creator_usage_in_parameter_server_model_fit"
        f"[input_options={_use_input_options}]"] = (
            lambda t, u=_use_input_options:
            dataset_creator_usage_in_parameter_server_model_fit(t, u))


# ------------------------------- parameter_server_keras_preprocessing_test
FEATURE_VOCAB = ["avenger", "ironman", "batman", "hulk", "spiderman",
                 "kingkong", "wonder_woman"]
LABEL_VOCAB = ["yes", "no"]


def _define_kpls_for_training(use_adapt):
  import random  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  if use_adapt:
    feature_lookup_layer = tf_keras.layers.StringLookup(num_oov_indices=1)
    feature_lookup_layer.adapt(FEATURE_VOCAB)
    label_lookup_layer = tf_keras.layers.StringLookup(num_oov_indices=0,
                                                      mask_token=None)
    label_lookup_layer.adapt(LABEL_VOCAB)
  else:
    shuffled_vocab = FEATURE_VOCAB.copy()
    random.shuffle(shuffled_vocab)
    feature_lookup_layer = tf_keras.layers.StringLookup(
        vocabulary=shuffled_vocab, num_oov_indices=1)
    label_lookup_layer = tf_keras.layers.StringLookup(
        vocabulary=LABEL_VOCAB, num_oov_indices=0, mask_token=None)
  raw_feature_input = tf_keras.Input(shape=(3,), dtype=tf.string,
                                     name="feature", ragged=True)
  feature_ps = tf_keras.Model({"features": raw_feature_input},
                              feature_lookup_layer(raw_feature_input))
  raw_label_input = tf_keras.Input(shape=(1,), dtype=tf.string, name="label")
  label_ps = tf_keras.Model({"label": raw_label_input},
                            label_lookup_layer(raw_label_input))
  return feature_ps, label_ps


def kpl_train_and_load_and_serve(t, use_adapt, test_training_with_loaded):
  """KPLTest.testTrainAndLoadAndServe (load_for_serving_under_strategy=False,
  the only value the original runs)."""
  import random  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  strategy = t.strategy
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
      strategy)
  with strategy.scope():
    feature_ps, label_ps = _define_kpls_for_training(use_adapt)
    if test_training_with_loaded:
      saved_kpl_dir = tempfile.mkdtemp(dir=t.temp_dir)
      feature_ps_dir = os.path.join(saved_kpl_dir, "feature")
      label_ps_dir = os.path.join(saved_kpl_dir, "label")
      feature_ps.save(feature_ps_dir)
      label_ps.save(label_ps_dir)
      del feature_ps, label_ps
      feature_ps = tf_keras.models.load_model(feature_ps_dir)
      label_ps = tf_keras.models.load_model(label_ps_dir)

    def dataset_fn():
      def feature_and_label_gen():
        while True:
          features = random.sample(FEATURE_VOCAB, 3)
          label = ["yes"] if "avenger" in features else ["no"]
          yield {"features": features, "label": label}

      raw_dataset = tf.data.Dataset.from_generator(
          feature_and_label_gen,
          output_signature={"features": tf.TensorSpec([3], tf.string),
                            "label": tf.TensorSpec([1], tf.string)}
      ).shuffle(100).batch(32)
      return raw_dataset.map(lambda x: ({"features": feature_ps(x["features"])},
                                        label_ps(x["label"])))

    model_input = tf_keras.Input(shape=(3,), dtype=tf.int64,
                                 name="model_input")
    # input_dim includes a mask token and an oov token.
    emb_output = tf_keras.layers.Embedding(input_dim=len(FEATURE_VOCAB) + 2,
                                           output_dim=20)(model_input)
    emb_output = tf.reduce_mean(emb_output, axis=1)
    dense_output = tf_keras.layers.Dense(units=1,
                                         activation="sigmoid")(emb_output)
    model = tf_keras.Model({"features": model_input}, dense_output)
    optimizer = tf_keras.optimizers.RMSprop(learning_rate=0.1)
    accuracy = tf_keras.metrics.Accuracy()

  @tf.function
  def worker_fn(iterator):
    def replica_fn(iterator):
      batch_data, labels = next(iterator)
      with tf.GradientTape() as tape:
        pred = model(batch_data, training=True)
        loss = tf.nn.compute_average_loss(
            tf_keras.losses.BinaryCrossentropy(
                reduction=tf_keras.losses.Reduction.NONE)(labels, pred))
        gradients = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(gradients, model.trainable_variables))
      actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
      accuracy.update_state(labels, actual_pred)

    strategy.run(replica_fn, args=(iterator,))

  distributed_dataset = coordinator.create_per_worker_dataset(dataset_fn)
  distributed_iterator = iter(distributed_dataset)
  for _ in range(4):
    accuracy.reset_state()
    for _ in range(7):
      coordinator.schedule(worker_fn, args=(distributed_iterator,))
    coordinator.join()
  assert accuracy.result().numpy() > 0.5, accuracy.result().numpy()

  model.feature_ps = feature_ps
  model.label_ps = label_ps
  model.label_inverse_lookup_layer = tf_keras.layers.StringLookup(
      num_oov_indices=0, mask_token=None, vocabulary=LABEL_VOCAB, invert=True)

  @tf.function
  def serve_fn(raw_features):
    raw_features = tf.expand_dims(raw_features, axis=0)
    transformed_features = model.feature_ps(raw_features)
    outputs = model(transformed_features)
    outputs = tf.squeeze(outputs, axis=0)
    outputs = tf.cast(tf.greater(outputs, 0.5), tf.int64)
    decoded_outputs = model.label_inverse_lookup_layer(outputs)
    return tf.squeeze(decoded_outputs, axis=0)

  serving_fn = serve_fn.get_concrete_function(
      tf.TensorSpec(shape=(3), dtype=tf.string, name="example"))
  saved_model_dir = tempfile.mkdtemp(dir=t.temp_dir)
  model.save(saved_model_dir, signatures={"serving_default": serving_fn})
  loaded_serving_fn = tf_keras.models.load_model(
      saved_model_dir).signatures["serving_default"]
  prediction0 = loaded_serving_fn(
      tf.constant(["avenger", "ironman", "avenger"]))["output_0"]
  assert prediction0 in (b"yes", b"no"), prediction0
  prediction1 = loaded_serving_fn(
      tf.constant(["ironman", "ironman", "unknown"]))["output_0"]
  assert prediction1 in (b"yes", b"no"), prediction1


# Run apart, each on a cluster of its own (`run_alone`): releasing a case's
# per-worker iterator (a generator dataset mapped through the preprocessing
# models) can deadlock TensorFlow's in-process cluster, under stock
# ParameterServerStrategy as under RudraStrategy. Measured (gdb, TF 2.21):
# each worker's delete of the iterator runs the generator dataset's
# finalize function synchronously (GeneratorDatasetOp::Iterator::~Iterator
# -> ProcessFunctionLibraryRuntime::RunSync), which never returns, holding
# the worker's RemoteMgr lock. The chief's next new function is registered
# on every worker (EagerContext::MaybeRegisterFunctionRemotely, a blocking
# Enqueue) and waits behind that delete forever: RudraStrategy's staleness
# report after the case hung there, and stock hung in the case's own
# return (AtomicFunction.__del__ -> Context.remove_function) or at exit.
KPL_TRAIN_AND_SERVE = {
    f"kpl_train_and_load_and_serve[use_adapt={use_adapt},"
    f"test_training_with_loaded={loaded}]": (
        lambda t, a=use_adapt, l=loaded: kpl_train_and_load_and_serve(t, a, l))
    for use_adapt in (True, False) for loaded in (True, False)}


@case
def kpl_created_in_datasets_from_function(t):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  strategy = t.strategy
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
      strategy)
  dataset_fn = _lookup_dataset_fn(t.temp_dir)

  def per_worker_dataset_fn():
    return strategy.distribute_datasets_from_function(dataset_fn)

  per_worker_iter = iter(coordinator.create_per_worker_dataset(
      per_worker_dataset_fn))

  @tf.function
  def worker_fn(iterator):
    def replica_fn(data):
      return data

    return strategy.run(replica_fn, args=(next(iterator),))

  result = []
  for _ in range(10):
    result.append(coordinator.schedule(worker_fn, args=(per_worker_iter,)))
  coordinator.join()
  # Beyond the original (which only joins): the ids, worked out by hand. The
  # layer's vocabulary is the file's after its one OOV index (no mask
  # token): OOV 0, earth 1, wind 2, and 3, fire 4; each batch holds both
  # sentences, in either order.
  for remote_value in result:
    ids, _ = remote_value.fetch()
    assert sorted(map(tuple, ids.tolist())) == [(1, 2, 3, 4), (4, 3, 1, 0)], (
        ids)


# ------------------------------------------------------------------ runner
def make_strategy(kind, resolver, variable_partitioner=None):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if kind == "stock":
    return tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=variable_partitioner)
  import rudra_tf  # pylint: disable=g-import-not-at-top
  protocols = {"rudra_async": "async", "rudra_hardsync": "hardsync"}
  if kind not in protocols:
    raise ValueError(f"kind {kind!r}: valid kinds are {STRATEGY_KINDS}")
  return rudra_tf.RudraStrategy(resolver, protocol=protocols[kind],
                                variable_partitioner=variable_partitioner)


# The cases whose model trains 10 epochs of 10 steps: under RudraStrategy
# each step must be one gradient through the protocol (100 in its report).
TRAINED_100_STEPS = frozenset(
    ["fit", "fit_with_numpy_data", "fit_with_tensor_data",
     "fit_with_lookup_layer", "fit_with_normalization_layer",
     "fit_with_steps_per_execution", "fit_and_predict", "train_tf_function"] +
    [f"{name}[dataset_creator={flag}]" for flag in (True, False)
     for name in ("ps_cluster_coordinator_single_instance",
                  "ps_fit_callback_supports_tf_logs", "ps_fit_verbosity",
                  "ps_fit_tensorboard_epoch_level")] +
    [f"dataset_creator_usage_in_parameter_server_model_fit"
     f"[input_options={flag}]" for flag in (True, False)])


def outcome_of(error):
  """A failed case's outcome: "<ErrorType>: <the message's end>" (the
  cause is at the end: autograph prefixes a traceback)."""
  return f"{type(error).__name__}: {' '.join(str(error).split())[-300:]}"


def run_alone(kind, name):
  """Case `name` of KPL_TRAIN_AND_SERVE on a cluster of its own.

  As the case returns, this reads the staleness report and keeps the
  case's locals (its per-worker iterator, its functions) alive, since
  their release deadlocks (see KPL_TRAIN_AND_SERVE). Returns
  {"outcome": ..., "gradients": ...} as one case of `run_cases`. Call it
  with `run_in_fresh_process(..., exit_at_once=True)`: the process would
  hang at exit, as stock's does.
  """
  import sys  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  cluster = rudra_tf.LocalCluster(num_ps=1, num_learners=2)
  strategy = make_strategy(kind, cluster.resolver)
  gradients, kept_alive = [], []
  case_code = kpl_train_and_load_and_serve.__code__

  def on_return(frame, event, unused_arg):
    if event == "return" and frame.f_code is case_code:
      # The frame itself, not f_locals (whose write-back at the hook's end
      # can clear the case's closure cells): a frame that outlives its run
      # keeps its locals.
      kept_alive.append(frame)
      if kind != "stock":
        gradients.append(strategy.staleness_report().gradients)

  temp_dir = tempfile.mkdtemp()
  sys.setprofile(on_return)
  try:
    KPL_TRAIN_AND_SERVE[name](_Base(strategy, temp_dir))
    outcome = "pass"
  except Exception as error:  # pylint: disable=broad-except
    outcome = outcome_of(error)
  finally:
    sys.setprofile(None)
    shutil.rmtree(temp_dir, ignore_errors=True)
  return {"outcome": outcome, "gradients": gradients[0] if gradients else None}


def run_cases(kind, names=None):
  """Every case (or `names`) on one cluster under strategy `kind`.

  Returns {"outcomes": {case: "pass" or "<ErrorType>: <message>"},
  "gradients": {case: gradients in the newest model's staleness report
  (RudraStrategy; None on stock)}}.
  """
  import rudra_tf  # pylint: disable=g-import-not-at-top
  cluster = rudra_tf.LocalCluster(num_ps=1, num_learners=2)
  strategy = make_strategy(kind, cluster.resolver)
  outcomes, gradients = {}, {}
  with tempfile.TemporaryDirectory() as temp_dir:
    for name in names or CASES:
      try:
        CASES[name](_Base(strategy, temp_dir))
        outcomes[name] = "pass"
      except Exception as error:  # pylint: disable=broad-except
        outcomes[name] = outcome_of(error)
      gradients[name] = (strategy.staleness_report().gradients
                         if kind != "stock" else None)
  return {"outcomes": outcomes, "gradients": gradients}


# A train-and-serve case: 28 steps, a save and two loads; the other runs:
# a fresh cluster and ~45 fits of 10 epochs each, or 26 sharded-variable
# cases.
ALONE_TIMEOUT_S = 300
RUN_TIMEOUT_S = 900


def run_all(kind):
  """Every ported case under strategy `kind`, each run in a fresh process
  as it must be: {"outcomes": {case: ...}, "gradients": {case: ...}} (None
  for a sharded-variable case), in the table's order."""
  from tests import sharded_variable_cases  # pylint: disable=g-import-not-at-top
  from tests.support import run_in_fresh_process  # pylint: disable=g-import-not-at-top
  run = run_in_fresh_process(run_cases, kind=kind, timeout=RUN_TIMEOUT_S)
  for name in KPL_TRAIN_AND_SERVE:
    alone = run_in_fresh_process(run_alone, kind=kind, name=name,
                                 timeout=ALONE_TIMEOUT_S, exit_at_once=True)
    run["outcomes"][name] = alone["outcome"]
    run["gradients"][name] = alone["gradients"]
  sharded = run_in_fresh_process(sharded_variable_cases.run_cases, kind=kind,
                                 timeout=RUN_TIMEOUT_S)
  for name, outcome in sharded.items():
    run["outcomes"][name] = outcome
    run["gradients"][name] = None
  return run
