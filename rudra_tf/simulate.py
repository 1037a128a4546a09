"""A one-process simulator of Rudra's protocols: λ virtual learners, one PS.

No servers: the parameter server's protocol state (`ProtocolServer`) goes
through the very transitions the real strategy's shards make
(`transition.push`: σ, the drop rule, c, the clock, the histogram;
`barrier.take`: hardsync's λ pull tokens per version; `protocol.py`: the
learning-rate multiplier and staleness weights), and a learner-speed model
decides the order of the pushes. Deterministic for a seed.

The protocol engine (`run_protocol`) is pure Python; the model math
(`KerasModelMath`) is TensorFlow, so the schedule of pushes can be checked by
hand and the training can be checked against the real cluster.

Worked trajectory (λ = 4, "2-softsync", equal speeds; ties go to the lower
learner index): every learner pulls version 0 at t = 0 and pushes at t = 1.
Learner 0 pushes (σ = 0) and pulls version 0 again; learner 1 (σ = 0)
completes update 1 and pulls version 1; learners 2 and 3 push with σ = 1 and
complete update 2. At t = 2 the learners hold versions 0, 1, 1, 2 and push
with σ = 2, 1, 2, 1, and so on: the staleness settles at 2, 1, 2, 1.
"""

import collections
import dataclasses
import heapq

import numpy as np

from rudra_tf import barrier
from rudra_tf import compensation as compensation_lib
from rudra_tf import protocol as protocol_lib
from rudra_tf import push_trace as push_trace_lib
from rudra_tf import report as report_lib
from rudra_tf import transition

SPEED_MODELS = ("equal", "random", "normal", "straggler", "replay",
                "measured")
# The models that play a cluster's push trace (`SpeedModel.from_trace`).
TRACED_SPEED_MODELS = ("replay", "measured")
# "normal" step times are cut here from below: a step takes some time.
MIN_NORMAL_STEP = 0.05


