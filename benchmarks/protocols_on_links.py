r"""Rudra's protocols and stock ParameterServerStrategy where the network is
the bottleneck: examples/s and time to a test accuracy on rate-limited links.

  python -m benchmarks.protocols_on_links --link_mbit=100 --learners=4 \
      --repeats=2 --out_dir=runs/protocols_on_links

Every task runs on an emulated host of its own (launch/emulated_hosts.py;
needs root): the chief, λ learners and one ps task, every link at
--link_mbit each way. At the default 100 Mbit/s a small_cnn step moves 1.8
MB (a pull and a push of its 0.9 MB), 0.14 s on a learner's link and more
at the ps's, which all λ learners share, against ~10 ms of compute: the
network, not the CPU, sets the pace. Two scenarios:

* equal: every link at the same rate;
* straggler: learner 0's link at 1/--straggler_slowdown of the rate (one
  slow host, the same for every contender: stock's learners share one
  input pipeline, so a slow-compute straggler cannot be made there).

Each contender (stock ParameterServerStrategy, async; RudraStrategy with
hardsync, 1-softsync, 2-softsync, async by default; any
"rudra:<protocol>[:<lr_policy>][+<compensation>]", e.g.
"rudra:1-backup-hardsync" or "rudra:async:none+gap_aware") trains benchmarks/task.py's
AccuracyCurve: epochs of --steps_per_epoch gradients until the test
accuracy reaches --target_accuracy. Per run: examples/s and updates/s over
the epochs after the first (which traces), σ mean, the training time (the
evaluations between epochs excluded), gradients and updates to the target
(and to each of --report_accuracies, read from the same curves),
and the bytes the learners' links carried per gradient (in units of the
model's size M: a pull and a push are 2M). With --repeats > 1 the order of
the contenders alternates and each figure is the median, each ratio (to
stock's examples/s; to hardsync's time to the target, both of the same
repeat and scenario) with its range. Writes OUT_DIR/protocols_on_links.json
and .md.
"""

import json
import os
import sys

from absl import app
from absl import flags

from benchmarks import results
from launch import reports
from rudra_tf import protocol as protocol_lib

FLAGS = flags.FLAGS
CONTENDERS = ("parameter_server", "rudra:hardsync", "rudra:1-softsync",
              "rudra:2-softsync", "rudra:async")
SCENARIOS = ("equal", "straggler")
# Figures of a row given as the median over its repeats.
_MEDIAN_FIGURES = ("examples_per_s", "updates_per_s", "staleness_mean",
                   "time_to_target_s", "gradients_to_target",
                   "updates_to_target", "final_test_accuracy",
                   "learner_wire_m_per_gradient")
_RATIOS = ("vs_parameter_server", "time_vs_hardsync")


def parse_contender(value, default_lr_policy, num_learners):
  """(strategy, protocol, lr_policy, compensation) of a contender:
  "parameter_server", or "rudra:<protocol>[:<lr_policy>][+<compensation>]"
  ("rudra:async:none+gap_aware"; the lr_policy defaults to --lr_policy).
  Raises ValueError naming the bad value and the valid spellings."""
  from rudra_tf import compensation as compensation_lib  # pylint: disable=g-import-not-at-top
  if value == "parameter_server":
    return "parameter_server", "async", default_lr_policy, "none"
  spec, _, compensation = value.partition("+")
  strategy, _, rest = spec.partition(":")
  protocol, _, lr_policy = rest.partition(":")
  try:
    if strategy != "rudra" or not protocol:
      raise ValueError(value)
    protocol_lib.parse_protocol(protocol, num_learners)
    protocol_lib.validate_lr_policy(lr_policy or default_lr_policy)
    compensation_lib.Compensation.create(compensation or "none")
  except ValueError:
    raise ValueError(
        f"Unknown --contenders value {value!r}; valid values are "
        "parameter_server and rudra:<protocol>[:<lr_policy>][+<compensation>] "
        f"with a protocol of {protocol_lib.VALID_PROTOCOLS_TEXT} (λ = "
        f"{num_learners}), an lr_policy of "
        f"{', '.join(protocol_lib.LR_POLICIES)} and a compensation of "
        f"{', '.join(compensation_lib.COMPENSATIONS)} (default "
        f"{', '.join(CONTENDERS)}).") from None
  return strategy, protocol, lr_policy or default_lr_policy, (
      compensation or "none")


