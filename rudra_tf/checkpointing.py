"""Checkpoints inside an epoch, and fit resumed from the middle of one.

A checkpoint taken while closures run would hold a shard in the middle of
pushes that other shards or the data position do not reflect. So
`PeriodicCheckpoint` first drains the coordinator (`join`: every scheduled
step has pushed, none is in flight), then saves: the saved counters are then
exact, and the checkpoint's number is the count of steps trained, over every
epoch and every run resumed from (TensorFlow's own "global step" naming:
`ckpt-1700`). A resumed run reads that number back and trains exactly the
steps that are left (`fit_from`): no step trained twice, none skipped.

    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model, optimizer=model.optimizer),
        "ckpts", max_to_keep=3)
    if manager.latest_checkpoint:
      manager.checkpoint.restore(manager.latest_checkpoint)
    rudra_tf.checkpointing.fit_from(
        model, dataset, steps_done=rudra_tf.checkpointing.steps_done(
            manager.latest_checkpoint),
        epochs=10, steps_per_epoch=1500,
        callbacks=[rudra_tf.PeriodicCheckpoint(manager, every_steps=300)])

tf_keras calls a callback's batch hooks as it schedules each closure, and
under a parameter-server strategy it schedules a whole epoch at once, long
before the learners have run it. With `every_secs`, the callback therefore
keeps the chief at most `SCHEDULED_AHEAD_PER_LEARNER` closures per learner
ahead of the learners (it waits for the oldest one's result), so that the
clock it reads tracks training, not scheduling.
"""

import collections
import re
import time

import tensorflow as tf
import tf_keras

from rudra_tf import tf_hooks

# Closures per learner the chief may schedule ahead of the finished ones
# when checkpoints are timed: enough that no learner waits for its next one.
SCHEDULED_AHEAD_PER_LEARNER = 4


def steps_done(checkpoint_path):
  """The steps trained when `checkpoint_path` was saved (its number), or 0
  for None (no checkpoint yet)."""
  if checkpoint_path is None:
    return 0
  match = re.search(r"-(\d+)$", checkpoint_path)
  if not match:
    raise ValueError(
        f"checkpoint {checkpoint_path!r} has no step number: "
        "PeriodicCheckpoint names each one <prefix>-<steps trained>.")
  return int(match.group(1))


def position(steps, steps_per_epoch):
  """(epoch, step within it) after `steps` steps: both from 0."""
  return divmod(steps, steps_per_epoch)


def fit_segments(steps_done, epochs, steps_per_epoch):
  """The `fit` arguments that train the steps left after `steps_done`.

  A checkpoint from the middle of an epoch first gets the rest of that epoch
  (a `fit` of its remaining steps, numbered as that epoch), then whole
  epochs: a list of dicts of initial_epoch, epochs and steps_per_epoch.
  """
  epoch, step = position(steps_done, steps_per_epoch)
  segments = []
  if step and epoch < epochs:
    segments.append(dict(initial_epoch=epoch, epochs=epoch + 1,
                         steps_per_epoch=steps_per_epoch - step))
    epoch += 1
  if epoch < epochs:
    segments.append(dict(initial_epoch=epoch, epochs=epochs,
                         steps_per_epoch=steps_per_epoch))
  return segments


def fit_from(model, x=None, *, steps_done, epochs, steps_per_epoch,
             **fit_kwargs):
  """Trains the `epochs * steps_per_epoch - steps_done` steps that are left
  (`fit_segments`); stops early when a callback stops training. Returns the
  History of each `fit` call."""
  histories = []
  for segment in fit_segments(steps_done, epochs, steps_per_epoch):
    histories.append(model.fit(x, **segment, **fit_kwargs))
    if model.stop_training:  # EarlyStopping, a diverged loss, ...
      break
  return histories


def _positive_or_none(name, value, kind):
  if value is None:
    return None
  if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
    raise ValueError(f"{name} must be None or a positive number, got "
                     f"{value!r}.")
  return value