@dataclasses.dataclass(frozen=True)
class SpeedModel:
  """How long each learner takes from its pull to its push.

  * "equal": every step takes 1.
  * "random": each step takes a uniform draw in [1 - jitter, 1 + jitter].
  * "normal": each step takes a normal draw of mean 1 and standard
    deviation `jitter`, at least MIN_NORMAL_STEP.
  * "straggler": learner 0 takes `straggler_factor`, the others 1.
  * "replay": a real cluster's steps (`from_trace`): learner i's k-th step
    and the gap after it are those of the traced learner i (mod the traced
    λ), k mod its traced steps; each learner starts at its traced first
    pull. Played against the traced protocol, it gives the traced σ.
  * "measured": the same traced steps, each (step, gap) pair drawn at
    random from the learner's own: their distribution, not their order.

  `gap` is the time from a learner's push to its next pull (on a cluster:
  the closure returning to the coordinator and the next one being scheduled;
  `steps_per_execution` > 1 removes it for all but one step in k). During the
  gap the learner holds no weights, so a gap lowers staleness. The traced
  models carry their own gaps and ignore it.

  Traced times are in units of the trace's median step (pull to push).
  """
  kind: str = "equal"
  jitter: float = 0.5
  straggler_factor: float = 4.0
  seed: int = 0
  gap: float = 0.0
  # Traced models: per learner, its ((step, gap), ...); and its first pull.
  traced_steps: tuple = ()
  traced_starts: tuple = ()

  def __post_init__(self):
    if self.kind not in SPEED_MODELS:
      raise ValueError(f"Unknown speed model {self.kind!r}; valid values are "
                       f"{', '.join(SPEED_MODELS)}.")
    if not 0 <= self.jitter < 1:
      raise ValueError(f"jitter must be in [0, 1), got {self.jitter}.")
    if self.gap < 0:
      raise ValueError(f"gap must be >= 0, got {self.gap}.")
    if self.straggler_factor < 1:
      raise ValueError("straggler_factor must be >= 1, got "
                       f"{self.straggler_factor}.")
    traced = self.kind in TRACED_SPEED_MODELS
    if traced != bool(self.traced_steps) or (
        traced and not all(self.traced_steps)):
      raise ValueError(
          f"Speed model {self.kind!r}: "
          + ("build it from a push trace with SpeedModel.from_trace; every "
             "traced learner needs at least one step." if traced else
             "traced steps belong to the 'replay' and 'measured' models."))

  @classmethod
  def from_trace(cls, events, kind="replay", seed=0):
    """The model of a cluster's push trace (`rudra_tf.push_trace` events).

    Every learner 0..λ-1 must appear in the trace with a push. A last push
    with no pull after it has gap 0.
    """
    if kind not in TRACED_SPEED_MODELS:
      raise ValueError(f"Unknown traced speed model {kind!r}; valid values "
                       f"are {', '.join(TRACED_SPEED_MODELS)}.")
    steps = push_trace_lib.learner_steps(events)
    if not steps or sorted(steps) != list(range(len(steps))):
      raise ValueError("A push trace must have pushes of learners 0.."
                       f"λ-1; it has pushes of learners {sorted(steps)}.")
    unit = float(np.median([s.step for learner in steps.values()
                            for s in learner]))
    if unit <= 0:
      raise ValueError(f"The trace's median step is {unit} s; it must be "
                       "> 0.")
    firsts = push_trace_lib.first_pull_times(events)
    origin = min(firsts[learner] for learner in steps)
    return cls(kind, seed=seed, traced_steps=tuple(
        tuple((s.step / unit, (s.gap or 0.0) / unit) for s in steps[learner])
        for learner in sorted(steps)), traced_starts=tuple(
            (firsts[learner] - origin) / unit for learner in sorted(steps)))

  def start_time(self, learner):
    """When the learner first pulls (traced models: as traced; else 0)."""
    if not self.traced_starts:
      return 0.0
    return self.traced_starts[learner % len(self.traced_starts)]

  def draw(self, learner, step, rng):
    """(step time, gap after it) of the learner's `step`-th step."""
    if self.kind not in TRACED_SPEED_MODELS:
      return self.step_time(learner, rng), self.gap
    traced = self.traced_steps[learner % len(self.traced_steps)]
    if self.kind == "replay":
      return traced[step % len(traced)]
    return traced[int(rng.integers(len(traced)))]

  @classmethod
  def from_step_times(cls, step_times, seed=0, gap=0.0):
    """The model of per-learner step times (e.g. a cluster's emulated ones).

    Equal times give "equal"; a longer time for learner 0 and equal times for
    the others give "straggler" with their ratio. Time is measured in units of
    the (other) learners' step.
    """
    times = [float(t) for t in step_times]
    if not times or min(times) <= 0:
      raise ValueError(f"step times must be > 0, got {step_times}.")
    if len(set(times)) == 1:
      return cls("equal", seed=seed, gap=gap)
    if len(times) > 1 and len(set(times[1:])) == 1 and times[0] > times[1]:
      return cls("straggler", straggler_factor=times[0] / times[1], seed=seed,
                 gap=gap)
    raise ValueError(
        f"step times {step_times} are neither equal nor one straggler "
        "(learner 0 slower, the others equal); the simulator models those.")

  def step_time(self, learner, rng):
    if self.kind == "random":
      return float(rng.uniform(1 - self.jitter, 1 + self.jitter))
    if self.kind == "normal":
      return max(MIN_NORMAL_STEP, float(rng.normal(1.0, self.jitter)))
    if self.kind == "straggler" and learner == 0:
      return float(self.straggler_factor)
    return 1.0


def _counter(name):
  """A read-only int view of one of `ProtocolServer.counters`."""
  return property(lambda server: int(getattr(server.counters, name)),
                  doc=f"The shard's {name} counter.")