def task_flags(contender, out, seed):
  """benchmarks.task's flags for one run of `contender`."""
  strategy, protocol, lr_policy, compensation = parse_contender(
      contender, FLAGS.lr_policy, FLAGS.learners)
  return [f"--strategy={strategy}", f"--protocol={protocol}",
          f"--model={FLAGS.model}", "--dataset=fashion_mnist",
          f"--minibatch={FLAGS.minibatch}",
          f"--steps_per_epoch={FLAGS.steps_per_epoch}",
          f"--lr={FLAGS.lr}", f"--momentum={FLAGS.momentum}",
          f"--lr_policy={lr_policy}",
          f"--compensation={compensation}",
          f"--target_accuracy={FLAGS.target_accuracy}",
          f"--max_epochs={FLAGS.max_epochs}", f"--seed={seed}",
          f"--out={out}"]


def seed_of(repeat):
  """--seed, or --seed + repeat with --vary_seed."""
  return FLAGS.seed + repeat if FLAGS.vary_seed else FLAGS.seed


def run_one(contender, scenario, out, seed):
  """One run on fresh emulated hosts; its figures and the learners' bytes."""
  from launch import emulated_deploy  # pylint: disable=g-import-not-at-top
  from launch import emulated_hosts  # pylint: disable=g-import-not-at-top
  learners = FLAGS.learners
  with emulated_hosts.EmulatedHosts(1 + learners + 1,
                                    rate_mbit=FLAGS.link_mbit) as hosts:
    deploy = emulated_deploy.EmulatedDeploy(
        hosts, learners, 1, task_flags(contender, out, seed),
        os.path.join(out, "logs"), module="benchmarks.task")
    if scenario == "straggler":
      hosts.set_rate(deploy.host_of("worker", 0),
                     FLAGS.link_mbit / FLAGS.straggler_slowdown)
    with emulated_hosts.LinkMeter(hosts) as meter:
      deploy.start()
      code = deploy.run_until_chief_exits()
    if code != 0:
      raise RuntimeError(f"{contender} ({scenario}) failed (exit code "
                         f"{code}); logs in {out}/logs")
    learner_hosts = [deploy.host_of("worker", i) for i in range(learners)]
  figures = results.read_figures(out)
  return {**figures, "learner_wire_m_per_gradient":
          learner_wire_per_gradient(meter, figures, learner_hosts)}


def learner_wire_per_gradient(meter, figures, learner_hosts):
  """Bytes the learners' links carried (both ways) per gradient in the timed
  epoch, in units of the model's size; None if only one epoch ran."""
  curve = figures["curve"]
  if len(curve) < 2:
    return None
  moved = meter.bytes_between(figures["timed_begin"], figures["timed_end"])
  gradients = curve[1]["gradients"] - curve[0]["gradients"]
  return (sum(sum(moved[h]) for h in learner_hosts) / gradients /
          figures["model_bytes"])


def at_accuracy(rows, accuracy):
  """The rows with time, gradients and updates to `accuracy` read from each
  run's curve (the first epoch that reached it; None if none did): one
  sweep, stopped at --target_accuracy, reports any lower accuracy too."""
  timed = []
  for row in rows:
    reached = next((point for point in row["curve"]
                    if point["test_accuracy"] >= accuracy), None)
    timed.append({**row, "target_accuracy": accuracy,
                  "time_to_target_s": reached and reached["train_s"],
                  "gradients_to_target": reached and reached["gradients"],
                  "updates_to_target": reached and reached["updates"]})
  return timed


def add_ratios(rows):
  """`vs_parameter_server`: examples/s over stock's; `time_vs_hardsync`:
  time to the target over hardsync's; each of the same repeat and
  scenario (None where either run missed the target)."""
  def find(contender, scenario, repeat):
    return next((row for row in rows if (row["contender"], row["scenario"],
                                         row["repeat"]) ==
                 (contender, scenario, repeat)), None)
  for row in rows:
    stock = find("parameter_server", row["scenario"], row["repeat"])
    hardsync = find("rudra:hardsync", row["scenario"], row["repeat"])
    row["vs_parameter_server"] = (
        row["examples_per_s"] / stock["examples_per_s"]
        if stock and stock["examples_per_s"] and row["examples_per_s"]
        else None)
    row["time_vs_hardsync"] = (
        row["time_to_target_s"] / hardsync["time_to_target_s"]
        if hardsync and hardsync["time_to_target_s"] and
        row["time_to_target_s"] else None)
  return rows


