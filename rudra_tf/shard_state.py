"""Per-shard protocol state on one parameter-server task, and its transport.

Rudra's parameter-server shards share no synchronization (paper.md, System):
each ps task that holds trainable variables gets one `ShardState` with its own
clock (timestamp), lock, gradient accumulators and staleness statistics. A
learner pulls each shard's weights with that shard's timestamp and pushes each
shard's gradients with the timestamp it pulled.

Everything that reads or writes the protocol state of a shard runs inside the
shard's `tf.CriticalSection` on the shard's ps task: without it the exact
invariants were seen to break (../shared/tf-notes.md). The invariant, after any
sequence of pushes:

    timestamp * c + pending == received - dropped

The protocol rules themselves come from `protocol.py`.
"""

import tensorflow as tf

from rudra_tf import protocol as protocol_lib
from rudra_tf import variables as variables_lib

_INT = tf.int64


def _after_all_ops(fn):
  """Runs graph code `fn` and returns its result once every op it made ran.

  `CriticalSection.execute` releases the lock as soon as the tensors its
  function returns are ready; stateful ops the result does not depend on
  (an update inside `tf.cond`, a counter) could still run after the release.
  Chaining the result after every created op keeps them all inside the lock.
  """
  graph = tf.compat.v1.get_default_graph()
  existing = set(graph.get_operations())
  result = fn()
  created = [op for op in graph.get_operations() if op not in existing]
  with tf.control_dependencies(created):
    return tf.identity(result)


