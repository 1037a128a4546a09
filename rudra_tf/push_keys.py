"""Which pushes of a closure a shard has taken: exactly-once across re-runs.

TensorFlow runs a scheduled closure at least once: when its learner dies (or
a transient error cuts it), TF puts the closure back at the END of its
queue (`_CoordinatedClosureQueue.put_back`) and runs it again on some
learner, even if the first run had pushed. Every scheduled closure carries
a key k and a limit, the pushes one run makes (coordinator.py); a shard
takes at most `limit` pushes of key k over all its runs and counts the rest
as duplicates.

What a shard remembers of key k, in its ledger (ledger.py), is a small
state machine:

    UNSEEN --push by learner L--> RUNNING(L, 1)
    RUNNING(L, n) --push by L--> RUNNING(L, n + 1)   (refused once n = limit)
    RUNNING(L, n) --L pushes another key--> FINISHED (never re-run)
    UNSEEN / RUNNING(L, n) --put back by the chief--> PINNED(0 / n)
    PINNED(n) --push by any learner--> PINNED(n + 1)  (refused once n = limit)
    PINNED(n) --put back again--> PINNED(n)
    PINNED(n) --PINNED_KEY_SLOTS later pins--> FORGOTTEN

RUNNING lives in learner L's record (its last key and the pushes of it):
TF runs one closure at a time per learner, so L's next key means k's run is
over, and a run that is over is re-run only if TF put it back. The chief
pins a key (`pin`) before TF can run the closure again and before its
learner gets another closure (the hook runs inside `put_back`, on the
learner's closure thread); a dead run's push still in flight on the ps (its
bytes had arrived) lands in the pin too. So a key's pushes are counted in
one place however late its re-run comes: a ring of recent keys, which this
replaced, forgot a key 1,024 closures later, and a put-back closure of an
epoch of 1,500 steps re-ran after more than that (2 of 5 random-time kills
applied a gradient twice).

Everything here is graph code over one ledger read (`Changes.old`); the
caller writes the ledger once.
"""

import collections

import tensorflow as tf

from rudra_tf import ledger as ledger_lib

# What a shard knows of a key when a push arrives.
KeySeen = collections.namedtuple("KeySeen", "pushes pinned pin_slot")


def seen(layout, old, key, learner):
  """The pushes of `key` taken so far (a `KeySeen`), from ledger `old`.

  A pinned key's count is the pin's; otherwise the pushing learner's record
  if it holds `key`, else 0.
  """
  pins = old[layout.pinned_keys:layout.pinned_key_pushes]
  hits = tf.equal(pins, key)
  pinned = tf.reduce_any(hits)
  pin_slot = tf.argmax(tf.cast(hits, tf.int32), output_type=ledger_lib.INT)
  pinned_pushes = old[layout.pinned_key_pushes + pin_slot]
  own = tf.equal(old[layout.learner_keys + learner], key)
  own_pushes = tf.where(own, old[layout.learner_key_pushes + learner],
                        tf.zeros([], ledger_lib.INT))
  return KeySeen(tf.where(pinned, pinned_pushes, own_pushes), pinned,
                 pin_slot)


def fresh(key_seen, limit):
  """True if one more push is allowed (limit < 0: no de-duplication)."""
  return (limit < 0) | (key_seen.pushes < limit)


def record(changes, layout, key, learner, key_seen, delivered):
  """Counts a delivered push of `key` where `seen` found it."""
  changes.set(layout.pinned_key_pushes + key_seen.pin_slot,
              key_seen.pushes + 1, when=delivered & key_seen.pinned)
  own = delivered & tf.logical_not(key_seen.pinned)
  changes.set(layout.learner_keys + learner, key, when=own)
  changes.set(layout.learner_key_pushes + learner, key_seen.pushes + 1,
              when=own)


def pin(changes, layout, key):
  """PINNED: `key` will run again; its pushes so far move into a pin.

  The pushes so far are those of any learner whose record holds `key`
  (at most the one that ran it). A key already pinned keeps its pin.
  """
  old = changes.old
  keys = old[layout.learner_keys:layout.learner_key_pushes]
  pushes = old[layout.learner_key_pushes:layout.pinned_keys]
  taken = tf.reduce_max(tf.where(tf.equal(keys, key), pushes,
                                 tf.zeros_like(pushes)))
  pins = old[layout.pinned_keys:layout.pinned_key_pushes]
  new = tf.logical_not(tf.reduce_any(tf.equal(pins, key)))
  cursor = old[layout.PIN_CURSOR]
  slot = cursor % layout.pinned_slots
  changes.set(layout.pinned_keys + slot, key, when=new)
  changes.set(layout.pinned_key_pushes + slot, taken, when=new)
  changes.add(layout.PIN_CURSOR, ledger_lib.one(new))
  return new
