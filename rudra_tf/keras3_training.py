"""Keras 3's fit, evaluate and predict for a model under RudraStrategy.

Keras 3 has no parameter-server training: its TensorFlow trainer runs every
step on the chief with `distribute_strategy.run`. For a model whose
strategy is a RudraStrategy, `install()` routes `Model.fit`, `evaluate`
and `predict` here (tf_hooks.install_keras3_training; any other model keeps
Keras 3's own):

    fit                                        learner (worker task)
    ---                                        ---------------------
    build the model from the input's spec
    per epoch:
      reset the metrics; on_epoch_begin
      schedule steps_per_epoch steps        -> pull, model.train_step on its
      (steps_per_execution per closure)        own batch of μ, push one
                                               gradient (the optimizer),
                                               update the metrics on the ps
      join; read the metrics: epoch logs
      validation (evaluate, below)
      on_epoch_end; stop_training?

    evaluate / predict: on the chief, every row once, reading the
    parameter-server weights (exact: no learner skips or repeats a batch)

Every learner step pushes exactly one gradient (nothing is accumulated on
a learner), so the protocols count gradients as under tf_keras's fit. The
metrics live on the ps tasks and every learner adds to them: Keras 3's
read-then-write `assign_add` is made one atomic update there
(tf_hooks.install_keras3_atomic_accumulation), so no learner's count is
lost. The
input kinds are rudra_tf/keras3_inputs.py's.

Limitations (as tf_keras's fit under a parameter-server strategy):
batch-level callbacks are refused in fit (ModelCheckpoint with an integer
save_freq, TensorBoard with update_freq other than "epoch" or profiling,
any callback with its own on_*_batch_* hooks): a learner's batch ends on a
remote task. Those that take remote values as logs (tf_keras's
`_supports_tf_logs`, as rudra_tf.PeriodicCheckpoint) are called as each
closure is scheduled, with its remote value. `verbose` prints one line per
epoch. `train_on_batch` and
`test_on_batch` run on the chief, which is no learner: they are Keras 3's
own and fail under RudraStrategy.
"""

import numpy as np
import tensorflow as tf

from rudra_tf import keras3_inputs
from rudra_tf import tf_hooks

# Batch-level hooks a fit callback must not implement (see Limitations).
_BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin",
                "on_train_batch_end")


def _is_rudra(model):
  from rudra_tf import strategy as strategy_lib  # pylint: disable=g-import-not-at-top
  return isinstance(model.distribute_strategy, strategy_lib.RudraStrategy)


def install():
  """Routes Keras 3's fit/evaluate/predict here for RudraStrategy models,
  and makes their metrics' accumulations atomic on the ps tasks."""
  from rudra_tf import variables as variables_lib  # pylint: disable=g-import-not-at-top
  tf_hooks.install_keras3_training(applies=_is_rudra, fit=fit,
                                   evaluate=evaluate, predict=predict)
  tf_hooks.install_keras3_atomic_accumulation(
      applies=lambda tf_variable: isinstance(tf_variable,
                                             variables_lib.RudraVariable))


def _uses_batch_hooks(callback):
  import keras  # pylint: disable=g-import-not-at-top
  if isinstance(callback, keras.callbacks.ModelCheckpoint):
    return callback.save_freq != "epoch"
  if isinstance(callback, keras.callbacks.TensorBoard):
    return (callback.update_freq != "epoch" or
            tf_hooks.keras3_tensorboard_profiles(callback))
  if isinstance(callback, (keras.callbacks.ProgbarLogger,
                           keras.callbacks.History)):
    return False
  return any(tf_hooks.keras_callback_overrides(callback, hook)
             for hook in _BATCH_HOOKS)


def _takes_remote_logs(callback):
  """A callback whose batch hooks take a step's remote value as its logs
  (tf_keras's convention under a parameter-server strategy, which
  rudra_tf.PeriodicCheckpoint follows): fit calls them as it schedules."""
  return tf_hooks.accepts_remote_logs(callback)


