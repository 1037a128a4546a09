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
# Push keys a shard remembers, to refuse a re-run closure's pushes: a closure
# that TF re-runs is put back at the front of the queue, so its keys come
# back within about λ closures; 1024 slots leave a wide margin.
PUSH_KEY_SLOTS = 1024


def _read_slot(variable, slot):
  return tf.raw_ops.ResourceGather(resource=variable.handle, indices=slot,
                                   dtype=_INT)


def _on_device(push_key):
  """A copy of a PushKey whose tensors were copied to the current device."""
  return type(push_key)(tf.identity(push_key.key),
                        tf.identity(push_key.limit))


def _write_slot(variable, slot, value):
  return tf.raw_ops.ResourceScatterUpdate(resource=variable.handle,
                                          indices=slot, updates=value)


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
    return tf.nest.map_structure(tf.identity, result)


class ShardState(tf.__internal__.tracking.AutoTrackable):
  """Clock, accumulators, statistics and lock of one parameter-server shard.

  Created eagerly under the strategy's scope; `pull` and `push` build graph
  code inside a traced training step.

  Checkpointed: timestamp, pending, counts (received, histogram, staleness
  sum, gradients per learner), dropped, duplicates, staleness_max and the
  accumulators (so pending
  gradients survive a restore). Not checkpointed: the lock, the hardsync
  token queue (`refill_tokens` rebuilds it from `pending`) and the push keys
  seen (a restored run schedules new closures, with new keys).
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
      self.dropped = counter("dropped")
      self.duplicates = counter("duplicates")
      # What each received gradient adds, in ONE variable so that one op
      # records it all: [received, staleness sum, histogram (bins),
      # gradients per learner (λ)]. A step that TensorFlow aborts half-way
      # (a learner died) then records all of it or none of it.
      self.counts = counter("counts", (2 + bins + protocol.num_learners,))
      self.staleness_max = counter("staleness_max")
      self.accumulators = [
          tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                      name=f"rudra/shard_{index}/accumulator_{i}")
          for i, v in enumerate(model_variables)]
      self._seen_keys = self._no_dependency(tf.Variable(
          tf.fill([PUSH_KEY_SLOTS], tf.constant(-1, _INT)), trainable=False,
          name=f"rudra/shard_{index}/seen_keys"))
      self._seen_counts = self._no_dependency(counter(
          "seen_counts", (PUSH_KEY_SLOTS,)))
      # Hardsync: tokens each learner holds (pulled, not yet pushed), and
      # each learner's incarnation (+1 each time the chief saw it die).
      self._holding = self._no_dependency(counter(
          "holding", (protocol.num_learners,)))
      self._incarnations = self._no_dependency(counter(
          "incarnations", (protocol.num_learners,)))
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

  def release_learner(self, learner):
    """Gives back the tokens a dead learner held (eager, on the chief).

    A hardsync learner that dies between its pull and its push would leave
    its round one gradient short forever; TensorFlow re-runs its closure on
    another learner, which needs that token to pull the same version. The
    learner's incarnation goes up too: what its dead incarnation still runs
    on this ps (a pull waiting for a token, a push whose bytes had arrived)
    is refused, its token given back (see `_stale`). Returns the number of
    tokens given back.
    """
    if self._tokens is None:
      return 0
    def release():
      held = tf.maximum(_read_slot(self._holding, learner), 0)
      _write_slot(self._holding, learner, tf.constant(0, _INT))
      _write_slot(self._incarnations, learner,
                  _read_slot(self._incarnations, learner) + 1)
      with tf.control_dependencies([held]):
        self._tokens.enqueue_many([tf.zeros([held], tf.int32)])
      return tf.identity(held)
    with tf.device(self.device):
      held = self._lock.execute(lambda: _after_all_ops(release),
                                exclusive_resource_access=False)
    return int(held.numpy())

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
        learner = (None if pulled.learner is None
                   else tf.identity(pulled.learner))  # on the ps, unlocked
        incarnation = (None if pulled.incarnation is None
                       else tf.identity(pulled.incarnation))
        def hold_and_read():
          if learner is not None and incarnation is not None:
            # A dead incarnation's pull gives its token straight back.
            tf.cond(self._stale(learner, incarnation),
                    lambda: _after_all_ops(self._give_back_token),
                    lambda: _after_all_ops(lambda: self._hold(learner, 1)))
          else:
            self._hold(learner, 1)
          return read()
        if self._tokens is not None:  # hardsync: record who holds a token
          with tf.control_dependencies([t for t in (learner, incarnation)
                                        if t is not None]):
            values = self._lock.execute(
                lambda: _after_all_ops(hold_and_read),
                exclusive_resource_access=False)
        elif consistent:
          values = self._lock.execute(read, exclusive_resource_access=False)
        else:
          values = read()
    values = [tf.stop_gradient(v) for v in values]
    pulled.timestamps[self.index] = values[0]
    for variable, snapshot in zip(self._model_variables, values[1:]):
      pulled.snapshots[id(variable)] = snapshot

  # -------------------------------------------------------------------- push
  def push(self, grads_and_vars, pulled_timestamp, apply_update, lr_policy,
           max_staleness, consistent=True, push_key=None, learner=None,
           incarnation=None):
    """Records one learner's gradient for this shard (graph code).

    Args:
      grads_and_vars: dense (gradient, variable) pairs of this shard's
        variables; a variable missing from the list contributes zero.
      pulled_timestamp: the shard timestamp the gradient was computed at.
      apply_update: fn(list of (mean gradient, variable), timestamp) that
        applies one update with the inner optimizer; called inside the lock.
      lr_policy: the StalenessAwareOptimizer's lr_policy.
      max_staleness: None, or the largest staleness that is accepted.
      consistent: False lets async (c = 1, no barrier) apply the update
        outside the lock, as stock ParameterServerStrategy does: the clock,
        σ and the counters stay exact (they are still updated under the
        lock), but concurrent updates may interleave (Hogwild-style), so a
        pull may see a timestamp whose update is still being applied.
      push_key: the closure's `coordinator.PushKey`, or None: a push beyond
        the key's limit (a re-run closure's) is counted as a duplicate and
        changes nothing else.
      learner: the pushing learner's index (an int64 tensor), or None; each
        received gradient is counted per learner.
      incarnation: hardsync only: the learner's incarnation when its closure
        was dispatched (an int64 tensor), or None.

    Returns:
      The staleness of this gradient (an int64 scalar; -1 for a duplicate).
    """
    c = self._protocol.gradients_per_update
    # Everything the learner sends is copied to the ps before the lock is
    # taken: the lock is never held while bytes travel, and a learner that
    # dies mid-transfer cannot leave the shard locked.
    with tf.device(self.device):
      gradient_of = {id(v): tf.identity(g) for g, v in grads_and_vars}
      arrived = list(gradient_of.values())
      if learner is not None:
        learner = tf.identity(learner)
        arrived.append(learner)
      if incarnation is not None:
        incarnation = tf.identity(incarnation)
        arrived.append(incarnation)
      if push_key is not None:
        push_key = _on_device(push_key)
        arrived += [push_key.key, push_key.limit]
    with tf.control_dependencies(arrived):
      return self._push_arrived(gradient_of, pulled_timestamp, apply_update,
                                lr_policy, max_staleness, consistent,
                                push_key, learner, incarnation)

  def _push_arrived(self, gradient_of, pulled_timestamp, apply_update,
                    lr_policy, max_staleness, consistent, push_key, learner,
                    incarnation):
    """`push` once its inputs are on the ps (graph code)."""
    c = self._protocol.gradients_per_update

    def update():
      timestamp = self.timestamp.live_read()
      staleness = timestamp - pulled_timestamp
      self._count(staleness, learner)

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
      if not consistent and c == 1 and self._tokens is None:
        return self._push_unlocked(gradient_of, pulled_timestamp, apply_update,
                                   lr_policy, max_staleness, push_key,
                                   learner)
      return self._lock.execute(
          lambda: _after_all_ops(
              lambda: self._once_per_key(push_key, update, learner,
                                         incarnation)),
          exclusive_resource_access=False)

  def _hold(self, learner, change):
    """Hardsync: learner's held tokens += change (inside the lock)."""
    if learner is None:
      return tf.constant(True)
    held = _read_slot(self._holding, learner)
    _write_slot(self._holding, learner, tf.maximum(held + change, 0))
    return tf.constant(True)

  def _give_back_token(self):
    self._tokens.enqueue_many([tf.zeros([1], tf.int32)])
    return tf.constant(True)

  def _stale(self, learner, incarnation):
    """True for a step of a learner incarnation the chief saw die."""
    return tf.not_equal(_read_slot(self._incarnations, learner), incarnation)

  def _once_per_key(self, push_key, deliver, learner=None, incarnation=None):
    """Runs `deliver()` unless the push is a duplicate (inside the lock).

    Returns deliver()'s int64 result, or -1 for a counted duplicate. Under
    hardsync the push gives up the learner's token; a duplicate's token goes
    back to the queue, for another pull of this round. A push of a dead
    learner incarnation is refused as a duplicate (its closure runs again
    elsewhere), and gives back nothing: its token was already released.
    """
    if self._tokens is not None and learner is not None and \
        incarnation is not None:
      return tf.cond(
          self._stale(learner, incarnation),
          lambda: _after_all_ops(
              lambda: self.duplicates.assign_add(1) * 0 - 1),
          lambda: _after_all_ops(lambda: self._once_per_key(
              push_key, deliver, learner)))
    if self._tokens is not None:
      self._hold(learner, -1)
    if push_key is None:
      return deliver()
    key, limit = push_key.key, push_key.limit
    slot = key % PUSH_KEY_SLOTS
    seen_count = _read_slot(self._seen_counts, slot)
    same_key = tf.equal(_read_slot(self._seen_keys, slot), key)
    fresh = (limit < 0) | tf.logical_not(same_key) | (seen_count < limit)
    count = tf.where(same_key, seen_count + 1, tf.ones_like(seen_count))
    def remember():
      _write_slot(self._seen_keys, slot, key)
      _write_slot(self._seen_counts, slot, count)
      return deliver()
    def refuse():
      if self._tokens is not None:
        self._give_back_token()
      return self.duplicates.assign_add(1) * 0 - 1
    return tf.cond(fresh, lambda: _after_all_ops(remember),
                   lambda: _after_all_ops(refuse))

  def _count(self, staleness, learner):
    """Counts one received gradient of staleness σ (inside the lock)."""
    num_learners = self._protocol.num_learners
    per_learner = (tf.zeros([num_learners], _INT) if learner is None else
                   tf.one_hot(learner, num_learners, dtype=_INT))
    bin_index = tf.minimum(staleness, self._bins - 1)
    self.counts.assign_add(tf.concat([
        tf.stack([tf.constant(1, _INT), staleness]),
        tf.one_hot(bin_index, self._bins, dtype=_INT), per_learner], 0))
    self.staleness_max.assign(
        tf.maximum(self.staleness_max.live_read(), staleness))

  def _push_unlocked(self, gradient_of, pulled_timestamp, apply_update,
                     lr_policy, max_staleness, push_key, learner):
    """Async fast path: clock and counters under the lock, update outside.

    The lock section reserves the update's version (timestamp + 1) and
    counts the gradient; the weights are then updated without the lock.
    """
    def locked():
      timestamp = self.timestamp.live_read()
      staleness = timestamp - pulled_timestamp
      def reserve():
        self._count(staleness, learner)
        accepted = (tf.constant(True) if max_staleness is None else
                    protocol_lib.accepts_gradient(staleness, max_staleness))
        with tf.control_dependencies([timestamp]):
          self.timestamp.assign_add(tf.cast(accepted, _INT))
          self.dropped.assign_add(1 - tf.cast(accepted, _INT))
        return tf.cast(accepted, _INT)
      accepted = self._once_per_key(push_key, reserve)
      return staleness, accepted > 0, timestamp

    staleness, accepted, timestamp = self._lock.execute(
        lambda: _after_all_ops(locked), exclusive_resource_access=False)

    def apply():
      weight = protocol_lib.staleness_weight(
          lr_policy, tf.cast(staleness, tf.float32), maximum=tf.maximum)
      gradients = self._weighted(weight, gradient_of)
      apply_update(gradients, timestamp)
      with tf.control_dependencies([g for g, _ in gradients]):
        return tf.constant(True)

    if max_staleness is None and push_key is None:
      _after_all_ops(apply)
    else:
      tf.cond(accepted, lambda: _after_all_ops(apply),
              lambda: tf.constant(False))
    return staleness

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
    return self._apply_and_advance(apply_update,
                                   self._weighted(weight, gradient_of))

  def _weighted(self, weight, gradient_of):
    """(weight * gradient, variable) for every variable (zero if absent)."""
    gradients = []
    for variable in self._model_variables:
      gradient = gradient_of.get(id(variable))
      gradients.append((tf.zeros(variable.shape, variable.dtype)
                        if gradient is None else
                        tf.cast(weight, gradient.dtype) * gradient, variable))
    return gradients

  def _apply_and_advance(self, apply_update, gradients, reset=lambda: None):
    """Applies `gradients`, then `reset()`, clock + 1 and λ hardsync tokens
    (after the gradients and the timestamp the update read)."""
    timestamp = self.timestamp.live_read()
    apply_update(gradients, timestamp)
    with tf.control_dependencies([g for g, _ in gradients] + [timestamp]):
      reset()
      self.timestamp.assign_add(1)
      if self._tokens is not None:
        self._tokens.enqueue_many(
            [tf.zeros([self._protocol.num_learners], tf.int32)])
    return tf.constant(True)

  # ------------------------------------------------------------------ report
  def read_statistics(self):
    """Eager, consistent read of the counters (under the lock).

    Returns the arguments of `report.ShardReport.from_counters`.
    """
    def read():
      return [self.timestamp.live_read(), self.pending.live_read(),
              self.counts.live_read(), self.dropped.live_read(),
              self.staleness_max.live_read(), self.duplicates.live_read()]
    with tf.device(self.device):
      values = self._lock.execute(read, exclusive_resource_access=False)
    timestamp, pending, counts, dropped, staleness_max, duplicates = [
        v.numpy() for v in values]
    bins = self._bins
    return [timestamp, pending, counts[0], dropped, counts[1], staleness_max,
            counts[2:2 + bins], duplicates, counts[2 + bins:]]
