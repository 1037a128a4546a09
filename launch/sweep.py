r"""Sweeps protocol, lr_policy, compensation, momentum, μ and λ; writes
results rows, a table and plots.

  python -m launch.sweep --backend=simulator --learners=30 --minibatches=4 \
      --protocols=hardsync,1-softsync,2-softsync,4-softsync,async \
      --lr_policies=none,divide_by_n,divide_by_staleness --epochs=2 \
      --compensations=none,delay,gap_aware --momentums=0,0.9 \
      --out_dir=runs/sweep

Each point runs in the simulator (`rudra_tf.simulate`, one process) or on a
real local cluster (`--backend=cluster`: launch/train.py, separate
processes). Finished points are kept in OUT_DIR/points/ and not rerun, so a
sweep can be stopped and resumed. Every run rewrites OUT_DIR/results.csv,
results.json, table.md and the PNG plots from all finished points; with
--epochs > 1 each simulated point is also tested after every epoch, and
curves.md gives its test error per epoch.
"""

import csv
import functools
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import time

from absl import app
from absl import flags

from launch import flags as launch_flags
from rudra_tf import protocol as protocol_lib

flags.DEFINE_enum("backend", "simulator", ["simulator", "cluster"],
                  "Where each point runs.")
flags.DEFINE_list("protocols", ["hardsync", "1-softsync", "async"],
                  "Protocols (points with n > λ are skipped).")
flags.DEFINE_list("lr_policies", ["none", "divide_by_n"], "lr_policy values.")
flags.DEFINE_list("compensations", ["none"], "Compensation rules "
                  "(rudra_tf/compensation.py), each at its default strength "
                  "unless --compensation_strength is given.")
flags.DEFINE_float("compensation_strength", None, "λ_dc / λ0 for the delay "
                   "rules (default: each rule's own).")
flags.DEFINE_list("momentums", ["0.9"], "SGD momentum values.")
flags.DEFINE_list("minibatches", ["4"], "μ values.")
flags.DEFINE_list("learners", ["4"], "λ values.")
flags.DEFINE_string("model", "small_cnn", "Model name.")
flags.DEFINE_string("dataset", "fashion_mnist", "Data set name.")
flags.DEFINE_string("data_dir", None, "Data folder.")
flags.DEFINE_float("lr", 0.02, "Base learning rate α0.")
flags.DEFINE_integer("epochs", 1, "Epochs per point.")
flags.DEFINE_integer("steps_per_epoch", None, "Gradients per epoch "
                     "(default: one pass, train size / μ).")
flags.DEFINE_enum("speed", "equal", ["equal", "random", "normal",
                                     "straggler", "replay", "measured"],
                  "Learner-speed model (simulator; rudra_tf/simulate.py). "
                  "replay and measured play a cluster's push trace "
                  "(--speed_trace): its step times in order, or drawn from "
                  "each learner's own.")
flags.DEFINE_string("speed_trace", None, "Simulator, --speed=replay|measured:"
                    " a push trace file (rudra_tf/push_trace.py), e.g. a "
                    "cluster sweep point's OUT_DIR/points/<point>.trace/"
                    "shard0.trace.")
flags.DEFINE_list("emulated_step_ms", [], "Per-learner compute time in ms "
                  "(one value, or one per learner with learner 0 the "
                  "straggler): the cluster backend's learners sleep that "
                  "long per step (launch/train.py --emulated_step_ms) and "
                  "the simulator uses the same speeds instead of --speed.")
flags.DEFINE_float("jitter", 0.5, "Simulator, --speed=random: step times are "
                   "uniform in [1 - jitter, 1 + jitter]; --speed=normal: "
                   "normal of mean 1 and this standard deviation.")
flags.DEFINE_float("gap", 0.0, "Simulator: time from a learner's push to its "
                   "next pull, in units of a step (a cluster's scheduling "
                   "gap; about 0 with --steps_per_execution > 1).")
