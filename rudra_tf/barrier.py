"""Hardsync's barrier: a shard's pull tokens, as a small state machine.

A token is one pull allowed in the current round. Exactly λ pulls may read
each version of a shard, and the update that consumes their λ gradients
hands out λ new tokens, so a learner cannot pull the next version before
the round its gradient belongs to is complete (σ = 0 always). The counters
(`transition.Counters`) are `available`, `holding[learner]` and `pending`.

Each token is in one of three places:

    AVAILABLE --take (a live learner's pull)----------------> HELD(learner)
    HELD(L)   --L's push accepted, round not complete-------> PENDING
    HELD(L)   --L's push not accepted (dropped, duplicate)--> AVAILABLE
    HELD(L)   --L died (release, chief side)----------------> AVAILABLE
    PENDING   --a push completes the round: λ tokens--------> AVAILABLE

so in an EXACT barrier, `available + Σ holding + pending == λ` (the
conservation rule, asserted by tests/test_barrier.py after every
transition). Two transitions leave and re-enter that state:

    EXACT  --open (a failed fit is being cancelled)--> OPENED (+λ available,
                                                       repeatedly)
    OPENED --refill (nothing runs)-------------------> EXACT (available =
                                                       λ - pending, none held)

A pull of a dead learner incarnation (`live` False) takes nothing and
passes its wake-up on; its push returns nothing (its token was released).

Pure functions over the counters, returning `(field, index, delta)`
changes as `transition.push` does; `shard_state.py` applies them in its one
ledger write and rings its wake-up queue for the tokens made available.

Worked trajectory (λ = 2, one shard; a = available, h = holding, p = pending):

    start           a=2 h=[0,0] p=0
    take(0)         a=1 h=[1,0] p=0
    take(1)         a=0 h=[1,1] p=0
    push(0) kept    a=0 h=[0,1] p=1
    push(1) round   a=2 h=[0,0] p=0   (λ = 2 tokens back)
    take(0)         a=1 h=[1,0] p=0
    release(0)      a=2 h=[0,0] p=0
    open            a=4 h=[0,0] p=0   (OPENED)
    refill          a=2 h=[0,0] p=0   (EXACT)
"""


def take(counters, learner, live, ops):
  """A pull's attempt at a token. Returns (taken, changes)."""
  taken = ops.logical_and(counters.available > 0, live)
  changes = [("available", None, -ops.one(taken))]
  if learner is not None:
    changes.append(("holding", learner, ops.one(taken)))
  return taken, changes


def returned_by_push(counters, num_learners, learner, live, accepted,
                     complete, ops):
  """What a push does to the tokens. Returns (changes, tokens made available).

  A live learner's push gives up the token it held: to the round if its
  gradient was not taken (AVAILABLE), to PENDING otherwise; a completed
  round makes λ available. A dead incarnation's token was released already.
  """
  changes = []
  if learner is not None:
    held = counters.holding[learner]
    changes.append(("holding", learner,
                    (ops.maximum(held - 1, 0) - held) * ops.one(live)))
  tokens_back = (ops.one(ops.logical_and(live, ops.logical_not(accepted))) +
                 ops.one(complete) * num_learners)
  changes.append(("available", None, tokens_back))
  return changes, tokens_back


def release(counters, learner, ops):
  """A dead learner's tokens go back (HELD -> AVAILABLE).

  Returns (tokens released, changes).
  """
  held = ops.maximum(counters.holding[learner], 0)
  return held, [("holding", learner, -counters.holding[learner]),
                ("available", None, held)]


def open_barrier(num_learners):
  """OPENED: λ more pulls may pass while a failed fit is cancelled."""
  return [("available", None, num_learners)]


def refill(counters, num_learners):
  """EXACT again: λ - pending available, none held (when nothing runs)."""
  changes = [("available", None,
              num_learners - counters.pending - counters.available)]
  changes += [("holding", learner, -counters.holding[learner])
              for learner in range(num_learners)]
  return changes


def tokens_in_play(counters):
  """available + Σ holding + pending: λ in an EXACT barrier."""
  return counters.available + sum(counters.holding) + counters.pending