class ProtocolServer:
  """One parameter-server shard's protocol state, on numbers.

  The shard's own transitions (`transition.push`, `barrier.take`) applied
  to its named counters (`transition.Counters`): what a `ShardState` does
  to its ledger, less the push keys and learner incarnations (no closure
  is ever re-run here).
  """

  def __init__(self, protocol, lr_policy="none", max_staleness=None):
    self.protocol = protocol
    self.lr_policy = protocol_lib.LearningRatePolicy.create(lr_policy,
                                                            protocol)
    self.max_staleness = protocol_lib.validate_max_staleness(max_staleness)
    self.bins = protocol_lib.histogram_bins(protocol.num_learners)
    self.counters = transition.Counters.initial(protocol, self.bins)

  timestamp = _counter("timestamp")
  pending = _counter("pending")
  received = _counter("received")
  dropped = _counter("dropped")

  @property
  def histogram(self):
    return self.counters.histogram

  @property
  def tokens(self):
    """Hardsync tokens available (None without a barrier)."""
    return int(self.counters.available) if self.protocol.barrier else None

  def _reuses(self, learner):
    """A backup round's late learner pulls with the token it kept."""
    return bool(self.protocol.backup and learner is not None and
                barrier.reuse(self.counters, learner, True,
                              transition.NUMPY_OPS))

  def can_pull(self, learner=None):
    return (not self.protocol.barrier or self.counters.available > 0 or
            self._reuses(learner))

  def pull(self, learner=None):
    """Returns the timestamp a pull reads (taking a hardsync token)."""
    if not self.can_pull(learner):
      raise RuntimeError("hardsync pull without a token")
    if self.protocol.barrier and not self._reuses(learner):
      _, changes = barrier.take(self.counters, learner, True,
                                transition.NUMPY_OPS)
      self.counters = transition.apply(self.counters, changes)
    return self.timestamp

  def push(self, pulled_timestamp, learner=None):
    """Records one gradient; returns (its weight or None if dropped, σ).

    The clock moves on when the gradient completes an update.
    """
    push = transition.push(self.counters, pulled_timestamp, self.protocol,
                           self.bins, max_staleness=self.max_staleness,
                           learner=learner)
    self.counters = transition.apply(self.counters, push.changes)
    staleness = int(push.staleness)
    if not push.accepted:
      return None, staleness
    return self.lr_policy.weight(staleness), staleness

  def report(self):
    return report_lib.StalenessReport.from_shards(self.protocol,
                                                  [self.counters])


def run_protocol(server, num_gradients, speed=SpeedModel(), on_pull=None,
                 on_push=None, on_update=None):
  """Plays `num_gradients` pushes of λ virtual learners against `server`.

  Callbacks (all optional) connect the model math:
    on_pull(learner): the learner takes a snapshot of the weights.
    on_push(learner, weight): it pushes its gradient on that snapshot;
      weight is None for a dropped gradient.
    on_update(timestamp): apply the mean of the accepted gradients.

  Returns:
    The list of (time, learner, staleness) of every push, in order.
  """
  rng = np.random.default_rng(speed.seed)
  num_learners = server.protocol.num_learners
  if speed.kind == "replay" and num_learners != len(speed.traced_steps):
    raise ValueError(
        f"The replay speed model plays each of the trace's "
        f"{len(speed.traced_steps)} learners once; this run has λ = "
        f"{num_learners} (copies of a learner would step in lockstep). Use "
        "the 'measured' model, which draws each learner's steps.")
  # Events (time, sequence, learner, is_pull): a push ends a learner's step;
  # with a gap, a pull event starts its next one. Equal times go in the
  # order they were scheduled.
  events, waiting, pulled = [], collections.deque(), {}
  sequence = 0
  pushes = []

  def schedule(time, learner, is_pull):
    nonlocal sequence
    sequence += 1
    heapq.heappush(events, (time, sequence, learner, is_pull))

  steps_started, gap_after = [0] * num_learners, [0.0] * num_learners

  def start(learner, now):
    if not server.can_pull(learner):
      waiting.append(learner)
      return
    pulled[learner] = server.pull(learner)
    if on_pull:
      on_pull(learner)
    step, gap_after[learner] = speed.draw(learner, steps_started[learner],
                                          rng)
    steps_started[learner] += 1
    schedule(now + step, learner, False)

  for learner in range(num_learners):
    if speed.start_time(learner):
      schedule(speed.start_time(learner), learner, True)
    else:
      start(learner, 0.0)
  while len(pushes) < num_gradients:
    now, _, learner, is_pull = heapq.heappop(events)
    if is_pull:
      start(learner, now)
      continue
    version = server.timestamp
    weight, staleness = server.push(pulled[learner], learner)
    if on_push:
      on_push(learner, weight)
    pushes.append((now, learner, staleness))
    if server.timestamp > version:  # the push completed an update
      if on_update:
        on_update(version)
      while waiting and server.can_pull():
        start(waiting.popleft(), now)
    if gap_after[learner]:
      schedule(now + gap_after[learner], learner, True)
    else:
      start(learner, now)
  return pushes