flags.DEFINE_integer("steps_per_execution", 1, "Cluster backend: gradients "
                     "per scheduled closure (launch/train.py's flag).")
flags.DEFINE_list("seeds", ["0"], "Seeds (each point runs once per seed; "
                  "the table gives the mean and the range over seeds).")
flags.DEFINE_string("out_dir", "runs/sweep", "Where points and reports go.")
FLAGS = flags.FLAGS

COLUMNS = ("protocol", "lr_policy", "compensation", "momentum", "minibatch",
           "learners", "n", "seed",
           "test_error", "test_accuracy", "wall_time_s", "updates",
           "gradients", "staleness_mean", "staleness_max", "simulated_time",
           "backend", "test_loss", "diverged")


DEFAULT_MOMENTUM = 0.9


def point_key(point):
  """A point's file name; the compensation and momentum appear only when
  they are not the defaults, so points of earlier sweeps keep their keys."""
  extra = ""
  if point.get("compensation", "none") != "none":
    extra += f"__{point['compensation']}"
  if point.get("momentum", DEFAULT_MOMENTUM) != DEFAULT_MOMENTUM:
    extra += f"__momentum{point['momentum']:g}"
  return (f"{point['protocol']}__{point['lr_policy']}{extra}__mu"
          f"{point['minibatch']}__lambda{point['learners']}__seed"
          f"{point['seed']}")


def grid(protocols, lr_policies, minibatches, learners, seeds=("0",),
         compensations=("none",), momentums=(DEFAULT_MOMENTUM,)):
  """The valid points, and the skipped ones with the reason."""
  from rudra_tf import compensation as compensation_lib  # pylint: disable=g-import-not-at-top
  for rule in compensations:
    compensation_lib.Compensation.create(rule)
  momentums = [_momentum(value) for value in momentums]
  points, skipped = [], []
  for (protocol, policy, rule, momentum, minibatch, num_learners,
       seed) in itertools.product(protocols, lr_policies, compensations,
                                  momentums, minibatches, learners, seeds):
    protocol_lib.validate_lr_policy(policy)
    if not str(seed).isdigit():
      raise ValueError(f"seeds must be integers >= 0, got {seed!r}.")
    if int(minibatch) < 1 or int(num_learners) < 1:
      raise ValueError(f"μ and λ must be >= 1, got {minibatch}, "
                       f"{num_learners}.")
    try:
      parsed = protocol_lib.parse_protocol(protocol, int(num_learners))
    except ValueError as error:
      reason = (protocol, policy, minibatch, num_learners, str(error))
      if reason not in skipped:  # once, not once per seed
        skipped.append(reason)
      continue
    points.append({"protocol": parsed.name, "lr_policy": policy,
                   "compensation": rule, "momentum": momentum,
                   "minibatch": int(minibatch),
                   "learners": int(num_learners), "n": parsed.n,
                   "seed": int(seed)})
  return points, skipped


def _momentum(value):
  try:
    momentum = float(value)
  except ValueError:
    momentum = -1.0
  if not 0 <= momentum < 1:
    raise ValueError(f"momentums must be numbers in [0, 1), got {value!r}.")
  return momentum


@functools.lru_cache(maxsize=2)
def _load_data(name, data_dir):
  """Each data set is read once per sweep, not once per point."""
  from rudra_tf import datasets  # pylint: disable=g-import-not-at-top
  return datasets.load_dataset(name, data_dir)


