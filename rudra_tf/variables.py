"""Parameter-server variables whose reads inside a training step see a pull.

`RudraStrategy` wraps every variable it places on a ps task in a
`RudraVariable` (a `ps_values.CachingVariable`, which TF's own
ParameterServerStrategy wraps every variable in). Outside a pull a
`RudraVariable` reads like the variable it wraps. While a training step runs,
`pull_scope` makes each read of a pulled (trainable) variable return the value
read, together with its shard's timestamp, under the shard's lock: the forward
pass sees one consistent version of the weights, and the push carries that
version's timestamp.

Gradients still reach the variable: the pulled value is recorded on the
gradient tape as a read of the variable, exactly as TensorFlow records its
own variable reads (`ReadVariableOp` with an identity gradient), so a step
reads each weight once, from its pull, and never reads the live variable.
"""

import contextlib
import threading

import tensorflow as tf

from rudra_tf import tf_hooks

_state = threading.local()


class PulledWeights:
  """The tensors of one pull: per-variable snapshots and per-shard timestamps.

  Attributes:
    snapshots: maps `id(RudraVariable)` to its snapshot tensor (unpacked on
      the learner from the shard's one packed transfer).
    timestamps: maps a shard's index to the timestamp read with it (a
      tensor on that shard's ps task, where the push uses it).
    push_key: the closure's `coordinator.PushKey`, or None (no
      de-duplication).
    learner: the index of the learner that pulled (an int64 tensor).
    incarnation: hardsync: that learner's incarnation (an int64 tensor).
    plan: in a scheduled function's probing trace, its
      `coordinator.StepPlan` (nothing was pulled: reads are live, and a
      push only builds the optimizer and marks the plan `pushed`); else
      None.
  """

  def __init__(self):
    self.snapshots = {}
    self.timestamps = {}
    self.push_key = None
    self.learner = None
    self.incarnation = None
    self.plan = None

  @classmethod
  def probe(cls, plan):
    """The empty pull of a probing trace (see `plan` above)."""
    pulled = cls()
    pulled.plan = plan
    return pulled


def _stack():
  if not hasattr(_state, "stack"):
    _state.stack = []
  return _state.stack


def current_pull():
  """The innermost active `PulledWeights`, or None (live reads)."""
  stack = _stack()
  return stack[-1] if stack else None


@contextlib.contextmanager
def pull_scope(pulled):
  """Reads of pulled variables inside this scope return `pulled`'s values."""
  _stack().append(pulled)
  try:
    yield pulled
  finally:
    _stack().pop()


@contextlib.contextmanager
def live_reads():
  """Reads inside this scope see the live variables (used by the push)."""
  with pull_scope(None):
    yield


class RudraVariable(tf_hooks.CachingVariable):
  """A ps variable whose reads return the current pull's snapshot, if any."""

  def _pulled_value(self):
    pulled = current_pull()
    if pulled is None:
      return None
    snapshot = pulled.snapshots.get(id(self))
    if snapshot is None:
      return None
    # Recorded at every read, not cached: a read inside a loop or cond body
    # must record its own tape entry in that body's graph.
    value = tf.identity(snapshot)
    tf_hooks.record_variable_read(tf_hooks.wrapped_variable(self), value)
    return value

  def value(self):
    pulled = self._pulled_value()
    return super().value() if pulled is None else pulled

  def read_value(self):
    pulled = self._pulled_value()
    return super().read_value() if pulled is None else tf.identity(pulled)

  def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
    pulled = self._pulled_value()
    if pulled is None:
      return super()._dense_var_to_tensor(dtype=dtype, name=name,
                                          as_ref=as_ref)
    if dtype is not None and not dtype.is_compatible_with(pulled.dtype):
      raise ValueError(
          f"Incompatible type conversion requested to type {dtype.name} for "
          f"variable {self.name} of type {pulled.dtype.name}.")
    return pulled

  def sparse_read(self, indices, name=None):
    """Rows at `indices` (an embedding lookup): from the pull, if any."""
    pulled = current_pull()
    if pulled is None or id(self) not in pulled.snapshots:
      return super().sparse_read(indices, name=name)
    # tf.nn.embedding_lookup colocates the lookup with the variable (a ps
    # task); a pulled lookup runs on the learner, where the snapshot is.
    with tf_hooks.colocated_with_nothing():
      return tf.gather(self._pulled_value(), indices, name=name)

  def live_read(self):
    """Reads the wrapped variable, ignoring any pull (for the ps side)."""
    return tf_hooks.wrapped_variable(self).read_value()
