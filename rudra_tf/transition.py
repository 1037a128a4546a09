"""One push, written once: the protocol's transition over a shard's counters.

A pure function over named counters, with no TensorFlow in it: the
parameter-server shard (`shard_state.py`, on int64 tensors inside its lock,
with `ops` = TensorFlow's) and the simulator (`simulate.py`, on numbers)
both call `push`, so σ, the max_staleness drop, "an update after c
gradients", the clock, the per-learner counts and hardsync's tokens
(`barrier.py`) live here and nowhere else.

A transition does not write anything: it returns its changes as additions,
`(field, index, delta)` with index None for a scalar field, so each caller
applies them its own way: the shard in its one ledger write
(`ledger.Changes.add_all`), the simulator and the tests with `apply`.

What a push does, with c = gradients per update (protocol.py):

    σ         = timestamp - pulled timestamp
    delivered = fresh (its closure's earlier run did not deliver it,
                push_keys.py) and live (its learner incarnation is alive)
    accepted  = delivered and σ <= max_staleness (if a bound is set)
                and σ == 0 (backup hardsync: a late gradient is dropped)
    complete  = accepted and pending + 1 >= c
    received, staleness_sum, staleness_max, histogram[min(σ, bins - 1)],
        learners[learner]                         count it if delivered
    dropped   += delivered and not accepted
    duplicates += not delivered
    pending   -> 0 if complete, pending + 1 if accepted
    timestamp += complete
    hardsync tokens                               barrier.returned_by_push

Worked trajectory (λ = 4, "2-softsync", c = 2, no bound; each line one push
on the counters left by the line above; t = timestamp, p = pending):

    pulled 0 at t=0, p=0:  σ=0, accepted, not complete   -> t=0 p=1
    pulled 0 at t=0, p=1:  σ=0, accepted, complete       -> t=1 p=0
    pulled 0 at t=1, p=0:  σ=1, accepted, not complete   -> t=1 p=1
    pulled 0 at t=1, p=1:  σ=1, complete                 -> t=2 p=0
    histogram [2, 2, 0, ...], staleness_sum 2, staleness_max 1

The same with max_staleness=0: the first two pushes as above, then σ=1 is
dropped twice (dropped 2, received 4, t=1, p=0). These are the
trajectories of tests/test_transition.py.
"""

import typing

import numpy as np

from rudra_tf import barrier
from rudra_tf import protocol as protocol_lib


class Counters(typing.NamedTuple):
  """A shard's counters by name (numbers, numpy arrays or tensors).

  timestamp: updates applied (the clock). pending: accepted gradients
  waiting for the next update. received: gradients delivered (accepted and
  dropped). dropped: refused by max_staleness. duplicates: pushes refused
  as an earlier run's or a dead learner incarnation's. staleness_sum,
  staleness_max: of the received gradients. available: hardsync tokens
  (barrier.py). histogram: received gradients by σ (the last bin counts
  σ >= its index). learners: gradients received from each learner.
  holding: hardsync tokens each learner holds.
  """
  timestamp: typing.Any
  pending: typing.Any
  received: typing.Any
  dropped: typing.Any
  duplicates: typing.Any
  staleness_sum: typing.Any
  staleness_max: typing.Any
  available: typing.Any
  histogram: typing.Any
  learners: typing.Any
  holding: typing.Any

  @classmethod
  def initial(cls, protocol, bins):
    """A new shard's counters (numpy): hardsync starts with λ tokens."""
    return cls(0, 0, 0, 0, 0, 0, 0,
               protocol.num_learners if protocol.barrier else 0,
               np.zeros(bins, np.int64),
               np.zeros(protocol.num_learners, np.int64),
               np.zeros(protocol.num_learners, np.int64))


SCALAR_FIELDS = tuple(f for f in Counters._fields
                      if f not in ("histogram", "learners", "holding"))


class Ops(typing.NamedTuple):
  """The few operations a transition needs, for numbers or for tensors."""
  logical_and: typing.Callable
  logical_not: typing.Callable
  maximum: typing.Callable
  minimum: typing.Callable
  one: typing.Callable  # a bool as the integer 1 or 0


NUMPY_OPS = Ops(np.logical_and, np.logical_not, np.maximum, np.minimum,
                lambda flag: np.int64(bool(flag)))


class Push(typing.NamedTuple):
  """What one push did: its σ, its fate, and the counters' changes."""
  staleness: typing.Any
  delivered: typing.Any
  accepted: typing.Any
  complete: typing.Any  # this gradient completes an update
  tokens_back: typing.Any  # hardsync tokens made available (0 otherwise)
  changes: tuple  # ((field, index or None, delta), ...)


def push(counters, pulled_timestamp, protocol, bins, *, max_staleness=None,
         learner=None, fresh=True, live=True, ops=NUMPY_OPS):
  """One gradient pushed to a shard with `counters` (module docstring).

  Args:
    counters: the shard's `Counters` before the push.
    pulled_timestamp: the shard timestamp the gradient was computed at.
    protocol: the `protocol.Protocol`.
    bins: the histogram's length.
    max_staleness: None, or the largest σ accepted.
    learner: the pushing learner's index, or None (not counted per learner,
      and no hardsync token of its own).
    fresh: False for a push its closure's earlier run had delivered.
    live: False for a step of a learner incarnation the chief saw die.
    ops: `NUMPY_OPS`, or the same operations for tensors.

  Returns:
    A `Push`.
  """
  c = protocol.gradients_per_update
  staleness = counters.timestamp - pulled_timestamp
  delivered = ops.logical_and(fresh, live)
  accepted = delivered
  if max_staleness is not None:
    accepted = ops.logical_and(
        accepted, protocol_lib.accepts_gradient(staleness, max_staleness))
  if protocol.backup:
    # The round of the gradient's version is complete: too late.
    accepted = ops.logical_and(accepted, staleness <= 0)
  complete = ops.logical_and(accepted, counters.pending + 1 >= c)
  got, took, done = ops.one(delivered), ops.one(accepted), ops.one(complete)
  changes = [
      ("received", None, got),
      ("staleness_sum", None, staleness * got),
      ("staleness_max", None,
       (ops.maximum(counters.staleness_max, staleness) -
        counters.staleness_max) * got),
      ("histogram", ops.minimum(staleness, bins - 1), got),
      ("dropped", None, ops.one(ops.logical_and(
          delivered, ops.logical_not(accepted)))),
      ("duplicates", None, ops.one(ops.logical_not(delivered))),
      # accepted: +1, or back to 0 when it completes the update.
      ("pending", None, took - done * (counters.pending + 1)),
      ("timestamp", None, done),
  ]
  if learner is not None:
    changes.append(("learners", learner, got))
  tokens_back = 0
  if protocol.barrier:
    token_changes, tokens_back = barrier.returned_by_push(
        counters, protocol, learner, live, delivered, accepted, complete,
        ops)
    changes += token_changes
  return Push(staleness, delivered, accepted, complete, tokens_back,
              tuple(changes))


def apply(counters, changes):
  """The counters after `changes` (numbers and numpy arrays; a copy)."""
  values = counters._asdict()
  for field in ("histogram", "learners", "holding"):
    values[field] = np.array(values[field], np.int64)
  for field, index, delta in changes:
    if index is None:
      values[field] = int(values[field] + delta)
    else:
      values[field][int(index)] += int(delta)
  return Counters(**values)