def run_simulated(point, config):
  import models  # pylint: disable=g-import-not-at-top
  from rudra_tf import simulate  # pylint: disable=g-import-not-at-top
  data = _load_data(config["dataset"], config["data_dir"])
  start = time.monotonic()
  result = simulate.simulate(
      lambda: models.build_model(config["model"], data.input_shape,
                                 data.num_classes),
      data, point["protocol"], point["learners"], point["minibatch"],
      epochs=config["epochs"], steps_per_epoch=config["steps_per_epoch"],
      learning_rate=config["lr"], lr_policy=point["lr_policy"],
      momentum=point.get("momentum", DEFAULT_MOMENTUM),
      compensation=point.get("compensation", "none"),
      compensation_strength=_strength(point, config),
      speed=speed_model(config, point),
      seed=point["seed"], evaluate_each_epoch=config["epochs"] > 1)
  report = result["report"]
  last = int(max([i for i, v in enumerate(report.histogram) if v] or [0]))
  # Gap-aware points also keep their divisor's per-epoch means (simulate.py's
  # GapLog): launch.gap_report tabulates them.
  gaps = {"epoch_gaps": result["epoch_gaps"]} if result["epoch_gaps"] else {}
  return {**gaps, "test_accuracy": result["test_accuracy"],
          "test_loss": result["test_loss"],
          "wall_time_s": time.monotonic() - start,
          "simulated_time": result["simulated_time"],
          "updates": report.timestamp, "gradients": report.gradients,
          "staleness_mean": report.mean, "staleness_max": report.max,
          "staleness_histogram": report.histogram[:last + 1].tolist(),
          "epoch_test_errors": [1.0 - accuracy for accuracy in
                                result["epoch_test_accuracy"]]}


def _strength(point, config):
  """--compensation_strength for the rules that take one, else None."""
  from rudra_tf import compensation as compensation_lib  # pylint: disable=g-import-not-at-top
  if point.get("compensation", "none") in compensation_lib.DEFAULT_STRENGTH:
    return config.get("compensation_strength")
  return None


def speed_model(config, point):
  """The simulator's speeds: a traced --speed from the point's (or the
  sweep's) push trace; else --emulated_step_ms if given; else --speed."""
  from rudra_tf import push_trace  # pylint: disable=g-import-not-at-top
  from rudra_tf import simulate  # pylint: disable=g-import-not-at-top
  if config["speed"] in simulate.TRACED_SPEED_MODELS:
    trace = point.get("speed_trace") or config.get("speed_trace")
    if not trace:
      raise ValueError(f"--speed={config['speed']} plays a push trace: give "
                       "--speed_trace=FILE (a cluster point's "
                       "points/<point>.trace/shard0.trace).")
    return simulate.SpeedModel.from_trace(push_trace.read(trace),
                                          config["speed"], seed=point["seed"])
  times = launch_flags.resolve_step_times(config.get("emulated_step_ms"),
                                         point["learners"])
  if times:
    return simulate.SpeedModel.from_step_times(times, seed=point["seed"],
                                               gap=config.get("gap", 0.0))
  return simulate.SpeedModel(config["speed"], seed=point["seed"],
                             jitter=config.get("jitter", 0.5),
                             gap=config.get("gap", 0.0))


def run_on_cluster(point, config, results_path, push_trace_dir):
  command = [sys.executable, "-m", "launch.train",
             f"--model={config['model']}", f"--dataset={config['dataset']}",
             f"--protocol={point['protocol']}",
             f"--lr_policy={point['lr_policy']}", f"--lr={config['lr']}",
             f"--learners={point['learners']}",
             f"--minibatch={point['minibatch']}",
             f"--epochs={config['epochs']}", f"--seed={point['seed']}",
             f"--results={results_path}",
             f"--steps_per_execution={config.get('steps_per_execution', 1)}",
             f"--momentum={point.get('momentum', DEFAULT_MOMENTUM)}",
             f"--compensation={point.get('compensation', 'none')}",
             f"--push_trace_dir={push_trace_dir}"]
  if _strength(point, config) is not None:
    command.append(f"--compensation_strength={_strength(point, config)}")
  if config["steps_per_epoch"]:
    command.append(f"--steps_per_epoch={config['steps_per_epoch']}")
  if config.get("emulated_step_ms"):
    command.append("--emulated_step_ms=" + ",".join(
        str(t) for t in config["emulated_step_ms"]))
  if config["data_dir"]:
    command.append(f"--data_dir={config['data_dir']}")
  # A rerun point's trace starts afresh (the file is appended to).
  shutil.rmtree(push_trace_dir, ignore_errors=True)
  subprocess.run(command, check=True)
  with open(results_path) as stream:
    result = json.load(stream)
  return {key: result[key] for key in (
      "test_accuracy", "test_loss", "wall_time_s", "updates", "gradients",
      "staleness_mean", "staleness_max", "staleness_histogram", "epochs")}