def refuse_batch_level_callbacks(callbacks):
  batch_level = [callback for callback in callbacks or ()
                 if _uses_batch_hooks(callback) and
                 not _takes_remote_logs(callback)]
  if batch_level:
    raise ValueError(
        "Batch-level callbacks are not supported in fit under "
        "RudraStrategy, as under TensorFlow's ParameterServerStrategy (a "
        "learner's batch ends on a remote task): found "
        f"{[type(callback).__name__ for callback in batch_level]}. Use "
        "epoch-level callbacks (ModelCheckpoint with save_freq='epoch', "
        "TensorBoard with update_freq='epoch', CSVLogger, EarlyStopping, "
        "LearningRateScheduler, rudra_tf.StalenessLogger).")


def _callback_list(model, callbacks, verbose, epochs, steps, history=False):
  import keras  # pylint: disable=g-import-not-at-top
  if isinstance(callbacks, keras.callbacks.CallbackList):
    return callbacks
  return keras.callbacks.CallbackList(
      callbacks, add_history=history, add_progbar=verbose != 0,
      verbose=verbose, epochs=epochs, steps=steps, model=model)


def _metric_logs(model):
  """The model's metrics, read on the chief, as Python floats."""
  return {name: float(np.asarray(value))
          for name, value in model.get_metrics_result().items()}


def _build(model, learner_input):
  with model.distribute_strategy.scope():
    tf_hooks.keras3_symbolic_build(model, learner_input.element_spec())


def _per_learner_dataset(coordinator, learner_input):
  strategy = coordinator.strategy
  if learner_input.kind == keras3_inputs.DATASET:
    # Made on the chief: its graph is sent to each learner (a dataset
    # function would capture it, and a dataset cannot be copied).
    return coordinator.create_per_worker_dataset(
        strategy.experimental_distribute_dataset(learner_input.dataset_fn(
            tf.distribute.InputContext())))
  return coordinator.create_per_worker_dataset(
      lambda: strategy.distribute_datasets_from_function(
          learner_input.dataset_fn))


class _ScheduledSteps:
  """The scheduled training functions: `count` learner steps each."""

  def __init__(self, model):
    self._model = model
    self._functions = {}

  def function(self, count):
    if count not in self._functions:
      model, strategy = self._model, self._model.distribute_strategy

      def steps(iterator):
        for _ in range(count):  # unrolled: each step pushes its gradient
          outputs = strategy.run(model.train_step, args=(next(iterator),))
        return outputs  # the last step's metrics: a value to wait on
      self._functions[count] = tf.function(steps)
    return self._functions[count]


def fit(model, x=None, y=None, batch_size=None, epochs=1, verbose="auto",
        callbacks=None, validation_split=0.0, validation_data=None,
        shuffle=True, class_weight=None, sample_weight=None,
        initial_epoch=0, steps_per_epoch=None, validation_steps=None,
        validation_batch_size=None, validation_freq=1):
  """Keras 3's `Model.fit` on the learners (see the module docstring)."""
  tf_hooks.keras3_assert_compiled(model, "fit")
  strategy = model.distribute_strategy
  if validation_split and validation_data is None:
    if isinstance(x, tf.data.Dataset) or callable(x):
      raise ValueError("validation_split needs numpy arrays as x; give a "
                       "dataset validation_data instead.")
    arrays = tuple(part for part in (x, y, sample_weight) if part is not None)
    arrays, validation_data = keras3_inputs.split_for_validation(
        arrays, validation_split)
    x, y, sample_weight = (arrays + (None, None))[:3]
  learner_input = keras3_inputs.LearnerInput(
      x, y, sample_weight, batch_size, shuffle, class_weight)
  steps = steps_per_epoch or learner_input.default_steps()
  if not steps:
    raise ValueError(
        f"fit under RudraStrategy with a {learner_input.kind} as x needs "
        "steps_per_epoch (each learner's dataset repeats; an epoch is "
        "steps_per_epoch learner steps over all learners).")
  refuse_batch_level_callbacks(
      callbacks.callbacks if hasattr(callbacks, "callbacks") else callbacks)
  verbose = 2 if verbose == "auto" else verbose
  _build(model, learner_input)
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
      strategy)
  iterator = iter(_per_learner_dataset(coordinator, learner_input))
  scheduled = _ScheduledSteps(model)
  per_closure = int(model.steps_per_execution)
  callbacks = _callback_list(model, callbacks, verbose, epochs, steps,
                             history=True)
  remote_logs_callbacks = [callback for callback in callbacks.callbacks
                           if _takes_remote_logs(callback)]
  model.stop_training = False
  callbacks.on_train_begin()
  training_logs = None
  for epoch in range(initial_epoch, epochs):
    model.reset_metrics()
    callbacks.on_epoch_begin(epoch)
    for first in range(0, steps, per_closure):
      count = min(per_closure, steps - first)
      for callback in remote_logs_callbacks:
        callback.on_train_batch_begin(first)
      remote = coordinator.schedule(scheduled.function(count),
                                    args=(iterator,))
      for callback in remote_logs_callbacks:
        callback.on_train_batch_end(first + count - 1, remote)
      if model.stop_training:
        break
    coordinator.join()
    epoch_logs = _metric_logs(model)
    if validation_data is not None and (
        (epoch + 1) % validation_freq == 0 if isinstance(validation_freq, int)
        else epoch + 1 in validation_freq):
      val_x, val_y, val_sample_weight = _unpack(validation_data)
      val_logs = evaluate(
          model, val_x, val_y, batch_size=validation_batch_size or batch_size,
          sample_weight=val_sample_weight, steps=validation_steps, verbose=0,
          return_dict=True)
      epoch_logs.update({f"val_{name}": value
                         for name, value in val_logs.items()})
    callbacks.on_epoch_end(epoch, epoch_logs)
    training_logs = epoch_logs
    if model.stop_training:
      break
  callbacks.on_train_end(logs=training_logs)
  return model.history