def combine_repeats(rows):
  """One row per (scenario, contender): the median of each figure and ratio
  over the repeats that have it, each ratio's [min, max] as
  `<ratio>_range`, and `repeats` (how many ran) and `reached` (how many
  reached the target)."""
  groups = {}
  for row in rows:
    groups.setdefault((row["scenario"], row["contender"]), []).append(row)
  combined = []
  for (scenario, contender), runs in groups.items():
    row = {"scenario": scenario, "contender": contender,
           "repeats": len(runs),
           "reached": sum(run["time_to_target_s"] is not None
                          for run in runs)}
    for name in _MEDIAN_FIGURES + _RATIOS:
      values = [run[name] for run in runs if run.get(name) is not None]
      row[name] = results.median(values) if values else None
      if name in _RATIOS + ("time_to_target_s",) and len(values) > 1:
        row[f"{name}_range"] = [min(values), max(values)]
    combined.append(row)
  return combined


def _with_range(row, name, spec):
  cell = results.format_figure(row.get(name), spec)
  spread = row.get(f"{name}_range")
  if spread:
    cell += f" ({spread[0]:{spec}}–{spread[1]:{spec}})"
  return cell


def markdown(rows, target):
  lines = [f"| scenario | contender | examples/s | vs stock PS | updates/s | "
           f"σ mean | time to {target:g} (s) | vs hardsync | gradients to "
           f"{target:g} | updates to {target:g} | reached | final test "
           "accuracy | learner link bytes per gradient (M) |",
           "|---" * 13 + "|"]
  for row in rows:
    lines.append(
        f"| {row['scenario']} | {row['contender']} | "
        f"{results.format_figure(row['examples_per_s'], '.0f')} | "
        f"{_with_range(row, 'vs_parameter_server', '.2f')} | "
        f"{results.format_figure(row['updates_per_s'], '.1f')} | "
        f"{results.format_figure(row['staleness_mean'], '.2f')} | "
        f"{_with_range(row, 'time_to_target_s', '.0f')} | "
        f"{_with_range(row, 'time_vs_hardsync', '.2f')} | "
        f"{results.format_figure(row['gradients_to_target'], '.0f')} | "
        f"{results.format_figure(row['updates_to_target'], '.0f')} | "
        f"{row['reached']} of {row['repeats']} | "
        f"{results.format_figure(row['final_test_accuracy'], '.3f')} | "
        f"{results.format_figure(row['learner_wire_m_per_gradient'], '.2f')}"
        " |")
  return "\n".join(lines) + "\n"


def define_flags():
  """The flags of this script (defined when it runs, not on import)."""
  flags.DEFINE_list("contenders", list(CONTENDERS),
                    f"Any of {', '.join(CONTENDERS)}.")
  flags.DEFINE_list("scenarios", list(SCENARIOS),
                    f"Any of {', '.join(SCENARIOS)}.")
  flags.DEFINE_float("link_mbit", 100, "Every host link's rate (Mbit/s).")
  flags.DEFINE_float("straggler_slowdown", 4, "The straggler's link runs at "
                     "link_mbit / this.")
  flags.DEFINE_integer("learners", 4, "λ.")
  flags.DEFINE_string("model", "small_cnn", "The model (models.MODEL_NAMES).")
  flags.DEFINE_integer("minibatch", 32, "μ.")
  flags.DEFINE_integer("steps_per_epoch", 100, "Gradients per epoch (the "
                       "test accuracy is read after each).")
  flags.DEFINE_float("lr", 0.1, "α0 (SGD).")
  flags.DEFINE_float("momentum", 0.9, "SGD momentum, in [0, 1).")
  flags.DEFINE_string("lr_policy", "divide_by_n", "Rudra's lr_policy.")
  flags.DEFINE_float("target_accuracy", 0.8, "The test accuracy timed: a run "
                     "stops at the first epoch that reaches it.")
  flags.DEFINE_list("report_accuracies", [], "Lower test accuracies also "
                    "timed (read from the same runs' curves).")
  flags.DEFINE_string("from_rows", None, "Make the tables from this "
                      "protocols_on_links.json instead of running (with "
                      "--out_dir elsewhere: the tables and rows go there).")
  flags.DEFINE_integer("max_epochs", 30, "Epochs at most per run.")
  flags.DEFINE_integer("seed", 0, "Seed of the weights and shuffles.")
  flags.DEFINE_bool("vary_seed", False, "Repeat r runs with --seed + r "
                    "(each repeat a seed of its own) instead of --seed.")
  flags.DEFINE_integer("repeats", 1, "Runs of every contender, alternating "
                       "the order.")
  flags.DEFINE_string("out_dir", "runs/protocols_on_links", "Where results "
                      "go.")