def trace_dir(out_dir, point):
  """Where a cluster point's push traces go (rudra_tf/push_trace.py)."""
  return os.path.join(out_dir, "points", point_key(point) + ".trace")


def point_trace(out_dir, point):
  """The push trace of a finished cluster point (its shard 0)."""
  from rudra_tf import push_trace  # pylint: disable=g-import-not-at-top
  return push_trace.trace_path(trace_dir(out_dir, point), 0)


def run_points(points, config, out_dir, out=print):
  """Runs every point not already finished; returns all finished rows."""
  os.makedirs(os.path.join(out_dir, "points"), exist_ok=True)
  rows = []
  for index, point in enumerate(points):
    path = os.path.join(out_dir, "points", point_key(point) + ".json")
    if os.path.exists(path):
      with open(path) as stream:
        rows.append(json.load(stream))
      out(f"[{index + 1}/{len(points)}] {point_key(point)}: done before")
      continue
    out(f"[{index + 1}/{len(points)}] {point_key(point)}: running")
    if config["backend"] == "simulator":
      result = run_simulated(point, config)
    else:
      result = run_on_cluster(point, config, path + ".train.json",
                              trace_dir(out_dir, point))
    row = {**point, **result, "backend": config["backend"],
           "lr": config["lr"], "epochs": config["epochs"],
           "test_error": 1.0 - result["test_accuracy"],
           "diverged": diverged(result["test_loss"])}
    with open(path + ".tmp", "w") as stream:
      json.dump(row, stream, indent=2)
    os.replace(path + ".tmp", path)  # a point is finished or absent
    out(f"    test error {row['test_error']:.4f}, staleness mean "
        f"{row['staleness_mean']:.2f} max {row['staleness_max']}")
    rows.append(row)
  return rows


def finished_rows(out_dir):
  """Every finished point's row in OUT_DIR/points, in key order."""
  directory = os.path.join(out_dir, "points")
  rows = []
  for name in sorted(os.listdir(directory)):
    if name.endswith(".json") and not name.endswith(".train.json"):
      with open(os.path.join(directory, name)) as stream:
        rows.append(json.load(stream))
  return rows