class PeriodicCheckpoint(tf_keras.callbacks.Callback):
  """Saves a checkpoint every `every_steps` steps or `every_secs` seconds.

  Each save drains the coordinator first (module doc) and is numbered with
  the steps trained so far; at each epoch's end it saves too (unless
  `at_epoch_end=False`). Under a parameter-server strategy a batch-level
  callback must accept remote values: this one reads none.

  Args:
    manager: the `tf.train.CheckpointManager` to save with.
    every_steps: save whenever the steps trained reach a multiple of it.
    every_secs: save when this many seconds passed since the last save.
    at_epoch_end: also save after every epoch.
    initial_steps: the steps trained before this fit (default: the number
      of the manager's latest checkpoint, which the caller restored).
    out: fn(line) told of each save, or None.
  """

  def __init__(self, manager, every_steps=None, every_secs=None,
               at_epoch_end=True, initial_steps=None, out=None):
    super().__init__()
    # Batch hooks get the step's remote values as they are: tf_keras allows
    # them under a parameter-server strategy only then, and fetching them
    # would make the chief wait for every step.
    self._supports_tf_logs = True
    if not isinstance(manager, tf.train.CheckpointManager):
      raise ValueError("PeriodicCheckpoint needs a tf.train.CheckpointManager,"
                       f" got {type(manager).__name__}.")
    self._manager = manager
    self._every_steps = _positive_or_none("every_steps", every_steps, int)
    self._every_secs = _positive_or_none("every_secs", every_secs,
                                         (int, float))
    self._at_epoch_end = at_epoch_end
    self._steps = (steps_done(manager.latest_checkpoint)
                   if initial_steps is None else initial_steps)
    self._saved_steps = self._steps
    self._saved_at = time.monotonic()
    self._epoch_base = self._steps
    self._out = out
    self._in_flight = collections.deque()
    self._coordinator = None

  @property
  def steps(self):
    """Steps trained so far (as of the last batch hook)."""
    return self._steps

  def on_train_begin(self, logs=None):
    strategy = self.model.distribute_strategy
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
      # The strategy's one coordinator (the constructor returns it).
      self._coordinator = (
          tf.distribute.experimental.coordinator.ClusterCoordinator(strategy))
    self._saved_at = time.monotonic()

  def on_epoch_begin(self, epoch, logs=None):
    self._epoch_base = self._steps

  def on_train_batch_end(self, batch, logs=None):
    self._steps = self._epoch_base + batch + 1
    if self._every_secs is not None:
      self._keep_close_to_the_learners(logs)
    if self._due():
      self._save()

  def on_epoch_end(self, epoch, logs=None):
    self._steps = self._epoch_base + self.params["steps"]
    if self._at_epoch_end and self._steps != self._saved_steps:
      self._save()

  def _due(self):
    if self._every_steps is not None and (
        self._steps // self._every_steps >
        self._saved_steps // self._every_steps):
      return True
    return (self._every_secs is not None and
            time.monotonic() - self._saved_at >= self._every_secs)

  def _keep_close_to_the_learners(self, logs):
    if self._coordinator is None or logs is None:
      return
    self._in_flight.append(logs)
    strategy = self.model.distribute_strategy
    learners = getattr(strategy, "num_learners", None) or (
        tf_hooks.num_workers(strategy))
    ahead = SCHEDULED_AHEAD_PER_LEARNER * learners
    while len(self._in_flight) > ahead:
      for value in tf.nest.flatten(self._in_flight.popleft()):
        if hasattr(value, "fetch"):
          value.fetch()  # waits until that step has run

  def _save(self):
    if self._coordinator is not None:
      self._coordinator.join()
    self._in_flight.clear()
    path = self._manager.save(checkpoint_number=self._steps)
    self._saved_steps, self._saved_at = self._steps, time.monotonic()
    if self._out is not None:
      self._out(f"saved {path} ({self._steps} steps trained)")