class ShardState(tf.__internal__.tracking.AutoTrackable):
  """Clock, accumulators, statistics and lock of one parameter-server shard.

  Created eagerly under the strategy's scope; `pull` and `push` build graph
  code inside a traced training step.

  Checkpointed: timestamp, pending, received, dropped, histogram,
  staleness_sum, staleness_max and the accumulators (so pending gradients
  survive a restore). Not checkpointed: the lock and the hardsync token queue,
  which `refill_tokens` rebuilds from `pending`.
  """

  def __init__(self, strategy, index, model_variables, protocol, bins):
    self.index = index
    self._protocol = protocol
    self._bins = bins
    anchor = model_variables[0]
    self.device = anchor.device
    self._model_variables = self._no_dependency(list(model_variables))
    with strategy.extended.colocate_vars_with(anchor):
      def counter(name, shape=()):
        return tf.Variable(tf.zeros(shape, _INT), trainable=False,
                           name=f"rudra/shard_{index}/{name}")
      self.timestamp = counter("timestamp")
      self.pending = counter("pending")
      self.received = counter("received")
      self.dropped = counter("dropped")
      self.staleness_sum = counter("staleness_sum")
      self.staleness_max = counter("staleness_max")
      self.histogram = counter("histogram", (bins,))
      self.accumulators = [
          tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                      name=f"rudra/shard_{index}/accumulator_{i}")
          for i, v in enumerate(model_variables)]
    with tf.device(self.device):
      self._lock = tf.CriticalSection(name=f"rudra_shard_{index}_lock")
      self._tokens = None
      if protocol.barrier:
        self._tokens = tf.queue.FIFOQueue(
            capacity=protocol.num_learners, dtypes=[tf.int32], shapes=[[]],
            name=f"rudra_shard_{index}_tokens")
    self._accumulator_of = self._no_dependency(
        {id(v): a for v, a in zip(model_variables, self.accumulators)})

  def owns(self, variable):
    return id(variable) in self._accumulator_of

  # ---------------------------------------------------------------- hardsync
  def refill_tokens(self):
    """Puts λ - pending pull tokens in the hardsync barrier queue (eager).

    A token is one pull allowed in the current round; exactly λ pulls read
    each version, and the update that consumes their λ gradients refills λ.
    Gradients already pending hold their token, hence λ - pending.
    """
    if self._tokens is None:
      return
    missing = self._protocol.num_learners - int(self.pending.numpy())
    stored = int(self._tokens.size().numpy())
    if missing > stored:
      self._tokens.enqueue_many([tf.zeros([missing - stored], tf.int32)])

  # -------------------------------------------------------------------- pull
  def pull(self, pulled, consistent=True):
    """Adds this shard's snapshots and timestamp to `pulled` (graph code)."""
    with tf.device(self.device):
      dependencies = []
      if self._tokens is not None:
        dependencies.append(self._tokens.dequeue())
      with tf.control_dependencies(dependencies):
        def read():
          return [self.timestamp.live_read()] + [
              tf.identity(v.live_read()) for v in self._model_variables]
        if consistent:
          values = self._lock.execute(read, exclusive_resource_access=False)
        else:
          values = read()
    values = [tf.stop_gradient(v) for v in values]
    pulled.timestamps[self.index] = values[0]
    for variable, snapshot in zip(self._model_variables, values[1:]):
      pulled.snapshots[id(variable)] = snapshot

  # -------------------------------------------------------------------- push
  def push(self, grads_and_vars, pulled_timestamp, apply_update, lr_policy,
           max_staleness):
    """Records one learner's gradient for this shard (graph code).

    Args:
      grads_and_vars: dense (gradient, variable) pairs of this shard's
        variables; a variable missing from the list contributes zero.
      pulled_timestamp: the shard timestamp the gradient was computed at.
      apply_update: fn(list of (mean gradient, variable), timestamp) that
        applies one update with the inner optimizer; called inside the lock.
      lr_policy: the StalenessAwareOptimizer's lr_policy.
      max_staleness: None, or the largest staleness that is accepted.

    Returns:
      The staleness of this gradient (an int64 scalar).
    """
    c = self._protocol.gradients_per_update
    gradient_of = {id(v): g for g, v in grads_and_vars}

    def update():
      timestamp = self.timestamp.live_read()
      staleness = timestamp - pulled_timestamp
      bin_index = tf.minimum(staleness, self._bins - 1)
      self.received.assign_add(1)
      self.histogram.assign_add(tf.one_hot(bin_index, self._bins, dtype=_INT))
      self.staleness_sum.assign_add(staleness)
      self.staleness_max.assign(
          tf.maximum(self.staleness_max.live_read(), staleness))

      def accumulate():
        weight = protocol_lib.staleness_weight(
            lr_policy, tf.cast(staleness, tf.float32), maximum=tf.maximum)
        if c == 1:  # async: the update is this gradient; no accumulator trip
          return self._apply_one(apply_update, weight, gradient_of)
        for variable in self._model_variables:
          gradient = gradient_of.get(id(variable))
          if gradient is not None:
            self._accumulator_of[id(variable)].assign_add(
                tf.cast(weight, gradient.dtype) * gradient)
        count = self.pending.assign_add(1)
        return tf.cond(
            count >= c,
            lambda: _after_all_ops(lambda: self._apply(apply_update, c)),
            lambda: tf.constant(False))

      if max_staleness is None:
        _after_all_ops(accumulate)
      else:
        tf.cond(protocol_lib.accepts_gradient(staleness, max_staleness),
                lambda: _after_all_ops(accumulate),
                lambda: _after_all_ops(
                    lambda: self.dropped.assign_add(1) > 0))
      return staleness

    with tf.device(self.device), variables_lib.live_reads():
      return self._lock.execute(lambda: _after_all_ops(update),
                                exclusive_resource_access=False)

  def _apply(self, apply_update, c):
    """One update: mean of the accumulated gradients, clock + 1, reset."""
    mean_gradients = [
        (accumulator.live_read() / tf.cast(c, accumulator.dtype), variable)
        for variable, accumulator in zip(self._model_variables,
                                         self.accumulators)]
    def reset():
      for accumulator in self.accumulators:
        accumulator.assign(tf.zeros_like(accumulator))
      self.pending.assign(0)
    return self._apply_and_advance(apply_update, mean_gradients, reset)

  def _apply_one(self, apply_update, weight, gradient_of):
    """c = 1: applies weight * gradient at once, clock + 1 (as `_apply`)."""
    gradients = []
    for variable in self._model_variables:
      gradient = gradient_of.get(id(variable))
      gradients.append((tf.zeros(variable.shape, variable.dtype)
                        if gradient is None else
                        tf.cast(weight, gradient.dtype) * gradient, variable))
    return self._apply_and_advance(apply_update, gradients)

  def _apply_and_advance(self, apply_update, gradients, reset=lambda: None):
    """Applies `gradients`, then `reset()`, clock + 1 and λ hardsync tokens
    (after the gradients and the timestamp the update read)."""
    apply_update(gradients, self.timestamp)
    with tf.control_dependencies(
        [g for g, _ in gradients] + [self.timestamp.live_read()]):
      reset()
      self.timestamp.assign_add(1)
      if self._tokens is not None:
        self._tokens.enqueue_many(
            [tf.zeros([self._protocol.num_learners], tf.int32)])
    return tf.constant(True)

  # ------------------------------------------------------------------ report
  def read_statistics(self):
    """Eager, consistent read of the counters (under the lock)."""
    def read():
      return [self.timestamp.live_read(), self.pending.live_read(),
              self.received.live_read(), self.dropped.live_read(),
              self.staleness_sum.live_read(), self.staleness_max.live_read(),
              self.histogram.live_read()]
    with tf.device(self.device):
      values = self._lock.execute(read, exclusive_resource_access=False)
    return [v.numpy() for v in values]