def _unpack(data):
  if isinstance(data, tuple) and 2 <= len(data) <= 3:
    return (data + (None,))[:3]
  return data, None, None


def _local_steps(model, step_method):
  """A tf.function running `step_method` on one batch, on the chief."""
  cache = "_rudra_chief_" + step_method.__name__
  function = getattr(model, cache, None)
  if function is None:
    function = tf.function(step_method, reduce_retracing=True)
    object.__setattr__(model, cache, function)
  return function


def evaluate(model, x=None, y=None, batch_size=None, verbose="auto",
             sample_weight=None, steps=None, callbacks=None,
             return_dict=False, **kwargs):
  """Keras 3's `Model.evaluate`, on the chief (every row once)."""
  if kwargs:
    raise ValueError(f"Arguments not recognized: {kwargs}")
  tf_hooks.keras3_assert_compiled(model, "evaluate")
  learner_input = keras3_inputs.LearnerInput(
      x, y, sample_weight, batch_size, shuffle=False)
  _build(model, learner_input)
  dataset = learner_input.local_dataset(steps)
  callbacks = _callback_list(model, callbacks, verbose, 1, steps)
  test_step = _local_steps(model, model.test_step)
  model.stop_evaluating = False
  callbacks.on_test_begin()
  model.reset_metrics()
  logs = {}
  for step, batch in enumerate(dataset):
    callbacks.on_test_batch_begin(step)
    test_step(batch)
    logs = _metric_logs(model) if callbacks.callbacks else {}
    callbacks.on_test_batch_end(step, logs)
    if model.stop_evaluating:
      break
  logs = _metric_logs(model)
  callbacks.on_test_end(logs)
  if return_dict:
    return logs
  return tf_hooks.keras3_metrics_in_order(model, logs)


def predict(model, x, batch_size=None, verbose="auto", steps=None,
            callbacks=None):
  """Keras 3's `Model.predict`, on the chief (every row once, in order)."""
  learner_input = keras3_inputs.LearnerInput(x, batch_size=batch_size,
                                             shuffle=False)
  dataset = learner_input.local_dataset(steps)
  callbacks = _callback_list(model, callbacks, verbose, 1, steps)
  predict_step = _local_steps(model, model.predict_step)
  model.stop_predicting = False
  callbacks.on_predict_begin()
  outputs = []
  for step, batch in enumerate(dataset):
    callbacks.on_predict_batch_begin(step)
    batch_outputs = predict_step(batch)
    outputs.append(tf.nest.map_structure(np.asarray, batch_outputs))
    callbacks.on_predict_batch_end(step, {"outputs": batch_outputs})
    if model.stop_predicting:
      break
  callbacks.on_predict_end()
  if not outputs:
    raise ValueError("predict got no data: the input is empty.")
  return tf.nest.map_structure(lambda *parts: np.concatenate(parts),
                               *outputs)