class KerasModelMath:
  """The TensorFlow half of the simulator: snapshots, gradients, updates.

  `master` holds the parameter server's weights and the inner optimizer;
  `worker` is where gradients are computed, on a pulled snapshot.

  One update applies (1/c)·Σ_l w_l·g_l. The gradient is linear in the loss,
  so the learners that pulled the same version are computed in one call: the
  gradient of Σ_l (w_l/μ_l)·Σ_{i in batch l} loss_i, plus (Σ_l w_l) times the
  model's regularization losses, on their concatenated batches. (Models with
  batch statistics, e.g. batch norm, then see the concatenated batch.)
  """

  def __init__(self, model_fn, optimizer):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tf_keras  # pylint: disable=g-import-not-at-top
    self.master = model_fn()
    self._worker = model_fn()
    self._optimizer = optimizer
    self._optimizer.build(self.master.trainable_variables)

    @tf.function(reduce_retracing=True)
    def weighted_gradient(weights, x, y, example_weights, total_weight):
      for variable, value in zip(self._worker.trainable_variables, weights):
        variable.assign(value)
      with tf.GradientTape() as tape:
        per_example = tf_keras.losses.sparse_categorical_crossentropy(
            y, self._worker(x, training=True))
        loss = tf.reduce_sum(per_example * example_weights)
        if self._worker.losses:
          loss += total_weight * tf.add_n(self._worker.losses)
      return tape.gradient(loss, self._worker.trainable_variables)

    @tf.function(reduce_retracing=True)
    def apply(summed_gradients, count, learning_rate):
      self._optimizer.learning_rate.assign(learning_rate)
      self._optimizer.apply_gradients(
          [(g / count, v) for g, v in
           zip(summed_gradients, self.master.trainable_variables)])

    self._weighted_gradient, self._apply = weighted_gradient, apply

  def snapshot(self):
    return [v.numpy() for v in self.master.trainable_variables]

  def update(self, groups, count, learning_rate):
    """Applies (1/count)·Σ w·g; groups: [(snapshot, [(w, (x, y)), ...])]."""
    self.apply(self.gradient_sum(groups), count, learning_rate)

  def apply(self, summed, count, learning_rate):
    """Applies (1/count)·summed with the inner optimizer at `learning_rate`."""
    self._apply(summed, np.float32(count), np.float32(learning_rate))

  def gradient_sum(self, groups):
    """Σ w·g over groups: [(snapshot, [(w, (x, y)), ...])] (tensors)."""
    summed = None
    for snapshot, entries in groups:
      x = np.concatenate([batch[0] for _, batch in entries])
      y = np.concatenate([batch[1] for _, batch in entries])
      example_weights = np.concatenate(
          [np.full(len(batch[1]), weight / len(batch[1]), np.float32)
           for weight, batch in entries])
      total_weight = np.float32(sum(weight for weight, _ in entries))
      gradients = self._weighted_gradient(snapshot, x, y, example_weights,
                                          total_weight)
      summed = gradients if summed is None else [
          a + b for a, b in zip(summed, gradients)]
    return summed


