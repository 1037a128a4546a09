"""A shard's ledger: every counter of one ps shard in one int64 vector.

TensorFlow aborts a dead learner's step on the ps part-way: ops of a locked
section that had not run yet never run (seen in fault tests: an update
applied whose counters were never written; a hardsync token taken and never
recorded, which hung the barrier). So every counter of a shard lives in ONE
vector, and each locked section changes it with exactly one write computed
from one read (`Changes`): a section cut short either happened entirely, as
far as the counters go, or not at all.

Layout (`LedgerLayout`), one int64 each unless a length is given:

    timestamp, pending, received, dropped, duplicates, σ sum, σ max,
    available hardsync tokens, pin cursor,
    histogram (bins), gradients per learner (λ), tokens each learner holds
    (λ), each learner's last push key (λ) and its pushes (λ),
    pinned push keys (PINNED_KEY_SLOTS) and their pushes (PINNED_KEY_SLOTS)

The push-key fields are `push_keys.py`'s; the rest are the protocol's.
"""

import tensorflow as tf

from rudra_tf import transition

INT = tf.int64
# Closures TensorFlow put back for a re-run whose keys a shard remembers
# (push_keys.py): a pin is overwritten only by the pin this many failures
# later, long after the re-run it guards (TF re-runs a closure once the
# queue before it has drained).
PINNED_KEY_SLOTS = 64
NO_KEY = -1


class LedgerLayout:
  """Where each counter lives in a shard's ledger vector (module doc)."""
  (TIMESTAMP, PENDING, RECEIVED, DROPPED, DUPLICATES, STALENESS_SUM,
   STALENESS_MAX, AVAILABLE, PIN_CURSOR) = range(9)

  def __init__(self, bins, num_learners, pinned_slots=PINNED_KEY_SLOTS):
    self.bins = bins
    self.num_learners = num_learners
    self.pinned_slots = pinned_slots
    self.histogram = 9
    self.learners = self.histogram + bins
    self.holding = self.learners + num_learners
    self.learner_keys = self.holding + num_learners
    self.learner_key_pushes = self.learner_keys + num_learners
    self.pinned_keys = self.learner_key_pushes + num_learners
    self.pinned_key_pushes = self.pinned_keys + pinned_slots
    self.size = self.pinned_key_pushes + pinned_slots
    # Where each of transition.Counters' fields starts.
    self._starts = {
        "timestamp": self.TIMESTAMP, "pending": self.PENDING,
        "received": self.RECEIVED, "dropped": self.DROPPED,
        "duplicates": self.DUPLICATES, "staleness_sum": self.STALENESS_SUM,
        "staleness_max": self.STALENESS_MAX, "available": self.AVAILABLE,
        "histogram": self.histogram, "learners": self.learners,
        "holding": self.holding}

  def position(self, field, index=None):
    """Where counter `field` (a `transition.Counters` name) lives; `index`
    (an int or a tensor) within a per-bin or per-learner field."""
    start = self._starts[field]
    return start if index is None else start + index

  def counters(self, ledger):
    """The named counters (`transition.Counters`) of a ledger vector, as
    slices of it (numpy array or tensor)."""
    return transition.Counters(
        **{field: ledger[self._starts[field]]
           for field in transition.SCALAR_FIELDS},
        histogram=ledger[self.histogram:self.learners],
        learners=ledger[self.learners:self.holding],
        holding=ledger[self.holding:self.learner_keys])

  def initial(self):
    """A fresh ledger: no key seen or pinned (NO_KEY), every counter 0."""
    values = [0] * self.size
    values[self.learner_keys:self.learner_key_pushes] = (
        [NO_KEY] * self.num_learners)
    values[self.pinned_keys:self.pinned_key_pushes] = (
        [NO_KEY] * self.pinned_slots)
    return tf.constant(values, INT)


class Changes:
  """Changes to a ledger, turned into its new value by one op."""

  def __init__(self, old):
    self.old = old
    self._indices = []
    self._deltas = []

  def add(self, index, delta):
    self._indices.append(tf.cast(index, INT))
    self._deltas.append(tf.cast(delta, INT))

  def set(self, index, value, when=True):
    """ledger[index] = value (if `when`, a bool tensor or True).

    Set each index at most once per section: the new value is computed
    from the old one.
    """
    delta = tf.cast(value, INT) - self.old[index]
    self.add(index, delta if when is True else
             tf.where(when, delta, tf.zeros_like(delta)))

  def add_all(self, layout, changes):
    """Adds a transition's `(field, index, delta)` changes (transition.py)."""
    for field, index, delta in changes:
      self.add(layout.position(field, index), delta)

  def new_value(self):
    if not self._indices:
      return self.old
    return tf.tensor_scatter_nd_add(
        self.old, tf.reshape(tf.stack(self._indices), [-1, 1]),
        tf.stack(self._deltas))


def one(flag):
  """1 where a bool tensor is True, else 0 (int64)."""
  return tf.cast(flag, INT)
