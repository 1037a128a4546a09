r"""The staleness distribution per protocol and learner-speed model: its mean,
its maximum and the paper's tail P(σ > 2n).

  python -m launch.staleness_tails --learners=4,30 \
      --protocols=hardsync,1-softsync,2-softsync,5-softsync,10-softsync,async \
      --speeds=equal,random:0.5,normal:0.1,normal:0.5,measured \
      --speed_trace=runs/validation/cluster/points/async__....trace/shard0.trace \
      --pushes=100000 --seeds=0,1,2 --out_dir=runs/staleness_tails

Only the protocol engine runs (`simulate.run_protocol` on a
`ProtocolServer`, no model): 100,000 pushes take about a second. A speed is
KIND or KIND:JITTER (simulate.SpeedModel: equal, random (uniform in
1 ± jitter), normal (standard deviation jitter), straggler (learner 0
4x slower), measured and replay (a cluster's push trace, --speed_trace:
each learner's traced steps drawn at random, or in order; λ larger than the
trace's plays learner i as traced learner i mod the trace's λ)).

Writes OUT_DIR/staleness_tails.json (one row per λ, protocol, speed and
seed, with the histogram up to 4λ and the simulated time of the last push,
in learner steps) and staleness_tails.md (mean over seeds, and the range of
P(σ > 2n)); prints the table.
"""

import sys

from absl import app
from absl import flags

from launch import reports

FLAGS = flags.FLAGS


def define_flags():
  """The flags of this script (defined when it runs, not on import: the
  test suite imports launch.sweep, whose --learners and --seeds these
  would clash with)."""
  flags.DEFINE_list("learners", ["4", "30"], "λ values.")
  flags.DEFINE_list("protocols", ["hardsync", "1-softsync", "2-softsync",
                                  "async"], "Protocols.")
  flags.DEFINE_list("speeds", ["equal", "random:0.5", "normal:0.5"],
                    "Speed models, KIND or KIND:JITTER.")
  flags.DEFINE_string("speed_trace", None, "The push trace that the measured "
                      "and replay speeds play (rudra_tf/push_trace.py).")
  flags.DEFINE_integer("pushes", 100_000, "Gradients per run.")
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of the speed draws.")
  flags.DEFINE_string("out_dir", "runs/staleness_tails", "Where rows go.")


def parse_speed(text):
  """'normal:0.5' -> ('normal', 0.5); 'equal' -> ('equal', None)."""
  kind, _, jitter = text.partition(":")
  if not jitter:
    return kind, None
  try:
    return kind, float(jitter)
  except ValueError:
    raise ValueError(f"--speeds entry {text!r}: the jitter after ':' must "
                     "be a number, e.g. normal:0.5.") from None


def speed_model(text, seed, trace_events):
  """The SpeedModel a --speeds entry names."""
  from rudra_tf import simulate  # pylint: disable=g-import-not-at-top
  kind, jitter = parse_speed(text)
  if kind in simulate.TRACED_SPEED_MODELS:
    if trace_events is None:
      raise ValueError(f"--speeds={text} plays a push trace: give "
                       "--speed_trace=FILE.")
    return simulate.SpeedModel.from_trace(trace_events, kind, seed=seed)
  if jitter is None:
    return simulate.SpeedModel(kind, seed=seed)
  return simulate.SpeedModel(kind, jitter=jitter, seed=seed)


def tail_statistics(staleness, n):
  """Mean, max and P(σ > 2n) of a list of σ values."""
  count = len(staleness)
  return {"staleness_mean": sum(staleness) / count,
          "staleness_max": max(staleness),
          "tail_2n": sum(s > 2 * n for s in staleness) / count}


def run(num_learners, protocol_name, speed_text, seed, pushes, trace_events):
  """One row: the statistics of `pushes` gradients."""
  from rudra_tf import protocol as protocol_lib  # pylint: disable=g-import-not-at-top
  from rudra_tf import simulate  # pylint: disable=g-import-not-at-top
  protocol = protocol_lib.parse_protocol(protocol_name, num_learners)
  server = simulate.ProtocolServer(protocol)
  pushed = simulate.run_protocol(
      server, pushes, speed_model(speed_text, seed, trace_events))
  staleness = [s for _, _, s in pushed]
  bins = 4 * num_learners + 1
  histogram = [0] * bins
  for value in staleness:
    histogram[min(value, bins - 1)] += 1
  return {"learners": num_learners, "protocol": protocol.name,
          "n": protocol.n, "speed": speed_text, "seed": seed,
          "pushes": pushes, "simulated_time": pushed[-1][0],
          **tail_statistics(staleness, protocol.n),
          "histogram": histogram}


def markdown(rows):
  """Mean over seeds per λ, protocol and speed; P(σ > 2n) with its range."""
  groups = {}
  for row in rows:
    groups.setdefault((row["learners"], row["protocol"], row["speed"]),
                      []).append(row)
  lines = ["| λ | protocol | n | speed | seeds | σ mean | σ max | "
           "P(σ > 2n) (range over seeds) | time (learner steps) |",
           "|---" * 9 + "|"]
  for (learners, protocol, speed), runs in groups.items():
    tails = [r["tail_2n"] for r in runs]
    mean_tail = sum(tails) / len(tails)
    tail = f"{mean_tail:.2g}" if mean_tail else "0"
    if len(runs) > 1 and max(tails) > min(tails):
      tail += f" ({min(tails):.2g}–{max(tails):.2g})"
    mean = sum(r["staleness_mean"] for r in runs) / len(runs)
    times = [r["simulated_time"] for r in runs if "simulated_time" in r]
    time = f"{sum(times) / len(times):.0f}" if times else "–"  # older rows
    lines.append(f"| {learners} | {protocol} | {runs[0]['n']} | {speed} | "
                 f"{len(runs)} | {mean:.2f} | "
                 f"{max(r['staleness_max'] for r in runs)} | {tail} | "
                 f"{time} |")
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  from rudra_tf import push_trace  # pylint: disable=g-import-not-at-top
  try:
    learners = [int(v) for v in FLAGS.learners]
    seeds = [int(v) for v in FLAGS.seeds]
  except ValueError:
    print(f"error: --learners={','.join(FLAGS.learners)} and --seeds="
          f"{','.join(FLAGS.seeds)} must be integers.", file=sys.stderr)
    return 2
  if FLAGS.pushes < 1:
    print(f"error: --pushes must be >= 1, got {FLAGS.pushes}.",
          file=sys.stderr)
    return 2
  from rudra_tf import protocol as protocol_lib  # pylint: disable=g-import-not-at-top
  events = push_trace.read(FLAGS.speed_trace) if FLAGS.speed_trace else None
  rows = []
  try:
    for num_learners in learners:
      for protocol in FLAGS.protocols:
        try:
          protocol_lib.parse_protocol(protocol, num_learners)
        except ValueError as error:
          print(f"skipped {protocol} at λ={num_learners}: {error}")
          continue
        for speed in FLAGS.speeds:
          for seed in seeds:
            rows.append(run(num_learners, protocol, speed, seed,
                            FLAGS.pushes, events))
  except ValueError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  table = markdown(rows)
  reports.write_rows_and_table(FLAGS.out_dir, "staleness_tails", rows, table)
  print(table)
  return 0


if __name__ == "__main__":
  define_flags()
  app.run(main)
