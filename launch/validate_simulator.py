r"""Runs the same points on a real local cluster and in the simulator, side by side.

  python -m launch.validate_simulator --learners=4 --minibatches=32 \
      --protocols=hardsync,1-softsync,2-softsync,async --epochs=1 \
      --emulated_step_ms=100 --out_dir=runs/validation

Learners sleep --emulated_step_ms per step on the cluster (so that λ
learners can run at equal speeds, or with one straggler, on a machine with
fewer cores than learners) and the simulator uses the same speeds (without
--emulated_step_ms: the cluster's own speeds against the simulator's
--speed model). With --speed=replay (or measured) each simulator point
plays the push trace of its cluster point (the cluster's own step times, in
order, or drawn from each learner's own: rudra_tf/push_trace.py). The grid
flags are launch/sweep.py's. For each
protocol it prints the staleness histograms, their total-variation distance
(half the L1 distance of the normalized histograms: 0 is identical, 1
disjoint), the mean staleness and the final test accuracy of both (per point, and per protocol over its
seeds: mean and range, and the TV of the histograms pooled over seeds),
and writes OUT_DIR/validation.md, validation.json and validation.png (the
pooled histograms side by side). Points already finished in
OUT_DIR/cluster or OUT_DIR/simulator are not rerun.
"""

import os
import sys

from absl import app
from absl import flags

from launch import reports
from launch import sweep

FLAGS = flags.FLAGS  # launch/sweep.py's flags (--backend is not used)


def _padded(first, second):
  """Two histograms as lists of one length (zeros added at the end)."""
  size = max(len(first), len(second))
  return ([*first] + [0] * (size - len(first)),
          [*second] + [0] * (size - len(second)))


def total_variation(first, second):
  """Half the L1 distance between two normalized histograms."""
  first, second = _padded(first, second)
  total_first, total_second = sum(first), sum(second)
  if not total_first or not total_second:
    raise ValueError("cannot compare an empty histogram")
  return 0.5 * sum(abs(a / total_first - b / total_second)
                   for a, b in zip(first, second))


def _pairing_key(row):
  return tuple(row.get(name, 0) for name in (
      "protocol", "lr_policy", "learners", "minibatch", "seed"))


def compare(cluster_rows, simulator_rows):
  """Pairs rows of the same point (protocol, lr_policy, λ, μ and seed);
  returns the comparison rows."""
  simulated = {_pairing_key(r): r for r in simulator_rows}
  pairs = []
  for real in cluster_rows:
    sim = simulated[_pairing_key(real)]
    pairs.append({
        "protocol": real["protocol"], "lr_policy": real["lr_policy"],
        "learners": real["learners"], "minibatch": real["minibatch"],
        "seed": real.get("seed", 0),
        "histogram_cluster": real["staleness_histogram"],
        "histogram_simulator": sim["staleness_histogram"],
        "total_variation": total_variation(real["staleness_histogram"],
                                           sim["staleness_histogram"]),
        "staleness_mean_cluster": real["staleness_mean"],
        "staleness_mean_simulator": sim["staleness_mean"],
        "test_accuracy_cluster": real["test_accuracy"],
        "test_accuracy_simulator": sim["test_accuracy"],
        "wall_time_cluster_s": real["wall_time_s"],
        "simulated_time_steps": sim["simulated_time"]})
  return pairs


def markdown(pairs):
  lines = ["| protocol | lr_policy | λ | μ | seed | σ mean cluster / sim | "
           "histogram cluster | histogram sim | TV distance | "
           "test accuracy cluster / sim | cluster wall time (s) | "
           "sim. time (steps) |", "|---" * 12 + "|"]
  for p in pairs:
    lines.append(
        f"| {p['protocol']} | {p['lr_policy']} | {p['learners']} | "
        f"{p['minibatch']} | {p.get('seed', 0)} | "
        f"{p['staleness_mean_cluster']:.2f} / "
        f"{p['staleness_mean_simulator']:.2f} | {p['histogram_cluster']} | "
        f"{p['histogram_simulator']} | {p['total_variation']:.3f} | "
        f"{p['test_accuracy_cluster']:.4f} / "
        f"{p['test_accuracy_simulator']:.4f} | "
        f"{p['wall_time_cluster_s']:.1f} | "
        f"{p['simulated_time_steps']:.0f} |")
  return "\n".join(lines) + "\n"


def _mean_and_range(values):
  return (sum(values) / len(values), min(values), max(values))


def _by_protocol(pairs):
  """{(protocol, lr_policy): its pairs (one per seed)}, in first-seen order."""
  groups = {}
  for pair in pairs:
    groups.setdefault((pair["protocol"], pair["lr_policy"]), []).append(pair)
  return groups


def pooled_histograms(pairs):
  """{(protocol, lr_policy): (cluster, simulator)}: each side's histograms
  summed over seeds (bin by bin, the shorter padded with zeros)."""
  def add(total, histogram):
    return [a + b for a, b in zip(*_padded(total, histogram))]
  pooled = {}
  for key, chosen in _by_protocol(pairs).items():
    cluster, simulator = [], []
    for pair in chosen:
      cluster = add(cluster, pair["histogram_cluster"])
      simulator = add(simulator, pair["histogram_simulator"])
    pooled[key] = (cluster, simulator)
  return pooled


