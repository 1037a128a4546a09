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

One ledger, one write (ledger.py): every counter of a shard (clock,
pending, received, histogram, hardsync tokens, the push keys seen, ...)
lives in one int64 vector, and each locked section changes it with exactly
one write computed from one read, so a section TensorFlow cuts short either
happened entirely, as far as the counters go, or not at all. The ledger is
written before the gradient touches the weights: a cut after the write loses
(part of) that one gradient, and a cut before it leaves nothing recorded, so
TensorFlow's re-run of the closure delivers it. A re-run's pushes that the
first run had delivered are refused (push_keys.py). No gradient is applied
twice, and the invariant above holds exactly.

The protocol rules themselves come from `protocol.py`; what a push does to
the counters from `transition.py` and what it does to hardsync's tokens from
`barrier.py` (pure functions the simulator calls too); the ledger's layout
and its one write from `ledger.py`.
"""

import threading

import tensorflow as tf

from rudra_tf import barrier
from rudra_tf import ledger as ledger_lib
from rudra_tf import packing
from rudra_tf import push_keys
from rudra_tf import push_trace
from rudra_tf import sparse
from rudra_tf import tf_hooks
from rudra_tf import transition
from rudra_tf import variables as variables_lib

_INT = ledger_lib.INT
# transition.py's operations on the ledger's int64 tensors.
_TENSOR_OPS = transition.Ops(tf.logical_and, tf.logical_not, tf.maximum,
                             tf.minimum, ledger_lib.one)
# Spare hardsync wake-ups rung when a learner dies: a wake-up the dead
# learner had taken without recording it is lost with it; spares only cost
# a waiting pull one more look at the ledger.
_SPARE_WAKEUPS_PER_LEARNER = 1


def _learner_or_unknown(learner):
  """The learner index for a trace line; -1 where no learner is known."""
  return tf.constant(-1, _INT) if learner is None else learner


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


class _Corrected:
  """A push's gradients, to be corrected once accepted (`push`'s
  `correct`): `at` gives them corrected, by variable id; called inside the
  lock, where θ_now is the live value."""

  def __init__(self, gradient_of, pulled_of, correct):
    self._gradient_of = gradient_of
    self._pulled_of = pulled_of
    self._correct = correct

  def at(self, timestamp, variables):
    return {id(v): self._correct(self._gradient_of[id(v)], v,
                                 self._pulled_of[id(v)], timestamp)
            for v in variables if id(v) in self._gradient_of}


class ShardState(tf_hooks.AutoTrackable):
  """Clock, accumulators, statistics and lock of one parameter-server shard.

  Created eagerly under the strategy's scope; `pull` and `push` build graph
  code inside a traced training step.

  Checkpointed: the ledger (every counter, see `ledger_lib.LedgerLayout`), the
  timestamp mirror and the accumulators (so pending gradients survive a
  restore). Not checkpointed: the lock, the hardsync wake-up queue and the
  learner incarnations. Hardsync tokens are recomputed by `refill_tokens`;
  the push keys a checkpoint remembers never match a new run's keys
  (`coordinator.RudraCoordinator` starts each run's keys at a random base).
  """

  def __init__(self, strategy, index, model_variables, protocol, bins,
               incarnations=None, trace_path=None):
    self.index = index
    # push_trace.py: a line per pull and delivered push, or None.
    self._trace_path = trace_path
    self._protocol = protocol
    self._layout = ledger_lib.LedgerLayout(bins, protocol.num_learners)
    anchor = model_variables[0]
    self.device = anchor.device
    self._model_variables = self._no_dependency(list(model_variables))
    with strategy.extended.colocate_vars_with(anchor):
      self.ledger = tf.Variable(self._layout.initial(), trainable=False,
                                name=f"rudra/shard_{index}/ledger")
      # A copy of the ledger's clock for Keras (`optimizer.iterations`),
      # written with each ledger write; the ledger is what the protocol reads.
      self.timestamp = tf.Variable(tf.zeros([], _INT), trainable=False,
                                   name=f"rudra/shard_{index}/timestamp")
      self.accumulators = [
          tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                      name=f"rudra/shard_{index}/accumulator_{i}")
          for i, v in enumerate(model_variables)]
      # Hardsync: each learner's incarnation (+1 each time the chief saw it
      # die); written only by the chief. It starts at the chief's count
      # (`incarnations`), which a failed fit before these shards existed
      # (an earlier model's) has already raised.
      self._incarnations = self._no_dependency(tf.Variable(
          tf.constant(incarnations or [0] * protocol.num_learners, _INT),
          trainable=False, name=f"rudra/shard_{index}/incarnations"))
    with tf.device(self.device):
      self._lock = tf.CriticalSection(name=f"rudra_shard_{index}_lock")
      # Hardsync wake-ups: a waiting pull sleeps on this queue, then takes a
      # token from the ledger if one is available, or waits again.
      self._wakeups = None
      if protocol.barrier:
        self._wakeups = tf.queue.FIFOQueue(
            capacity=-1, dtypes=[tf.int32], shapes=[[]],
            name=f"rudra_shard_{index}_wakeups")
    # The chief's locked sections, each one tf.function (_locked_on_the_ps).
    self._sections = self._no_dependency({})
    self._sections_lock = threading.Lock()
    self._accumulator_of = self._no_dependency(
        {id(v): a for v, a in zip(model_variables, self.accumulators)})

  @property
  def model_variables(self):
    """The model variables this shard holds, in its order."""
    return list(self._model_variables)

  def owns(self, variable):
    return id(variable) in self._accumulator_of

  def _commit(self, changes):
    """The section's one ledger write (and the timestamp mirror after it)."""
    new = changes.new_value()
    write = self.ledger.assign(new, read_value=False)
    with tf.control_dependencies([write]):
      mirror = self.timestamp.assign(new[ledger_lib.LedgerLayout.TIMESTAMP],
                                     read_value=False)
    return new, [write, mirror]

  def _ring(self, count):
    """Wakes `count` waiting hardsync pulls (graph or eager)."""
    self._wakeups.enqueue_many([tf.zeros(tf.reshape(count, [1]), tf.int32)])
    return tf.constant(True)

  # ---------------------------------------------------------------- hardsync
  def refill_tokens(self):
    """Sets the hardsync tokens to λ - pending, none held (eager).

    A token is one pull allowed in the current round; exactly λ pulls read
    each version, and the update that consumes their λ gradients refills λ.
    Gradients already pending hold their token, hence λ - pending. Called
    when the shards are built and after a restore, when no learner runs.
    """
    if not self._protocol.barrier:
      return
    with tf.device(self.device):
      changes = ledger_lib.Changes(self.ledger.read_value())
      changes.add_all(self._layout, barrier.refill(
          self._layout.counters(changes.old), self._protocol.num_learners))
      new, _ = self._commit(changes)
      available = new[self._layout.position("available")]
      self._ring(tf.maximum(available - tf.cast(self._wakeups.size(), _INT),
                            0))

  def release_learner(self, learner):
    """Gives back the tokens a dead learner held (on the chief).

    A hardsync learner that dies between its pull and its push would leave
    its round one gradient short forever; TensorFlow re-runs its closure on
    another learner, which needs that token to pull the same version. The
    learner's incarnation goes up too: what its dead incarnation still runs
    on this ps (a pull waiting for a token, a push whose bytes had arrived)
    is refused (see `_stale`). Returns the number of tokens given back.
    """
    if not self._protocol.barrier:
      return 0

    def release(learner):
      changes = ledger_lib.Changes(self.ledger.read_value())
      held, released = barrier.release(self._layout.counters(changes.old),
                                       learner, _TENSOR_OPS)
      changes.add_all(self._layout, released)
      self._commit(changes)
      self._next_incarnation(tf.reshape(learner, [1]))
      return held
    held = self._locked_on_the_ps("release", release, learner)
    with tf.device(self.device):
      self._ring(held + _SPARE_WAKEUPS_PER_LEARNER *
                 self._protocol.num_learners)
    return int(held.numpy())

  def _next_incarnation(self, learners):
    """Marks the given learners' (an int64 vector) running steps as a dead
    incarnation's (graph code, inside the lock)."""
    tf.raw_ops.ResourceScatterAdd(resource=self._incarnations.handle,
                                  indices=learners,
                                  updates=tf.ones_like(learners))

  def _locked_on_the_ps(self, name, body, *args):
    """Runs `body(*args)` (int64 scalars) under the shard's lock as ONE
    function call on the ps (chief side); returns its result.

    Eagerly, `CriticalSection.execute` holds the ps's mutex while the chief
    dispatches each op of the body one by one. TF's worker-recovery thread
    (`Context.update_server_def`) waits for the chief's ops in flight,
    among them another thread's lock op waiting for that mutex, while the
    holder's next op waits for the update: a hardsync chaos run hung there
    (two put-back closures pinning their keys at once). As one function the
    section never waits for the chief's eager context while it holds the
    lock.
    """
    with self._sections_lock:
      function = self._sections.get(name)
      if function is None:
        def locked(*tensors):
          with tf.device(self.device):
            return self._lock.execute(
                lambda: _after_all_ops(lambda: body(*tensors)),
                exclusive_resource_access=False)
        function = self._sections[name] = tf.function(
            locked, autograph=False,
            input_signature=[tf.TensorSpec([], _INT)] * len(args))
    # Not under a closure's cancellation: a failed fit's must not stop the
    # very calls that end it (tf_hooks.outside_closure_cancellation).
    with tf_hooks.outside_closure_cancellation():
      return function(*[tf.constant(arg, _INT) for arg in args])

  def retire_incarnations(self):
    """Every learner's steps so far become a dead incarnation's (on
    the chief, when no closure runs): see
    `RudraStrategy._restore_barriers_after_failure`."""
    if not self._protocol.barrier:
      return

    def retire():
      self._next_incarnation(tf.range(self._protocol.num_learners,
                                      dtype=_INT))
      return tf.constant(True)
    self._locked_on_the_ps("retire", retire)

  def open_barrier(self):
    """Lets λ more hardsync pulls through (on the chief).

    After a fit fails, TensorFlow cancels its closures and waits until every
    running one has ended. A closure cancelled between its pull and its push
    leaves its round short, and a pull waiting for that round would wait
    forever: each call makes λ more tokens available and rings λ wake-ups.
    `refill_tokens` restores exact rounds once no closure runs.
    """
    if not self._protocol.barrier:
      return
    count = self._protocol.num_learners

    def add_tokens():
      changes = ledger_lib.Changes(self.ledger.read_value())
      changes.add_all(self._layout, barrier.open_barrier(count))
      self._commit(changes)
      return tf.constant(True)
    self._locked_on_the_ps("open", add_tokens)
    with tf.device(self.device):
      self._ring(tf.constant(count, _INT))

  def pin_push_key(self, key):
    """Remembers closure `key`'s pushes until its re-run (on the chief).

    Called as TensorFlow puts a closure back for another run; see
    push_keys.py. Returns True if the key was not pinned before.
    """
    def pin(key):
      changes = ledger_lib.Changes(self.ledger.read_value())
      new = push_keys.pin(changes, self._layout, key)
      self._commit(changes)
      return new
    return bool(self._locked_on_the_ps("pin", pin, key).numpy())

  def _read_ledger(self):
    """The ledger as numpy, read under the lock (chief side)."""
    return self._locked_on_the_ps("read", self.ledger.read_value).numpy()

  def token_counts(self):
    """Hardsync tokens: (available, held by each learner), read eagerly."""
    counters = self._layout.counters(self._read_ledger())
    return int(counters.available), [int(h) for h in counters.holding]

  def _stale(self, learner, incarnation):
    """True for a step of a learner incarnation the chief saw die."""
    if learner is None or incarnation is None:
      return tf.constant(False)
    return tf.not_equal(tf.gather(self._incarnations.live_read(), learner),
                        incarnation)

  def _take_token(self, learner, incarnation, after=None):
    """Waits for a hardsync token and records it as held (graph code).

    Sleeps on the wake-up queue, then, in the lock, takes a token if one is
    available (one ledger write: available - 1, this learner's held + 1) or
    goes back to sleep. A dead incarnation's pull takes nothing and passes
    its wake-up on. `after`: a True bool tensor the wait must follow (the
    previous shard's token), or None.
    """
    def attempt():
      changes = ledger_lib.Changes(self.ledger.live_read())
      stale = self._stale(learner, incarnation)
      take, taken = barrier.take(self._layout.counters(changes.old), learner,
                                 tf.logical_not(stale), _TENSOR_OPS)
      changes.add_all(self._layout, taken)
      _, written = self._commit(changes)
      with tf.control_dependencies(written):
        tf.cond(stale, lambda: _after_all_ops(lambda: self._ring(1)),
                lambda: tf.constant(False))
      return tf.logical_or(take, stale)

    def body(done):
      # Each dequeue waits for its iteration's loop variable: an op fed only
      # by loop invariants may run ahead of the loop, and its input.
      with tf.control_dependencies([done]):
        wakeup = self._wakeups.dequeue()
      with tf.control_dependencies([wakeup]):
        return self._lock.execute(lambda: _after_all_ops(attempt),
                                  exclusive_resource_access=False)

    # Not done yet, computed from `after` so that the loop starts after it.
    start = tf.constant(False) if after is None else tf.logical_not(after)
    if self._protocol.backup and learner is not None:
      # A late learner pulls with the token it kept, without waiting: no
      # wake-up was rung for it (barrier.py).
      def reused():
        return barrier.reuse(self._layout.counters(self.ledger.live_read()),
                             learner, tf.logical_not(
                                 self._stale(learner, incarnation)),
                             _TENSOR_OPS)
      with tf.control_dependencies([start]):
        start = tf.logical_or(start, self._lock.execute(
            reused, exclusive_resource_access=False))
    return tf.while_loop(tf.logical_not, body, [start])[0]

  # -------------------------------------------------------------------- pull
  def pull(self, pulled, consistent=True, after=None):
    """Adds this shard's snapshots and timestamp to `pulled` (graph code).

    Hardsync: the token is taken once `after` (the previous shard's taken
    token, or None) exists; returns this shard's, or None without a barrier.
    """
    taken = None
    with tf.device(self.device):
      def read():
        # One packed copy of the weights: one transfer to the learner.
        weights = [v.live_read() for v in self._model_variables]
        timestamp = self.ledger.live_read()[ledger_lib.LedgerLayout.TIMESTAMP]
        if self._trace_path:
          # The lock is released once the results are ready: the timestamp
          # waits for the trace line, so the line is written inside it.
          with tf.control_dependencies([self._trace(
              "pull", _learner_or_unknown(pulled.learner), timestamp)]):
            timestamp = tf.identity(timestamp)
        return [timestamp] + (packing.pack(weights) if weights else [])
      if self._protocol.barrier:
        # The version cannot change between the take and the read: its
        # update needs this learner's gradient.
        learner = (None if pulled.learner is None
                   else tf.identity(pulled.learner))
        incarnation = (None if pulled.incarnation is None
                       else tf.identity(pulled.incarnation))
        taken = self._take_token(learner, incarnation, after)
        with tf.control_dependencies([taken]):
          values = self._lock.execute(read, exclusive_resource_access=False)
      elif consistent:
        values = self._lock.execute(read, exclusive_resource_access=False)
      else:
        values = read()
    # The timestamp stays on the ps (only the push there uses it); the
    # weights are unpacked on the learner.
    pulled.timestamps[self.index] = values[0]
    if self._model_variables:
      snapshots = packing.unpack([tf.stop_gradient(v) for v in values[1:]],
                                 self._model_variables)
      for variable, snapshot in zip(self._model_variables, snapshots):
        pulled.snapshots[id(variable)] = snapshot
    return taken

  # -------------------------------------------------------------------- push
  def push(self, grads_and_vars, pulled_timestamp, apply_update, lr_policy,
           max_staleness, consistent=True, push_key=None, learner=None,
           incarnation=None, correct=None, pulled_weights=None):
    """Records one learner's gradient for this shard (graph code).

    Args:
      grads_and_vars: (gradient, variable) pairs of this shard's variables,
        each gradient a dense tensor or a deduplicated row gradient
        (`tf.IndexedSlices`); a variable missing from the list contributes
        zero.
      pulled_timestamp: the shard timestamp the gradient was computed at.
      apply_update: fn(list of (mean gradient, variable), timestamp) that
        applies one update with the inner optimizer; called inside the lock.
      lr_policy: the StalenessAwareOptimizer's
        `protocol.LearningRatePolicy` (each gradient's weight w(σ)).
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
      correct: None, or fn(gradient, variable, θ_pulled, timestamp) -> the
        gradient corrected by a compensation rule (compensation.py), called
        inside the lock on each accepted gradient, before its weight w(σ).
        The update is then always applied inside the lock.
      pulled_weights: with `correct`, the weights each gradient was computed
        on (θ_pulled), in the order of `grads_and_vars`, all dense: they
        travel with the push, packed with the gradients.

    Returns:
      The staleness of this gradient (an int64 scalar; -1 for a duplicate).
    """
    # Everything the learner sends is copied to the ps before the lock is
    # taken: the lock is never held while bytes travel, and a learner that
    # dies mid-transfer cannot leave the shard locked. It is packed on the
    # learner (packing.encode_push).
    dense = [(g, v) for g, v in grads_and_vars if not sparse.is_rows(g)]
    rows = [(g, v) for g, v in grads_and_vars if sparse.is_rows(g)]
    metadata = {"learner": learner, "incarnation": incarnation}
    if push_key is not None:
      metadata.update(key=push_key.key, limit=push_key.limit)
    metadata = {name: value for name, value in metadata.items()
                if value is not None}
    pulled_weights = list(pulled_weights or [])
    if pulled_weights and rows:
      raise ValueError("A compensated push sends dense gradients only.")
    sent = packing.encode_push(
        [g for g, _ in dense] + pulled_weights, [g for g, _ in rows],
        metadata)
    with tf.device(self.device):
      arrived = [tf.identity(tensor) for tensor in sent]
      gradients, row_gradients, metadata = packing.decode_push(
          arrived, [tf.TensorSpec(v.shape, g.dtype) for g, v in dense] +
          [tf.TensorSpec(v.shape, p.dtype)
           for p, (_, v) in zip(pulled_weights, dense)],
          [v.shape.as_list() for _, v in rows], list(metadata))
      gradients, pulled = (gradients[:len(dense)], gradients[len(dense):])
      gradient_of = {id(v): g for g, (_, v) in
                     zip(gradients + row_gradients, dense + rows)}
      pulled_of = {id(v): p for p, (_, v) in zip(pulled, dense)}
      learner = metadata.get("learner")
      incarnation = metadata.get("incarnation")
      if push_key is not None:
        push_key = type(push_key)(metadata["key"], metadata["limit"])
    with tf.control_dependencies(arrived), tf.device(self.device), \
        variables_lib.live_reads():
      if not consistent and self._protocol.gradients_per_update == 1 and \
          not self._protocol.barrier and correct is None:
        return self._push_unlocked(gradient_of, pulled_timestamp,
                                   apply_update, lr_policy, max_staleness,
                                   push_key, learner)
      if correct is not None:
        gradient_of = _Corrected(gradient_of, pulled_of, correct)
      return self._lock.execute(
          lambda: _after_all_ops(lambda: self._push_locked(
              gradient_of, pulled_timestamp, apply_update, lr_policy,
              max_staleness, push_key, learner, incarnation)),
          exclusive_resource_access=False)

  def _record(self, changes, pulled_timestamp, max_staleness, push_key,
              learner, incarnation):
    """A push's ledger changes (inside the lock; written by the caller).

    The protocol's transition (`transition.push`) plus the push key's
    record (push_keys.py). Returns the `transition.Push` (int64/bool
    tensors).
    """
    layout, old = self._layout, changes.old
    live = tf.constant(True)
    if self._protocol.barrier:
      live = tf.logical_not(self._stale(learner, incarnation))
    fresh = tf.constant(True)
    if push_key is not None:
      if learner is None:
        raise ValueError("A keyed push needs the pushing learner's index.")
      key_seen = push_keys.seen(layout, old, push_key.key, learner)
      fresh = push_keys.fresh(key_seen, push_key.limit)
    push = transition.push(
        layout.counters(old), pulled_timestamp, self._protocol, layout.bins,
        max_staleness=max_staleness, learner=learner, fresh=fresh, live=live,
        ops=_TENSOR_OPS)
    changes.add_all(layout, push.changes)
    if push_key is not None:
      push_keys.record(changes, layout, push_key.key, learner, key_seen,
                       push.delivered)
    if self._trace_path:
      tf.cond(push.delivered,
              lambda: self._trace("push", _learner_or_unknown(learner),
                                  pulled_timestamp, push.staleness,
                                  push.accepted),
              tf.no_op)
    return push

  def _trace(self, kind, *values):
    """One push_trace line (graph code, inside the lock)."""
    return push_trace.trace_op(self._trace_path, kind, *values)

  def _push_locked(self, gradient_of, pulled_timestamp, apply_update,
                   lr_policy, max_staleness, push_key, learner, incarnation):
    """One push inside the lock: the ledger write, then the weights."""
    c = self._protocol.gradients_per_update
    changes = ledger_lib.Changes(self.ledger.live_read())
    push = self._record(changes, pulled_timestamp, max_staleness, push_key,
                        learner, incarnation)
    _, written = self._commit(changes)
    timestamp = changes.old[ledger_lib.LedgerLayout.TIMESTAMP]
    weight = lr_policy.weight(tf.cast(push.staleness, tf.float32),
                              maximum=tf.maximum)

    def take_gradient():
      taken = (gradient_of.at(timestamp, self._model_variables)
               if isinstance(gradient_of, _Corrected) else gradient_of)
      if c == 1:  # async: the update is this gradient; no accumulator trip
        apply_update(self._weighted(weight, taken), timestamp)
        return tf.constant(True)
      for variable in self._model_variables:
        gradient = taken.get(id(variable))
        if gradient is not None:
          sparse.add_to(self._accumulator_of[id(variable)],
                        sparse.weighted(weight, gradient))
      return tf.constant(True)

    with tf.control_dependencies(written):
      took = tf.cond(push.accepted, lambda: _after_all_ops(take_gradient),
                     lambda: tf.constant(False))
    if c > 1:
      with tf.control_dependencies([took]):
        took = tf.cond(
            push.complete,
            lambda: _after_all_ops(lambda: self._apply_mean(apply_update, c,
                                                            timestamp)),
            lambda: tf.constant(False))
    if self._protocol.barrier:
      with tf.control_dependencies([took]):
        self._ring(push.tokens_back)
    return tf.where(push.delivered, push.staleness,
                    tf.constant(-1, _INT))

  def _push_unlocked(self, gradient_of, pulled_timestamp, apply_update,
                     lr_policy, max_staleness, push_key, learner):
    """Async fast path: the ledger write under the lock, update outside.

    The lock section reserves the update's version (timestamp + 1) and
    counts the gradient; the weights are then updated without the lock.
    """
    def locked():
      changes = ledger_lib.Changes(self.ledger.live_read())
      push = self._record(changes, pulled_timestamp, max_staleness, push_key,
                          learner, None)
      self._commit(changes)
      return (push.staleness, push.accepted, push.delivered,
              changes.old[ledger_lib.LedgerLayout.TIMESTAMP])

    staleness, accepted, delivered, timestamp = self._lock.execute(
        lambda: _after_all_ops(locked), exclusive_resource_access=False)

    def apply():
      weight = lr_policy.weight(tf.cast(staleness, tf.float32),
                                maximum=tf.maximum)
      gradients = self._weighted(weight, gradient_of)
      apply_update(gradients, timestamp)
      with tf.control_dependencies(
          [t for g, _ in gradients for t in sparse.tensors_of(g)]):
        return tf.constant(True)

    tf.cond(accepted, lambda: _after_all_ops(apply),
            lambda: tf.constant(False))
    return tf.where(delivered, staleness, tf.constant(-1, _INT))

  def _apply_mean(self, apply_update, c, timestamp):
    """One update from the mean of the accumulated gradients, then reset."""
    mean_gradients = [
        (accumulator.live_read() / tf.cast(c, accumulator.dtype), variable)
        for variable, accumulator in zip(self._model_variables,
                                         self.accumulators)]
    apply_update(mean_gradients, timestamp)
    with tf.control_dependencies([g for g, _ in mean_gradients]):
      for accumulator in self.accumulators:
        accumulator.assign(tf.zeros_like(accumulator))
    return tf.constant(True)

  def _weighted(self, weight, gradient_of):
    """(weight * gradient, variable) for every variable (zero if absent)."""
    gradients = []
    for variable in self._model_variables:
      gradient = gradient_of.get(id(variable))
      gradients.append((tf.zeros(variable.shape, variable.dtype)
                        if gradient is None else
                        sparse.weighted(weight, gradient), variable))
    return gradients

  # ------------------------------------------------------------------ report
  def read_statistics(self):
    """The shard's `transition.Counters` (numpy), read eagerly under the
    lock: one consistent version."""
    return self._layout.counters(self._read_ledger())