def validate():
  """Raises ValueError naming a bad flag value and the valid ones."""
  for value in FLAGS.scenarios:
    if value not in SCENARIOS:
      raise ValueError(f"Unknown --scenarios value {value!r}; valid values "
                       f"are {', '.join(SCENARIOS)}.")
  for value in FLAGS.contenders:
    parse_contender(value, FLAGS.lr_policy, FLAGS.learners)
  if FLAGS.link_mbit <= 0 or FLAGS.straggler_slowdown < 1:
    raise ValueError(f"--link_mbit must be > 0 (got {FLAGS.link_mbit}) and "
                     f"--straggler_slowdown >= 1 (got "
                     f"{FLAGS.straggler_slowdown}).")
  if not 0 <= FLAGS.momentum < 1:
    raise ValueError(f"--momentum must be in [0, 1), got {FLAGS.momentum}.")
  if not 0 < FLAGS.target_accuracy < 1:
    raise ValueError(f"--target_accuracy must be in (0, 1), got "
                     f"{FLAGS.target_accuracy}.")
  for value in FLAGS.report_accuracies:
    try:
      accuracy = float(value)
    except ValueError:
      accuracy = None
    if accuracy is None or not 0 < accuracy <= FLAGS.target_accuracy:
      raise ValueError(f"--report_accuracies takes accuracies in (0, "
                       f"--target_accuracy = {FLAGS.target_accuracy:g}], "
                       f"got {value!r}.")


def main(argv):
  del argv
  try:
    validate()
  except ValueError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  if FLAGS.from_rows:
    with open(FLAGS.from_rows) as stream:
      print(write(json.load(stream)))
    return 0
  rows = []
  for repeat in range(FLAGS.repeats):
    # Every other repeat runs the contenders in reverse order, so that a
    # drift of the machine over the run does not favour one side of a pair.
    contenders = (FLAGS.contenders if repeat % 2 == 0 else
                  list(reversed(FLAGS.contenders)))
    for scenario in FLAGS.scenarios:
      for contender in contenders:
        out = os.path.join(FLAGS.out_dir, "runs", f"{scenario}_"
                           f"{contender.replace(':', '_')}_{repeat}")
        print(f"== {scenario} {contender} (repeat {repeat + 1}/"
              f"{FLAGS.repeats})", flush=True)
        figures = run_one(contender, scenario, out, seed_of(repeat))
        rows.append({"scenario": scenario, "contender": contender,
                     "repeat": repeat, "seed": seed_of(repeat),
                     "momentum": FLAGS.momentum, **figures})
        print(f"   {results.format_figure(figures['examples_per_s'], '.0f')}"
              f" examples/s, {FLAGS.target_accuracy:g} after "
              f"{results.format_figure(figures['time_to_target_s'], '.0f')} "
              "s", flush=True)
        table = write(rows)  # after every run: a long sweep keeps its rows
  print(table)
  return 0


def write(rows):
  """Writes the rows and a table per reported accuracy; returns the
  tables."""
  tables = [markdown(combine_repeats(add_ratios(at_accuracy(rows, accuracy))),
                     accuracy) for accuracy in report_accuracies()]
  table = "\n".join(tables)
  reports.write_rows_and_table(FLAGS.out_dir, "protocols_on_links", rows,
                               table)
  return table


def report_accuracies():
  return sorted({float(value) for value in FLAGS.report_accuracies} |
                {FLAGS.target_accuracy})


if __name__ == "__main__":
  define_flags()
  app.run(main)