def summary(pairs):
  """One row per (protocol, lr_policy) over its seeds: the TV distance
  (mean and range, and of the pooled histograms), the mean σ of each
  side, and each side's test accuracy (mean and range)."""
  pooled = pooled_histograms(pairs)
  rows = []
  for key, chosen in _by_protocol(pairs).items():
    cluster, simulator = pooled[key]
    rows.append({
        "protocol": key[0], "lr_policy": key[1], "seeds": len(chosen),
        "total_variation": _mean_and_range(
            [p["total_variation"] for p in chosen]),
        "total_variation_pooled": total_variation(cluster, simulator),
        "staleness_mean_cluster": _mean_and_range(
            [p["staleness_mean_cluster"] for p in chosen]),
        "staleness_mean_simulator": _mean_and_range(
            [p["staleness_mean_simulator"] for p in chosen]),
        "test_accuracy_cluster": _mean_and_range(
            [p["test_accuracy_cluster"] for p in chosen]),
        "test_accuracy_simulator": _mean_and_range(
            [p["test_accuracy_simulator"] for p in chosen])})
  return rows


def summary_markdown(rows):
  def cell(values, digits):
    mean, low, high = values
    return f"{mean:.{digits}f} ({low:.{digits}f}–{high:.{digits}f})"
  lines = ["| protocol | lr_policy | seeds | TV distance, mean (range) | "
           "TV of the pooled histograms | σ mean cluster | σ mean sim | "
           "test accuracy cluster | test accuracy sim |", "|---" * 9 + "|"]
  for r in rows:
    lines.append(
        f"| {r['protocol']} | {r['lr_policy']} | {r['seeds']} | "
        f"{cell(r['total_variation'], 3)} | "
        f"{r['total_variation_pooled']:.3f} | "
        f"{cell(r['staleness_mean_cluster'], 2)} | "
        f"{cell(r['staleness_mean_simulator'], 2)} | "
        f"{cell(r['test_accuracy_cluster'], 4)} | "
        f"{cell(r['test_accuracy_simulator'], 4)} |")
  return "\n".join(lines) + "\n"


def plot_histograms(pairs, path):
  """The pooled staleness histograms, cluster and simulator side by side,
  one panel per protocol (fractions of the pushes)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  pooled = pooled_histograms(pairs)
  figure, axes = pyplot.subplots(1, len(pooled), squeeze=False,
                                 figsize=(4 * len(pooled), 3.5))
  for panel, ((protocol, lr_policy), (cluster, simulator)) in zip(
      axes[0], pooled.items()):
    size = max(len(cluster), len(simulator))
    for offset, (label, histogram) in zip(
        (-0.2, 0.2), (("cluster", cluster), ("simulator", simulator))):
      total = sum(histogram)
      panel.bar([b + offset for b in range(len(histogram))],
                [count / total for count in histogram], width=0.4,
                label=label)
    panel.set_xticks(range(size))
    panel.set_xlabel("staleness σ")
    panel.set_title(f"{protocol}, {lr_policy}: TV "
                    f"{total_variation(cluster, simulator):.3f}", fontsize=9)
  axes[0][0].set_ylabel("fraction of pushes (all seeds)")
  axes[0][0].legend(fontsize=8)
  figure.tight_layout()
  figure.savefig(path, dpi=100)
  pyplot.close(figure)


def main(argv):
  del argv
  try:
    points, skipped = sweep.grid(FLAGS.protocols, FLAGS.lr_policies,
                                 FLAGS.minibatches, FLAGS.learners,
                                 FLAGS.seeds)
  except ValueError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  if skipped or not points:
    print(f"error: invalid points {skipped}", file=sys.stderr)
    return 2
  config = sweep.config_from_flags()
  rows = {}
  cluster_dir = os.path.join(FLAGS.out_dir, "cluster")
  rows["cluster"] = sweep.run_points(points, {**config, "backend": "cluster"},
                                     cluster_dir)
  from rudra_tf import simulate  # pylint: disable=g-import-not-at-top
  if config["speed"] in simulate.TRACED_SPEED_MODELS:
    points = [{**point, "speed_trace": sweep.point_trace(cluster_dir, point)}
              for point in points]
  rows["simulator"] = sweep.run_points(
      points, {**config, "backend": "simulator"},
      os.path.join(FLAGS.out_dir, "simulator"))
  pairs = compare(rows["cluster"], rows["simulator"])
  table = summary_markdown(summary(pairs)) + "\n" + markdown(pairs)
  reports.write_rows_and_table(FLAGS.out_dir, "validation", pairs, table)
  plot_histograms(pairs, os.path.join(FLAGS.out_dir, "validation.png"))
  print(table)
  return 0


if __name__ == "__main__":
  app.run(main)
