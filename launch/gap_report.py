r"""Gap-aware's divisor, epoch by epoch: the rows of a gap_aware sweep as a table.

  python -m launch.sweep --backend=simulator --learners=30 --minibatches=4 \
      --protocols=async --lr_policies=none --compensations=gap_aware \
      --momentums=0.9,0 --epochs=10 --lr=0.02 --out_dir=runs/gaps
  python -m launch.gap_report --sweep=runs/gaps

Simulated gap_aware points keep, per epoch, the means of their divisor's
parts over every parameter of every accepted gradient (rudra_tf/simulate.py's
GapLog): the distance |θ_now − θ_pulled|, the typical step C, the divisor
G = 1 + distance / C and the damping 1/G. This prints them per point and
epoch, mean (range) over the seeds, and writes OUT_DIR/gaps.json (the
averaged rows) and gaps.md (the table).

A seed whose weights went NaN has NaN means from then on; an epoch is
averaged over the seeds that have a finite value there (the `seeds` column
counts those, per statistic, at the last epoch).
"""

import math
import sys

from absl import app
from absl import flags

from launch import lr_grid
from launch import reports
from launch import sweep

FLAGS = flags.FLAGS

# The order GapLog writes them in, with what each is in words.
STATISTICS = (
    ("distance", "mean abs(θ_now − θ_pulled)"),
    ("typical_step", "mean C"),
    ("divisor", "mean G"),
    ("damping", "mean 1/G"),
)


def define_flags():
  flags.DEFINE_string("sweep", None, "a launch.sweep out_dir (or the "
                      "results.json it wrote) with gap_aware points.")
  # launch.sweep (imported for its rows) defines --out_dir already.
  FLAGS.set_default("out_dir", "runs/gap_report")


def _finite(values):
  return [v for v in values if v is not None and math.isfinite(v)]


def averaged_gaps(rows):
  """Per gap_aware point (its seeds together) and statistic: the per-epoch
  mean, min and max over the seeds with a finite value."""
  groups = {}
  for row in rows:
    if row.get("epoch_gaps"):
      key = sweep.point_key(dict(row, seed="*"))
      groups.setdefault(key, []).append(row)
  if not groups:
    raise ValueError("no row has epoch_gaps: only simulated gap_aware "
                     "points log their divisor.")
  averaged = []
  for key in sorted(groups):
    runs = groups[key]
    epochs = max(len(r["epoch_gaps"]) for r in runs)
    for name, _ in STATISTICS:
      per_epoch = [_finite([r["epoch_gaps"][e][name] for r in runs
                            if e < len(r["epoch_gaps"])])
                   for e in range(epochs)]
      averaged.append({
          "protocol": runs[0]["protocol"], "lr_policy": runs[0]["lr_policy"],
          "momentum": runs[0].get("momentum", sweep.DEFAULT_MOMENTUM),
          "learners": runs[0]["learners"], "minibatch": runs[0]["minibatch"],
          "statistic": name, "seeds": len(per_epoch[-1]),
          "mean": [sum(v) / len(v) if v else None for v in per_epoch],
          "min": [min(v) if v else None for v in per_epoch],
          "max": [max(v) if v else None for v in per_epoch]})
  return averaged


def _cell(mean, low, high):
  if mean is None:
    return "NaN"
  if low == high:
    return f"{mean:.4g}"
  return f"{mean:.4g} ({low:.4g}–{high:.4g})"


def markdown(averaged):
  """A line per point and statistic, a column per epoch."""
  epochs = max(len(row["mean"]) for row in averaged)
  words = dict(STATISTICS)
  lines = ["| protocol | lr_policy | momentum | μ | λ | statistic | seeds | "
           + " | ".join(f"epoch {e + 1}" for e in range(epochs)) + " |",
           "|---" * (7 + epochs) + "|"]
  for row in averaged:
    cells = [_cell(*values) for values in zip(row["mean"], row["min"],
                                               row["max"])]
    cells += [""] * (epochs - len(cells))
    lines.append(f"| {row['protocol']} | {row['lr_policy']} | "
                 f"{row['momentum']:g} | {row['minibatch']} | "
                 f"{row['learners']} | {words[row['statistic']]} | "
                 f"{row['seeds']} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  try:
    if not FLAGS.sweep:
      raise ValueError("--sweep is required: a launch.sweep out_dir or its "
                       "results.json, with gap_aware points.")
    averaged = averaged_gaps(lr_grid.sweep_rows(FLAGS.sweep))
  except ValueError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  table = markdown(averaged)
  reports.write_rows_and_table(FLAGS.out_dir, "gaps", averaged, table)
  print(table)
  return 0


if __name__ == "__main__":
  define_flags()
  app.run(main)
