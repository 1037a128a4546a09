r"""The learning-rate sensitivity of a sweep: one sweep per α0, side by side.

  for lr in 0.005 0.01 0.02 0.05; do
    python -m launch.sweep --backend=simulator --learners=30 \
        --minibatches=4 --protocols=hardsync,10-softsync,async \
        --lr_policies=none,divide_by_n --seeds=0,1,2 --lr=$lr \
        --out_dir=runs/lr_grid/lr$lr
  done
  python -m launch.lr_grid --sweeps=0.005=runs/lr_grid/lr0.005,\
0.01=runs/lr_grid/lr0.01,0.02=runs/lr_grid/lr0.02,0.05=runs/lr_grid/lr0.05 \
      --out_dir=runs/lr_grid

A sweep's point key has no α0 in it (launch/sweep.py), so each α0 is its
own sweep, named here with its α0: an out_dir, or the results.json a sweep
wrote there (the per-seed rows, as committed under docs/study/). Rows that
record their α0 must agree with the name (rows of older sweeps do not
record it).

Hardsync's update does not depend on lr_policy (σ = 0 and n = 1: every
policy multiplies α0 by 1), so a hardsync row run with one policy stands for
the others where they were not run.

Writes OUT_DIR/lr_grid.json (the rows averaged over seeds, with α0),
lr_grid.md (test error, mean (range) over seeds, per protocol and policy
against α0) and lr_grid.png (test error against n, one panel per
lr_policy, a line per α0, the seeds' range as the error bar).
"""

import json
import os
import sys

from absl import app
from absl import flags

from launch import reports
from launch import sweep

FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_list("sweeps", None, "ALPHA=DIR pairs: a launch.sweep out_dir "
                    "(or the results.json it wrote) and the α0 (--lr) its "
                    "points ran at.")
  # launch.sweep (imported for its averaging) defines --out_dir already.
  FLAGS.set_default("out_dir", "runs/lr_grid")


def parse_sweeps(pairs):
  """[(α0, folder)] from "ALPHA=DIR" texts, refusing malformed ones."""
  parsed = []
  for pair in pairs:
    alpha, _, folder = pair.partition("=")
    try:
      value = float(alpha)
    except ValueError:
      value = -1.0
    if not folder or value <= 0:
      raise ValueError(f"--sweeps takes ALPHA=DIR with ALPHA > 0, got "
                       f"{pair!r} (e.g. 0.02=runs/lr_grid/lr0.02).")
    parsed.append((value, folder))
  if len({alpha for alpha, _ in parsed}) < len(parsed):
    raise ValueError(f"--sweeps names an α0 twice: {','.join(pairs)}.")
  return parsed


def rows_at(alpha, rows):
  """The rows of one α0's sweep, tagged with it; hardsync rows copied to the
  policies the sweep has but hardsync was not run with."""
  for row in rows:
    if "lr" in row and row["lr"] != alpha:
      raise ValueError(f"a row of the α0 = {alpha:g} sweep ran at lr = "
                       f"{row['lr']:g}: {sweep.point_key(row)}.")
  policies = {row["lr_policy"] for row in rows}
  ran = {(sweep.point_key(row)) for row in rows}
  tagged = [dict(row, lr=alpha) for row in rows]
  for row in rows:
    if row["protocol"] != "hardsync":
      continue
    for policy in policies:
      copy = dict(row, lr=alpha, lr_policy=policy)
      if sweep.point_key(copy) not in ran:
        ran.add(sweep.point_key(copy))
        tagged.append(copy)
  return tagged


def sweep_rows(source):
  """A sweep's per-seed rows: from its out_dir's points, or a results.json."""
  if source.endswith(".json"):
    if not os.path.isfile(source):
      raise ValueError(f"{source} does not exist.")
    with open(source) as stream:
      rows = json.load(stream)
    if not isinstance(rows, list) or not all("seed" in r for r in rows):
      raise ValueError(f"{source} is not a sweep's results.json (a list of "
                       "per-seed rows).")
    return rows
  if not os.path.isdir(os.path.join(source, "points")):
    raise ValueError(f"{source} has no points/: not a launch.sweep out_dir "
                     "(nor a results.json).")
  return sweep.finished_rows(source)


def average(sweeps, read_rows=sweep_rows):
  """Rows averaged over seeds (launch.sweep's averaging), each with its α0."""
  averaged = []
  for alpha, source in sweeps:
    for row in sweep.average_over_seeds(rows_at(alpha, read_rows(source))):
      averaged.append(dict(row, lr=alpha))
  return averaged


def markdown(averaged):
  """Per protocol and lr_policy, the test error at each α0."""
  alphas = sorted({row["lr"] for row in averaged})
  cells = {}
  for row in averaged:
    key = (row["n"], row["protocol"], row["lr_policy"], row["learners"],
           row["minibatch"])
    cells.setdefault(key, {})[row["lr"]] = sweep.error_text(row)
  lines = ["| protocol | n | lr_policy | μ | λ | " + " | ".join(
      f"α0 = {alpha:g}" for alpha in alphas) + " |",
           "|---" * (5 + len(alphas)) + "|"]
  # By policy, then n (hardsync before 1-softsync), then λ and μ.
  for key in sorted(cells, key=lambda k: (k[2], k[0], k[1] != "hardsync",
                                          k[1], k[3], k[4])):
    n, protocol, policy, learners, minibatch = key
    lines.append(f"| {protocol} | {n} | {policy} | {minibatch} | {learners} | "
                 + " | ".join(cells[key].get(alpha, "–") for alpha in alphas)
                 + " |")
  return "\n".join(lines) + "\n"


def plot(averaged, path):
  """Test error against n, a panel per lr_policy, a line per α0."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  policies = sorted({row["lr_policy"] for row in averaged})
  figure, axes = pyplot.subplots(1, len(policies),
                                 figsize=(6 * len(policies), 5), sharey=True,
                                 squeeze=False)
  alphas = sorted({row["lr"] for row in averaged})
  # One colour per α0 in every panel, so a rate is the same line throughout.
  colours = {alpha: f"C{index}" for index, alpha in enumerate(alphas)}
  for axis, policy in zip(axes[0], policies):
    for alpha in alphas:
      chosen = sorted((r for r in averaged
                       if r["lr_policy"] == policy and r["lr"] == alpha),
                      key=lambda r: r["n"])
      if chosen:
        axis.errorbar([r["n"] for r in chosen],
                      [r["test_error"] for r in chosen],
                      yerr=sweep.error_bars(chosen), fmt="o-", capsize=3,
                      color=colours[alpha], label=f"α0 = {alpha:g}")
    axis.set_xscale("log")
    axis.set_xlabel("n (hardsync: 1; async: λ)")
    axis.set_title(f"lr_policy {policy}")
    axis.legend(fontsize=8)
  axes[0][0].set_ylabel("test error (seeds' range)")
  figure.tight_layout()
  figure.savefig(path, dpi=100)
  pyplot.close(figure)


def main(argv):
  del argv
  try:
    sweeps = parse_sweeps(FLAGS.sweeps or [])
    if not sweeps:
      raise ValueError("--sweeps is required: ALPHA=DIR,... (one "
                       "launch.sweep out_dir, or its results.json, per α0).")
    averaged = average(sweeps)
  except ValueError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  table = markdown(averaged)
  reports.write_rows_and_table(FLAGS.out_dir, "lr_grid", averaged, table)
  plot(averaged, os.path.join(FLAGS.out_dir, "lr_grid.png"))
  print(table)
  return 0


if __name__ == "__main__":
  define_flags()
  app.run(main)
