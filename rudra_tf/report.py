"""StalenessReport: what the parameter-server shards counted (plain numpy)."""

import dataclasses

import numpy as np

from rudra_tf import transition


def histogram_delta_stats(before, after):
  """Mean and max staleness of the gradients counted between two histograms
  (exact unless some fell in the last bin, which counts σ >= its index)."""
  delta = np.asarray(after) - np.asarray(before)
  count = int(delta.sum())
  if count == 0:
    return 0.0, 0
  mean = float(np.arange(len(delta)) @ delta) / count
  return mean, int(np.max(np.nonzero(delta)[0]))


def fraction_above(histogram, threshold):
  """P(σ > threshold) of a staleness histogram (0 when it is empty).

  Exact while threshold + 1 < len(histogram): the last bin counts every σ
  at or above its index (the paper's tail, P(σ > 2n), needs 2n + 1 bins;
  protocol.histogram_bins gives 4λ + 1)."""
  histogram = np.asarray(histogram)
  if threshold + 1 >= len(histogram):
    raise ValueError(f"P(σ > {threshold}) needs more than {threshold + 1} "
                     f"histogram bins; this one has {len(histogram)}.")
  total = histogram.sum()
  return float(histogram[threshold + 1:].sum() / total) if total else 0.0


@dataclasses.dataclass(frozen=True)
class ShardReport:
  """One shard's counters.

  Attributes:
    timestamp: updates this shard applied.
    gradients: gradients it received (accepted and dropped).
    pending: accepted gradients waiting for the next update.
    dropped: gradients refused by max_staleness.
    duplicates: pushes refused because an earlier run of the same scheduled
      closure had already delivered them (a learner died and TF re-ran its
      closure); not counted in `gradients`.
    learner_gradients: int64 array, gradients received from each learner.
    histogram: int64 array, histogram[σ] = gradients received with staleness
      σ; the last bin counts σ >= its index.
    mean: exact mean staleness of the received gradients (0 if none).
    max: largest staleness received.
  """
  timestamp: int
  gradients: int
  pending: int
  dropped: int
  histogram: np.ndarray
  mean: float
  max: int
  duplicates: int = 0
  learner_gradients: np.ndarray = None

  @classmethod
  def from_counters(cls, counters):
    """The report of a shard's `transition.Counters`."""
    received = int(counters.received)
    return cls(timestamp=int(counters.timestamp), gradients=received,
               pending=int(counters.pending), dropped=int(counters.dropped),
               histogram=np.asarray(counters.histogram, np.int64),
               mean=(float(counters.staleness_sum) / received if received
                     else 0.0),
               max=int(counters.staleness_max),
               duplicates=int(counters.duplicates),
               learner_gradients=np.asarray(counters.learners, np.int64))


@dataclasses.dataclass(frozen=True)
class StalenessReport(ShardReport):
  """Counters of the whole parameter server.

  The top-level fields are those of the first shard (the ps task holding the
  first trainable variable); with several shards each has its own clock and
  histogram, all in `shards`. Every shard receives every push, so after a
  fit their `gradients` agree.

  The exact invariant of every shard:
  `timestamp * gradients_per_update + pending == gradients - dropped`.
  """
  protocol: str = ""
  num_learners: int = 0
  gradients_per_update: int = 0
  shards: tuple = ()

  @classmethod
  def from_shards(cls, protocol, shard_counters):
    shards = tuple(ShardReport.from_counters(counters)
                   for counters in shard_counters)
    first = dataclasses.asdict(shards[0])
    return cls(**first, protocol=protocol.name,
               num_learners=protocol.num_learners,
               gradients_per_update=protocol.gradients_per_update,
               shards=shards)

  @classmethod
  def empty(cls, protocol, bins):
    zeros = ShardReport.from_counters(
        transition.Counters.initial(protocol, bins))
    return cls(**dataclasses.asdict(zeros), protocol=protocol.name,
        num_learners=protocol.num_learners,
        gradients_per_update=protocol.gradients_per_update, shards=())

  def since(self, earlier):
    """What the shards counted after `earlier` (a report of this strategy
    taken before this one), as plain numbers: updates, gradients, dropped
    and duplicates of the first shard, and the mean and max staleness of
    the gradients received in between."""
    mean, largest = histogram_delta_stats(earlier.histogram, self.histogram)
    return {"updates": self.timestamp - earlier.timestamp,
            "gradients": self.gradients - earlier.gradients,
            "dropped": self.dropped - earlier.dropped,
            "duplicates": self.duplicates - earlier.duplicates,
            "staleness_mean": mean, "staleness_max": largest}

  def summary(self):
    """A one-line human summary."""
    last = int(np.max(np.nonzero(self.histogram)[0], initial=0))
    return (f"{self.protocol} (λ={self.num_learners}, "
            f"c={self.gradients_per_update}): updates={self.timestamp} "
            f"gradients={self.gradients} pending={self.pending} "
            f"dropped={self.dropped} duplicates={self.duplicates} "
            f"staleness mean={self.mean:.3f} "
            f"max={self.max} histogram={self.histogram[:last + 1].tolist()}")