class GapLog:
  """What gap-aware's divisor was (compensation.py), averaged over every
  parameter of every corrected gradient since the last `take`.

  The four means say why the rule damps as much as it does: `distance`
  |θ_now − θ_pulled|, `typical_step` C = α · (sqrt(v̂) + ε), `divisor`
  G = 1 + distance / C, and `damping` 1/G, the factor the gradient was
  multiplied by. Worked (compensation.py's golden values: θ_now − θ_pulled
  = [0.2, −0.5], C = [0.1, 0.2], so G = [3, 3.5]): distance 0.35,
  typical_step 0.15, divisor 3.25, damping (1/3 + 1/3.5) / 2 = 0.3095.
  """

  FIELDS = ("distance", "typical_step", "divisor", "damping")

  def __init__(self):
    self._restart()

  def _restart(self):
    self._sums = dict.fromkeys(self.FIELDS, 0.0)
    self._count = 0

  def add(self, current, pulled, step):
    """One gradient's parameters: θ_now, θ_pulled and C (arrays)."""
    divisor = compensation_lib.gap(current, pulled, step)
    values = (np.abs(current - pulled), step, divisor, 1 / divisor)
    for name, value in zip(self.FIELDS, values):
      self._sums[name] += float(np.sum(value, dtype=np.float64))
    self._count += np.size(divisor)

  def take(self):
    """The means since the last take (each None if nothing was added), and
    a fresh start."""
    means = {name: (total / self._count if self._count else None)
             for name, total in self._sums.items()}
    self._restart()
    return means


class CompensatedGradients:
  """The simulator's half of a compensation rule (compensation.py): each
  accepted gradient corrected as the shard corrects it at its arrival.

  No update happens between a round's pushes, so θ_now is the master's
  weights when the round's update is applied, and the gradients are
  corrected there in push order (the rule's state moves in that order).
  Gap-aware's divisors are logged in `gaps` (a GapLog).
  """

  def __init__(self, rule, math):
    self.rule = rule
    self._math = math
    self._state = None  # per variable: (mean square, count)
    self.gaps = (GapLog() if rule.name == compensation_lib.GAP_AWARE
                 else None)

  def sum(self, accepted, versions, step_size):
    """Σ w · correct(g) over accepted: [(version, w, batch)] (numpy)."""
    current = self._math.snapshot()
    if self._state is None:
      self._state = [(np.zeros_like(v), 0) for v in current]
    summed = [np.zeros_like(v) for v in current]
    for version, weight, batch in accepted:
      pulled = versions[version]
      gradients = self._math.gradient_sum([(pulled, [(1.0, batch)])])
      for i, gradient in enumerate(gradients):
        mean_square, count = self._state[i]
        corrected, mean_square, count = self.rule.correct(
            gradient.numpy(), current[i], pulled[i], mean_square, count,
            step_size)
        self._state[i] = (mean_square, count)
        summed[i] += weight * corrected.astype(summed[i].dtype)
        if self.gaps is not None:
          # C again, from the state `correct` just moved to (no side effect).
          self.gaps.add(current[i], pulled[i], compensation_lib.typical_step(
              mean_square, count, step_size, self.rule.decay))
    return summed


def _numpy_batches(data, learner, num_learners, minibatch, seed):
  """The learner's batches as numpy (x, y): fast for in-memory data."""
  if hasattr(data, "learner_batches"):
    return data.learner_batches(learner, num_learners, minibatch, seed)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  dataset = data.learner_dataset(
      tf.distribute.InputContext(num_learners, learner), minibatch, seed=seed)
  return ((x.numpy(), y.numpy()) for x, y in dataset)


