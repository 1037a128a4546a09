"""The push trace: when each learner pulled and pushed, as the ps saw it.

A shard built with a trace file (`RudraStrategy(push_trace_dir=...)`)
appends one line per pull and one per delivered push, written on the ps
task inside the shard's lock, so the file's order is the order the shard
served them in:

    pull <learner> <timestamp read> <time>
    push <learner> <timestamp pulled> <σ> <accepted 0/1> <time>

(time: seconds, `tf.timestamp()` on the ps). A push that a re-run closure
repeats (a duplicate) changes nothing and is not traced.

What it is for: the simulator's speed model can replay, or resample, the
step times a real cluster's learners had (simulate.SpeedModel.from_trace),
so the simulator's staleness can be compared with the cluster's on the same
timing. Each learner's trace reads as a sequence of steps:

    pull ──── step ────▶ push ── gap ──▶ pull ──── step ────▶ push ...

step: its pull to its push (it holds weights: updates landing now make
σ); gap: its push to its next pull (the closure returning, the next being
scheduled: it holds none). Worked example (learner 0; times in s):

    pull 0 0 10.0 / push 0 0 0 1 10.2 / pull 0 1 10.3 / push 0 1 0 1 10.6

gives steps (0.2, 0.1) and (0.3, None): the last push has no next pull.

Pure Python (parsing and steps) apart from `trace_op`, the graph op a
shard adds inside its lock. A trace costs one small file write per pull and
push on the ps: it is for studies, off by default.
"""

import dataclasses
import os

# One file per shard; a later model of the same strategy (generation > 0,
# its own shards and clocks) writes files of its own.
TRACE_FILE = "shard{index}.trace"
LATER_MODEL_TRACE_FILE = "model{generation}_shard{index}.trace"


@dataclasses.dataclass(frozen=True)
class Pull:
  learner: int
  timestamp: int
  time: float


@dataclasses.dataclass(frozen=True)
class Push:
  learner: int
  pulled: int
  staleness: int
  accepted: bool
  time: float


@dataclasses.dataclass(frozen=True)
class Step:
  """One learner step: pull to push, and push to the next pull (None for
  the learner's last push)."""
  step: float
  gap: float | None


def trace_path(directory, shard_index, generation=0):
  """The trace file of one shard in `directory` (of the strategy's
  `generation`-th model)."""
  name = (TRACE_FILE.format(index=shard_index) if not generation else
          LATER_MODEL_TRACE_FILE.format(generation=generation,
                                        index=shard_index))
  return os.path.join(directory, name)


def trace_op(path, kind, *values):
  """Appends one line `kind value... time` to `path` (a file on the device
  the op runs on). Graph code: its caller keeps it inside the lock."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if kind not in ("pull", "push"):
    raise ValueError(f"trace lines are 'pull' or 'push', got {kind!r}.")
  return tf.print(kind, *[tf.cast(v, tf.int64) for v in values],
                  tf.timestamp(), output_stream="file://" + path, sep=" ")


def parse(lines):
  """The trace's events (Pull and Push) in file order."""
  events = []
  for number, line in enumerate(lines, 1):
    fields = line.split()
    if not fields:
      continue
    try:
      if fields[0] == "pull" and len(fields) == 4:
        events.append(Pull(int(fields[1]), int(fields[2]), float(fields[3])))
        continue
      if fields[0] == "push" and len(fields) == 6:
        events.append(Push(int(fields[1]), int(fields[2]), int(fields[3]),
                           bool(int(fields[4])), float(fields[5])))
        continue
    except ValueError:
      pass
    raise ValueError(f"push trace line {number} is not 'pull <learner> "
                     "<timestamp> <time>' or 'push <learner> <pulled> <σ> "
                     f"<accepted> <time>': {line.strip()!r}.")
  return events


def read(path):
  """The events of one trace file."""
  with open(path) as stream:
    return parse(stream)


def learner_steps(events):
  """Each learner's steps, in order: {learner: [Step, ...]}.

  A push's step starts at its learner's latest pull; the gap after it ends
  at the learner's next pull. A pull that no push follows (the learner was
  stopped) makes no step.
  """
  steps, last_pull, last_push = {}, {}, {}
  for event in events:
    if isinstance(event, Pull):
      if event.learner in last_push:
        ended = steps[event.learner][-1]
        steps[event.learner][-1] = dataclasses.replace(
            ended, gap=event.time - last_push.pop(event.learner))
      last_pull[event.learner] = event.time
      continue
    if event.learner not in last_pull:
      raise ValueError(f"push trace: learner {event.learner} pushed at "
                       f"{event.time} without a pull before it.")
    steps.setdefault(event.learner, []).append(
        Step(event.time - last_pull.pop(event.learner), None))
    last_push[event.learner] = event.time
  return steps


def first_pull_times(events):
  """{learner: the time of its first pull}."""
  firsts = {}
  for event in events:
    if isinstance(event, Pull):
      firsts.setdefault(event.learner, event.time)
  return firsts


def staleness_histogram(events, bins):
  """The delivered pushes' σ counted as the ledger's histogram counts them
  (the last bin holds σ >= bins - 1)."""
  histogram = [0] * bins
  for event in events:
    if isinstance(event, Push):
      histogram[min(event.staleness, bins - 1)] += 1
  return histogram