def write_reports(rows, out_dir):
  """results.csv, results.json, table.md and plots from finished rows."""
  with open(os.path.join(out_dir, "results.json"), "w") as stream:
    json.dump(rows, stream, indent=2)
  with open(os.path.join(out_dir, "results.csv"), "w", newline="") as stream:
    writer = csv.DictWriter(stream, COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
  table = markdown_table(rows)
  with open(os.path.join(out_dir, "table.md"), "w") as stream:
    stream.write(table)
  curves = curves_table(rows)
  if curves:
    with open(os.path.join(out_dir, "curves.md"), "w") as stream:
      stream.write(curves)
  plot_reports(rows, out_dir)
  return table


def diverged(test_loss):
  """A run diverged when its test loss is NaN or infinite (the results
  JSON of launch.train writes such a number as null)."""
  return test_loss is None or not math.isfinite(test_loss)


def average_over_seeds(rows):
  """One row per point: the mean over its seeds, with the error range."""
  groups = {}
  for row in rows:
    groups.setdefault((row["learners"], row["minibatch"], row["lr_policy"],
                       row.get("compensation", "none"),
                       row.get("momentum", DEFAULT_MOMENTUM), row["n"],
                       row["protocol"]), []).append(row)
  averaged = []
  for key in sorted(groups):
    runs = groups[key]
    errors = [r["test_error"] for r in runs]
    mean = lambda name: sum(r[name] for r in runs) / len(runs)  # pylint: disable=cell-var-from-loop
    averaged.append({
        **runs[0], "seeds": len(runs), "test_error": mean("test_error"),
        "test_error_min": min(errors), "test_error_max": max(errors),
        "diverged": sum(bool(r.get("diverged")) for r in runs),
        "staleness_mean": mean("staleness_mean"),
        "staleness_max": max(r["staleness_max"] for r in runs),
        "staleness_tail": _mean_or_none([staleness_tail(r) for r in runs]),
        "updates": mean("updates"), "wall_time_s": mean("wall_time_s"),
        **_curve_over_seeds(runs)})
  return averaged


def _curve_over_seeds(runs):
  """Per epoch, the seeds' mean test error and range (curve, curve_min,
  curve_max), over the epochs every seed has; empty for one-epoch runs."""
  curves = [r.get("epoch_test_errors") or [] for r in runs]
  epochs = min(len(curve) for curve in curves)
  if epochs < 2:
    return {"curve": [], "curve_min": [], "curve_max": []}
  per_epoch = [[curve[e] for curve in curves] for e in range(epochs)]
  return {"curve": [sum(v) / len(v) for v in per_epoch],
          "curve_min": [min(v) for v in per_epoch],
          "curve_max": [max(v) for v in per_epoch]}


def curves_table(rows):
  """Test error after each epoch, mean (range) over seeds, of the points run
  for more than one epoch; None when there are none."""
  curved = [r for r in average_over_seeds(rows) if r["curve"]]
  if not curved:
    return None
  epochs = max(len(r["curve"]) for r in curved)
  lines = ["| protocol | lr_policy | μ | λ | seeds | " + " | ".join(
      f"epoch {e + 1}" for e in range(epochs)) + " |",
           "|---" * (5 + epochs) + "|"]
  for row in curved:
    cells = [f"{mean:.4f} ({low:.4f}–{high:.4f})" if row["seeds"] > 1
             else f"{mean:.4f}" for mean, low, high in
             zip(row["curve"], row["curve_min"], row["curve_max"])]
    cells += [""] * (epochs - len(cells))
    lines.append(f"| {row['protocol']} | {rule_label(row)} | "
                 f"{row['minibatch']} | {row['learners']} | {row['seeds']} | "
                 + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def staleness_tail(row):
  """P(σ > 2n), the paper's tail, of a row's histogram (None without one)."""
  from rudra_tf import report  # pylint: disable=g-import-not-at-top
  histogram = row.get("staleness_histogram")
  if histogram is None:
    return None
  # Rows keep the histogram up to its last non-zero bin: the rest is 0.
  padded = list(histogram) + [0] * (2 * row["n"] + 2)
  return report.fraction_above(padded, 2 * row["n"])


def markdown_table(rows):
  """One line per point, averaged over its seeds (error range in brackets)."""
  lines = ["| protocol | n | lr_policy | compensation | momentum | μ | λ | "
           "μλ | seeds | test error | staleness mean | max | P(σ > 2n) | "
           "updates | wall time (s) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for row in average_over_seeds(rows):
    error = error_text(row)
    lines.append(
        f"| {row['protocol']} | {row['n']} | {row['lr_policy']} | "
        f"{row.get('compensation', 'none')} | "
        f"{row.get('momentum', DEFAULT_MOMENTUM):g} | "
        f"{row['minibatch']} | {row['learners']} | "
        f"{row['minibatch'] * row['learners']} | {row['seeds']} | {error} | "
        f"{row['staleness_mean']:.2f} | {row['staleness_max']} | "
        f"{_tail_text(row['staleness_tail'])} | "
        f"{row['updates']:.0f} | {row['wall_time_s']:.1f} |")
  return "\n".join(lines) + "\n"


def error_text(row):
  """An averaged row's test error as a table cell: the mean, the seeds'
  range in brackets, and how many seeds diverged."""
  text = f"{row['test_error']:.4f}"
  if row["seeds"] > 1:
    text += f" ({row['test_error_min']:.4f}–{row['test_error_max']:.4f})"
  if row["diverged"]:
    text += f", {row['diverged']} diverged"
  return text


def _mean_or_none(values):
  return None if None in values else sum(values) / len(values)


def _tail_text(tail):
  """P(σ > 2n) as a table cell: '0' when none, else 2 significant figures."""
  if tail is None:
    return "–"
  return "0" if tail == 0 else f"{tail:.2g}"


def rule_label(row):
  """How a point trains, for a plot's legend: "divide_by_n+delay, momentum
  0.9" (the compensation left out when it is none)."""
  rule = row["lr_policy"]
  if row.get("compensation", "none") != "none":
    rule += "+" + row["compensation"]
  return f"{rule}, momentum {row.get('momentum', DEFAULT_MOMENTUM):g}"


def seed_range(row):
  """The (below, above) error bar of an averaged row: how far its seeds'
  smallest and largest test errors lie from their mean."""
  return (row["test_error"] - row["test_error_min"],
          row["test_error_max"] - row["test_error"])


def error_bars(chosen):
  """matplotlib's yerr/xerr: the rows' (below, above) ranges, transposed."""
  return [list(side) for side in zip(*map(seed_range, chosen))]


def plot_reports(rows, out_dir):
  """sweep.png: test error against n, against μ, per point (each with its
  seeds' range as the error bar), accuracy against wall time, the
  staleness histograms, and test error per epoch (seeds' range shaded) of
  points run for more than one epoch."""
  rows = average_over_seeds(rows)
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  figure, axes = pyplot.subplots(3, 2, figsize=(14, 14))
  by_n, by_mu, per_point, by_time, histograms, by_epoch = axes.flat
  for key in sorted({(rule_label(r), r["learners"], r["minibatch"])
                     for r in rows}):
    chosen = sorted((r for r in rows if (rule_label(r), r["learners"],
                                         r["minibatch"]) == key),
                    key=lambda r: r["n"])
    by_n.errorbar([r["n"] for r in chosen], [r["test_error"] for r in chosen],
                  yerr=error_bars(chosen), fmt="o-", capsize=3,
                  label=f"{key[0]}, λ={key[1]}, μ={key[2]}")
  by_n.set_xlabel("n (hardsync and 1-softsync: n = 1; async: n = λ)")
  by_n.set_ylabel("test error (seeds' range)")
  by_n.set_title("test error against n")
  by_n.legend(fontsize=6)
  for key in sorted({(r["protocol"], rule_label(r), r["learners"])
                     for r in rows}):
    chosen = sorted((r for r in rows
                     if (r["protocol"], rule_label(r), r["learners"]) == key),
                    key=lambda r: r["minibatch"])
    by_mu.errorbar([r["minibatch"] for r in chosen],
                   [r["test_error"] for r in chosen],
                   yerr=error_bars(chosen), fmt="o-", capsize=3,
                   label=f"{key[0]}, {key[1]}, λ={key[2]}")
    for r in chosen:
      by_mu.annotate(f"μλ={r['minibatch'] * r['learners']}",
                     (r["minibatch"], r["test_error"]), fontsize=6)
  by_mu.set_xlabel("μ")
  by_mu.set_ylabel("test error (seeds' range)")
  by_mu.set_title("test error against μ and λ (points marked with μλ)")
  by_mu.legend(fontsize=6)
  labels = [f"{r['protocol']} λ={r['learners']} μ={r['minibatch']} "
            f"{rule_label(r)}" + (f" ({r['diverged']} of {r['seeds']} "
                                  "diverged)" if r["diverged"] else "")
            for r in rows]
  per_point.barh(range(len(rows)), [r["test_error"] for r in rows],
                 xerr=error_bars(rows), capsize=3)
  per_point.set_yticks(range(len(rows)), labels, fontsize=6)
  per_point.invert_yaxis()
  per_point.set_xlabel("test error (seeds' range)")
  per_point.set_title("test error per point")
  for r in rows:
    by_time.scatter(r["wall_time_s"], 1 - r["test_error"])
    by_time.annotate(f"{r['protocol']}/{rule_label(r)}/λ={r['learners']}",
                     (r["wall_time_s"], 1 - r["test_error"]), fontsize=6)
  by_time.set_xlabel("wall time (s)")
  by_time.set_ylabel("test accuracy")
  by_time.set_title("accuracy against wall time")
  for r in rows:
    histograms.plot(range(len(r["staleness_histogram"])),
                    r["staleness_histogram"], "o-",
                    label=f"{r['protocol']}, λ={r['learners']}, "
                    f"μ={r['minibatch']}, {rule_label(r)}")
  histograms.set_xlabel("staleness σ")
  histograms.set_ylabel("gradients (first seed)")
  histograms.set_title("staleness histograms")
  histograms.legend(fontsize=6)
  _plot_curves(by_epoch, [r for r in rows if r["curve"]])
  figure.tight_layout()
  figure.savefig(os.path.join(out_dir, "sweep.png"), dpi=100)
  pyplot.close(figure)


def _plot_curves(axis, rows):
  """Test error per epoch, the seeds' range shaded; no panel without any."""
  if not rows:
    axis.axis("off")
    return
  for r in rows:
    epochs = range(1, len(r["curve"]) + 1)
    axis.plot(epochs, r["curve"], "o-", label=f"{r['protocol']}, "
              f"λ={r['learners']}, μ={r['minibatch']}, {rule_label(r)}")
    axis.fill_between(epochs, r["curve_min"], r["curve_max"], alpha=0.2)
  axis.set_xlabel("epoch")
  axis.set_ylabel("test error (seeds' range)")
  axis.set_title("test error per epoch")
  axis.legend(fontsize=6)


def config_from_flags():
  """What every point of a run shares (run_points' config), from the flags."""
  return {"backend": FLAGS.backend, "model": FLAGS.model,
          "dataset": FLAGS.dataset, "data_dir": FLAGS.data_dir,
          "lr": FLAGS.lr, "epochs": FLAGS.epochs,
          "steps_per_epoch": FLAGS.steps_per_epoch, "speed": FLAGS.speed,
          "speed_trace": FLAGS.speed_trace,
          "emulated_step_ms": FLAGS.emulated_step_ms, "gap": FLAGS.gap,
          "jitter": FLAGS.jitter,
          "steps_per_execution": FLAGS.steps_per_execution,
          "compensation_strength": FLAGS.compensation_strength}


def main(argv):
  del argv
  try:
    points, skipped = grid(FLAGS.protocols, FLAGS.lr_policies,
                           FLAGS.minibatches, FLAGS.learners, FLAGS.seeds,
                           FLAGS.compensations, FLAGS.momentums)
  except ValueError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  for protocol, policy, minibatch, num_learners, reason in skipped:
    print(f"skipped {protocol}/{policy}/μ={minibatch}/λ={num_learners}: "
          f"{reason}")
  if not points:
    print("error: no valid point in the grid", file=sys.stderr)
    return 2
  run_points(points, config_from_flags(), FLAGS.out_dir)
  # The reports cover every finished point in OUT_DIR, this grid's and
  # those of earlier sweeps into it (another policy, rule or momentum).
  print(write_reports(finished_rows(FLAGS.out_dir), FLAGS.out_dir))
  print(f"reports in {FLAGS.out_dir}: results.csv results.json table.md "
        "sweep.png (and curves.md for points of several epochs)")
  return 0


if __name__ == "__main__":
  app.run(main)