def simulate(model_fn, data, protocol, num_learners, minibatch, epochs=1,
             steps_per_epoch=None, learning_rate=0.01, momentum=0.9,
             lr_policy="none", max_staleness=None, speed=SpeedModel(),
             seed=0, out=None, compensation="none",
             compensation_strength=None, evaluate_each_epoch=False):
  """Trains `model_fn()` on `data` as λ learners under `protocol` would.

  Args:
    model_fn: builds a fresh tf_keras model (called twice).
    data: a `rudra_tf.datasets` data set (learner shards, test split).
    protocol: "hardsync", "async" or "<n>-softsync".
    num_learners, minibatch: λ and μ.
    steps_per_epoch: gradients per epoch (default train size / μ).
    learning_rate: α0 (a float, or a callable of the timestamp).
    speed: the learner-speed model.
    compensation, compensation_strength: a rule of compensation.py, as the
      StalenessAwareOptimizer takes it.
    evaluate_each_epoch: also test the weights after each epoch (at the
      first update that includes the epoch's last gradient), for a curve.

  Returns:
    A dict: test_accuracy, test_loss, report (a StalenessReport),
    simulated_time (in units of one learner step), updates, gradients,
    the final weights, epoch_test_loss and epoch_test_accuracy (one
    per epoch, the last the final ones; empty unless evaluate_each_epoch),
    and epoch_gaps (gap_aware only, else empty: per epoch, `GapLog.take`'s
    means over the gradients accepted in it).
  """
  import tf_keras  # pylint: disable=g-import-not-at-top
  tf_keras.utils.set_random_seed(seed)
  parsed = protocol_lib.parse_protocol(protocol, num_learners)
  server = ProtocolServer(parsed, lr_policy, max_staleness)
  multiplier = server.lr_policy.multiplier
  schedule = learning_rate if callable(learning_rate) else (
      lambda _: learning_rate)
  math = KerasModelMath(model_fn, tf_keras.optimizers.SGD(
      learning_rate=float(schedule(0)), momentum=momentum))
  rule = compensation_lib.Compensation.create(compensation,
                                              compensation_strength)
  compensated = CompensatedGradients(rule, math) if rule.enabled else None
  batches = [_numpy_batches(data, learner, num_learners, minibatch, seed)
             for learner in range(num_learners)]
  versions = {}        # timestamp -> weights, for versions still in use
  version_of = {}      # learner -> the version it pulled
  accepted = []        # (version, weight, batch) since the last update
  steps = steps_per_epoch or data.train_size // minibatch
  math.master.compile(loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
  test_data = data.test_dataset(1000)
  pushed, epoch_test_loss, epoch_test_accuracy = 0, [], []
  gaps = compensated.gaps if compensated else None
  epoch_gaps = []

  def on_pull(learner):
    if server.timestamp not in versions:
      versions[server.timestamp] = math.snapshot()
    version_of[learner] = server.timestamp

  def on_push(learner, weight):
    nonlocal pushed
    pushed += 1
    batch = next(batches[learner])  # a dropped gradient used its batch too
    if weight is not None:
      accepted.append((version_of[learner], weight, batch))

  def on_update(timestamp):
    learning_rate = schedule(timestamp) * multiplier
    if compensated:
      math.apply(compensated.sum(accepted, versions, learning_rate),
                 parsed.gradients_per_update, learning_rate)
    else:
      groups = {}
      for version, weight, batch in accepted:
        groups.setdefault(version, []).append((weight, batch))
      math.update([(versions[v], entries) for v, entries in groups.items()],
                  parsed.gradients_per_update, learning_rate)
    accepted.clear()
    for version in set(versions) - set(version_of.values()):
      del versions[version]
    finished_epochs = min(pushed // steps, epochs - 1)
    while gaps is not None and len(epoch_gaps) < finished_epochs:
      epoch_gaps.append(gaps.take())
    while evaluate_each_epoch and len(epoch_test_loss) < finished_epochs:
      loss, accuracy = math.master.evaluate(test_data, verbose=0)
      epoch_test_loss.append(float(loss))
      epoch_test_accuracy.append(float(accuracy))

  pushes = run_protocol(server, steps * epochs, speed, on_pull, on_push,
                        on_update)
  test_loss, test_accuracy = math.master.evaluate(test_data, verbose=0)
  if evaluate_each_epoch:
    epoch_test_loss.append(float(test_loss))
    epoch_test_accuracy.append(float(test_accuracy))
  if gaps is not None:
    epoch_gaps.append(gaps.take())
  report = server.report()
  if out:
    rule_text = "" if not rule.enabled else f" compensation={rule.name}"
    out(f"simulated {protocol} λ={num_learners} μ={minibatch} {lr_policy}"
        f"{rule_text}: "
        f"test accuracy {test_accuracy:.4f}; {report.summary()}")
  return {"test_accuracy": float(test_accuracy),
          "test_loss": float(test_loss), "report": report,
          "simulated_time": pushes[-1][0] if pushes else 0.0,
          "updates": report.timestamp, "gradients": report.gradients,
          "weights": math.master.get_weights(),
          "epoch_test_loss": epoch_test_loss,
          "epoch_test_accuracy": epoch_test_accuracy,
          "epoch_gaps": epoch_gaps}
