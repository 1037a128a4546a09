"""Hardsync's barrier: a shard's pull tokens, as a small state machine.

A token is one pull allowed in the current round. Exactly λ pulls may read
each version of a shard, and the update that consumes their c = λ gradients
hands out λ new tokens, so a learner cannot pull the next version before
the round its gradient belongs to is complete (σ = 0 always). The counters
(`transition.Counters`) are `available`, `holding[learner]` and `pending`.

Each token is in one of three places:

    AVAILABLE --take (a live learner's pull)----------------> HELD(learner)
    HELD(L)   --L's push accepted, round not complete-------> PENDING
    HELD(L)   --L's push a duplicate------------------------> AVAILABLE
    HELD(L)   --L's push late (backup rounds)---------------> HELD(L)
    HELD(L)   --L's next pull reuses it (backup rounds)-----> HELD(L)
    HELD(L)   --L died (release, chief side)----------------> AVAILABLE
    PENDING   --a push completes the round: c tokens--------> AVAILABLE

Backup rounds ("<b>-backup-hardsync", c = λ − b): a round completes with
the first c gradients of its version, so c tokens come back; the b learners
still computing on that version keep theirs, and their late gradient
(σ = 1) is dropped. A late learner's next pull reads the new version with
the token it kept (`reuse`), never with one a round handed out, and no
other learner can take a kept token.

Tokens in AVAILABLE belong to no learner: first come, first served, as in
TF1's SyncReplicasOptimizer token queue. So a learner whose gradient is
pending may take a second token of the same version when one is still
unclaimed: at the start (λ tokens, a learner whose first step starts late),
when a learner is slow to come back for the token a round rang for it, or
when a dead learner's token is released. The round then holds two
gradients of that learner (each on the version, σ = 0), and in backup
rounds the gradient dropped as late may be a fast learner's. What always
holds: at most λ gradients of a version are delivered (a duplicate's or a
dead incarnation's push is refused), the round takes the first c of them,
and every accepted gradient has σ = 0. Pooled tokens are
what let a dead learner's re-run closure finish its round on another
learner (`release`).

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

The same with one backup ("1-backup-hardsync", λ = 3, c = 2):

    start           a=3 h=[0,0,0] p=0
    take(0..2)      a=0 h=[1,1,1] p=0
    push(0) kept    a=0 h=[0,1,1] p=1
    push(1) round   a=2 h=[0,0,1] p=0   (c = 2 tokens back; version 1)
    take(0), (1)    a=0 h=[1,1,1] p=0
    push(2) late    a=0 h=[1,1,1] p=0   (σ = 1: dropped, token kept)
    reuse(2)        a=0 h=[1,1,1] p=0   (learner 2 reads version 1)

A learner that starts late leaves its token in the pool (λ = 3, c = 2):

    take(1), (2)    a=1 h=[0,1,1] p=0
    push(1) kept    a=1 h=[0,0,1] p=1
    take(1)         a=0 h=[0,1,1] p=1   (learner 1 reads version 0 again)
    push(2) round   a=2 h=[0,1,0] p=0   (version 1)
    push(1) late    a=2 h=[0,1,0] p=0   (σ = 1: a fast learner's, dropped)
"""


def take(counters, learner, live, ops):
  """A pull's attempt at a token. Returns (taken, changes)."""
  taken = ops.logical_and(counters.available > 0, live)
  changes = [("available", None, -ops.one(taken))]
  if learner is not None:
    changes.append(("holding", learner, ops.one(taken)))
  return taken, changes


def reuse(counters, learner, live, ops):
  """Whether a pull reads with the token its learner kept from a late push
  (backup rounds; takes nothing, so it changes nothing)."""
  return ops.logical_and(counters.holding[learner] > 0, live)


def returned_by_push(counters, protocol, learner, live, delivered, accepted,
                     complete, ops):
  """What a push does to the tokens. Returns (changes, tokens made available).

  A live learner's push gives up the token it held: to the round if it was
  a duplicate (AVAILABLE), to PENDING if its gradient was taken; a late
  gradient of a backup round keeps it (HELD, for the learner's next pull).
  A completed round makes c available. A dead incarnation's token was
  released already.
  """
  kept = False
  if protocol.backup and learner is not None:  # None: nobody to keep it
    kept = ops.logical_and(delivered, ops.logical_not(accepted))
  gives_up = ops.logical_and(live, ops.logical_not(kept))
  changes = []
  if learner is not None:
    held = counters.holding[learner]
    changes.append(("holding", learner,
                    (ops.maximum(held - 1, 0) - held) * ops.one(gives_up)))
  tokens_back = (
      ops.one(ops.logical_and(gives_up, ops.logical_not(accepted))) +
      ops.one(complete) * protocol.gradients_per_update)
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
