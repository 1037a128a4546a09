r"""Side-by-side throughput: one process, TensorFlow's strategies, Rudra's protocols.

  python -m benchmarks.throughput --models=mlp,small_cnn --learners=1,2,4 \
      --out_dir=runs/bench

Every contender trains the same model on the same data (Fashion-MNIST by
default) on a local cluster of separate processes on 127.0.0.1 (1 ps task
where there is one), one after the other in this one run:

* single: one process, no cluster (the machine's limit), at μ per step;
* single:global_batch: the same process at μλ per step, the global batch of
  λ learners (a row of λ learners: one step of each is one such step);
* parameter_server[:fast]: TensorFlow's stock ParameterServerStrategy
  (async); ":fast" runs 20 steps per scheduled closure;
* multi_worker_mirrored: MultiWorkerMirroredStrategy (synchronous
  all-reduce; λ learners are the chief and λ-1 workers);
* rudra:<protocol>[:fast]: RudraStrategy; ":fast" runs 20 steps per scheduled
  closure (steps_per_execution) and pulls without the shard lock;
* rudra:<protocol>:keras3: RudraStrategy training the model built with
  Keras 3 (its fit through rudra_tf/keras3_training.py), beside the same
  protocol with tf_keras (every other contender).

Each run trains two epochs of --steps_per_epoch steps and times the second.
Figures: updates/s, pushes/s (gradients computed and sent), examples/s, the
ratios of examples/s to the stock ParameterServerStrategy with the same λ and
to the single process, the CPU each kind of task used during the timed
epoch (cores; "all" sums every task, so on this 2-core machine 2.0 is a
full machine), the CPU of all tasks per gradient, and the peak memory of
each kind of task. With
--straggler_ms=SLOW,BASE learner 0 sleeps SLOW ms a step and the others
BASE ms (launch/train.py --emulated_step_ms), for the contenders that give
each learner its own input pipeline (Rudra's, MultiWorkerMirrored).
Writes OUT_DIR/throughput.json and OUT_DIR/throughput.md.
"""

import os
import subprocess
import sys

from absl import app
from absl import flags

from benchmarks import results
from launch import local_cluster
from launch import reports

CONTENDERS = ("single", "single:global_batch", "parameter_server",
              "parameter_server:fast",
              "multi_worker_mirrored",
              "rudra:hardsync", "rudra:1-softsync", "rudra:2-softsync",
              "rudra:async", "rudra:async:fast",
              # The same model built and trained with Keras 3.
              "rudra:hardsync:keras3", "rudra:2-softsync:keras3",
              "rudra:async:keras3")
FAST_STEPS_PER_EXECUTION = 20

FLAGS = flags.FLAGS


def validate_contenders(names):
  for name in names:
    if name not in CONTENDERS:
      raise ValueError(f"Unknown contender {name!r}; valid contenders are "
                       f"{', '.join(CONTENDERS)}.")


def applicable(contender, num_learners, straggler):
  """Whether the contender runs at this λ (and with a straggler)."""
  if contender == "single":
    return num_learners == 1 and not straggler
  if contender == "single:global_batch":
    return num_learners >= 2 and not straggler  # λ = 1 is "single"
  if contender == "multi_worker_mirrored":
    return num_learners >= 2
  if contender.startswith("parameter_server"):
    return not straggler  # one input pipeline for all: no per-learner delay
  protocol = contender.split(":")[1]  # rudra:<protocol>[:fast|:keras3]
  if protocol.endswith("-softsync"):
    return int(protocol.split("-")[0]) < num_learners  # n = λ is async
  return protocol != "hardsync" or num_learners > 1


def task_command(contender, model, num_learners, out, straggler):
  parts = contender.split(":")
  command = [sys.executable, "-m", "benchmarks.task", f"--strategy={parts[0]}",
             f"--model={model}", f"--dataset={FLAGS.dataset}",
             f"--minibatch={FLAGS.minibatch * (num_learners if contender == 'single:global_batch' else 1)}",
             f"--steps_per_epoch={FLAGS.steps_per_epoch}", f"--out={out}",
             "--lr=0.01", "--lr_policy=none"]
  command.append(f"--protocol={parts[1] if parts[0] == 'rudra' else 'async'}")
  if parts[-1] == "keras3":
    command.append("--keras=keras3")
  if parts[-1] == "fast":
    command.append(f"--steps_per_execution={FAST_STEPS_PER_EXECUTION}")
    if parts[0] == "rudra":
      command.append("--noconsistent_pulls")
  if straggler:
    slow, base = straggler
    command.append("--emulated_step_ms=" + ",".join(
        [slow] + [base] * (num_learners - 1)))
  return command


def run_one(contender, model, num_learners, straggler, out):
  """Runs one contender; returns its figures with peak memory per task."""
  command = task_command(contender, model, num_learners, out, straggler)
  if contender.startswith("single"):
    code = subprocess.run(command, check=False).returncode
  else:
    mirrored = contender == "multi_worker_mirrored"
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environment = dict(os.environ, PYTHONPATH=repo)
    code = local_cluster.LocalProcessCluster(
        command, num_learners=num_learners - 1 if mirrored else num_learners,
        num_ps=0 if mirrored else 1, environment=environment,
        chief_computes=mirrored).run()
  if code != 0:
    raise RuntimeError(f"{contender} λ={num_learners} {model} failed "
                       f"(exit code {code})")
  return results.read_figures(out)


def add_ratios(rows):
  """Ratios to stock PS (same model, λ, straggler) and to the single process.

  `vs_parameter_server` and `vs_single` divide examples/s, and so pushes/s
  (every contender has the same μ); `updates_vs_parameter_server` and
  `updates_vs_single` divide updates/s; `vs_tf_keras` (a Keras 3 row)
  divides its examples/s by the same protocol's with tf_keras;
  `vs_single_global_batch` by the single process's at μλ per step (the
  same global batch: a process at μ leaves cores idle that λ learners
  fill); `vs_parameter_server_fast` (a ":fast" row) by stock's ":fast"
  (both 20 steps per closure).
  """
  def find(contender, model, learners, straggler, repeat):
    for other in rows:
      if (other["contender"], other["model"], other["learners"],
          other["straggler"], other.get("repeat", 0)) == (
              contender, model, learners, straggler, repeat):
        return other
    return None
  def divided(row, other, figure="examples_per_s"):
    return row[figure] / other[figure] if other else None
  for row in rows:
    repeat = row.get("repeat", 0)
    same_point = (row["model"], row["learners"], row["straggler"], repeat)
    tf_keras_row = (find(row["contender"][:-len(":keras3")], *same_point)
                    if row["contender"].endswith(":keras3") else None)
    stock = find("parameter_server", *same_point)
    stock_fast = (find("parameter_server:fast", *same_point)
                  if row["contender"].endswith(":fast") else None)
    single = find("single", row["model"], 1, "", repeat)
    global_batch = find("single:global_batch", row["model"], row["learners"],
                        "", repeat)
    row["vs_tf_keras"] = divided(row, tf_keras_row)
    row["vs_parameter_server"] = divided(row, stock)
    row["vs_parameter_server_fast"] = divided(row, stock_fast)
    row["vs_single"] = divided(row, single)
    row["vs_single_global_batch"] = divided(row, global_batch)
    row["updates_vs_parameter_server"] = divided(row, stock, "updates_per_s")
    row["updates_vs_single"] = divided(row, single, "updates_per_s")
  return rows


# Figures and ratios a row of several repeats gives as their median; the
# ratios also with their range (each repeat's ratio is of two runs of that
# repeat, side by side).
_MEDIAN_FIGURES = ("updates_per_s", "pushes_per_s", "examples_per_s",
                   "staleness_mean", "cpu_ms_per_push")
_RATIOS = ("vs_parameter_server", "vs_parameter_server_fast", "vs_single",
           "vs_single_global_batch", "vs_tf_keras",
           "updates_vs_parameter_server", "updates_vs_single")


def combine_repeats(rows):
  """One row per (model, λ, contender, straggler) from rows of several
  repeats (with ratios already added): the median of each figure and
  ratio, each ratio's [min, max] as `<ratio>_range`, and `repeats`."""
  groups = {}
  for row in rows:
    key = (row["model"], row["learners"], row["contender"], row["straggler"])
    groups.setdefault(key, []).append(row)
  combined = []
  for runs in groups.values():
    row = dict(runs[len(runs) // 2], repeats=len(runs))
    row.pop("repeat", None)
    for name in _MEDIAN_FIGURES + _RATIOS:
      values = [run[name] for run in runs if run.get(name) is not None]
      row[name] = results.median(values) if values else None
      if name in _RATIOS and len(values) > 1:
        row[f"{name}_range"] = [min(values), max(values)]
    combined.append(row)
  return combined


def _ratio(row, name):
  """A ratio cell: the median, and its range over the repeats if any."""
  cell = results.format_figure(row.get(name), ".2f")
  spread = row.get(f"{name}_range")
  if spread:
    cell += f" ({spread[0]:.2f}–{spread[1]:.2f})"
  return cell


def _cpu_cores(cores):
  """"chief / worker / ps = all" cores (the single process counts as chief)."""
  parts = [cores.get("chief", cores.get("single", 0.0)),
           cores.get("worker", 0.0), cores.get("ps", 0.0)]
  return (" / ".join(results.format_figure(part, ".2f") for part in parts) +
          f" = {results.format_figure(cores.get('total'), '.2f')}")


def markdown(rows):
  lines = ["| model | λ | straggler (ms) | contender | updates/s | pushes/s | "
           "examples/s | vs stock PS | vs stock PS:fast | vs single | "
           "vs single at μλ | vs tf_keras | updates/s vs stock PS / single | "
           "σ mean | CPU cores (chief / worker / ps = all) | CPU ms per push | "
           "memory MB (chief / worker / ps) |", "|---" * 17 + "|"]
  for row in rows:
    memory = row["memory_mb"]
    lines.append(
        f"| {row['model']} | {row['learners']} | {row['straggler'] or '–'} | "
        f"{row['contender']} | {row['updates_per_s']:.1f} | "
        f"{row['pushes_per_s']:.1f} | {row['examples_per_s']:.0f} | "
        f"{_ratio(row, 'vs_parameter_server')} | "
        f"{_ratio(row, 'vs_parameter_server_fast')} | "
        f"{_ratio(row, 'vs_single')} | "
        f"{_ratio(row, 'vs_single_global_batch')} | "
        f"{_ratio(row, 'vs_tf_keras')} | "
        f"{results.format_figure(row['updates_vs_parameter_server'], '.2f')}"
        f" / {results.format_figure(row['updates_vs_single'], '.2f')} | "
        f"{results.format_figure(row['staleness_mean'], '.2f')} | "
        f"{_cpu_cores(row['cpu_cores'])} | "
        f"{results.format_figure(row['cpu_ms_per_push'], '.1f')} | "
        f"{memory.get('chief', memory.get('single', 0)):.0f} / "
        f"{memory.get('worker', 0):.0f} / {memory.get('ps', 0):.0f} |")
  return "\n".join(lines) + "\n"


def define_flags():
  """The flags of this script (defined when it runs, not on import)."""
  flags.DEFINE_list("models", ["mlp", "small_cnn"], "Models to time.")
  flags.DEFINE_string("dataset", "fashion_mnist", "Data set.")
  flags.DEFINE_list("learners", ["1", "2", "4"], "λ values.")
  flags.DEFINE_list("contenders", list(CONTENDERS),
                    f"Any of {', '.join(CONTENDERS)}.")
  flags.DEFINE_integer("minibatch", 32, "μ per learner.")
  flags.DEFINE_integer("steps_per_epoch", 200, "Steps per epoch (a step: one "
                       "gradient on Rudra/stock PS, λ gradients on MWMS).")
  flags.DEFINE_list("straggler_ms", [], "SLOW,BASE: emulated step times of "
                    "learner 0 and of the others (empty: real compute only).")
  flags.DEFINE_string("out_dir", "runs/throughput", "Where results go.")
  flags.DEFINE_integer("repeats", 1, "Runs of every contender, alternating "
                       "the order; figures and ratios are the median, "
                       "ratios with their range.")


def main(argv):
  del argv
  try:
    validate_contenders(FLAGS.contenders)
    learners = [int(v) for v in FLAGS.learners]
    if FLAGS.straggler_ms and len(FLAGS.straggler_ms) != 2:
      raise ValueError("--straggler_ms takes SLOW,BASE, got "
                       f"{','.join(FLAGS.straggler_ms)}.")
  except ValueError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  straggler = tuple(FLAGS.straggler_ms)
  rows = []
  for repeat in range(FLAGS.repeats):
    # Every other repeat runs the contenders in reverse order, so that a
    # drift of the machine over the run does not favour one side of a pair.
    contenders = (FLAGS.contenders if repeat % 2 == 0 else
                  list(reversed(FLAGS.contenders)))
    for model in FLAGS.models:
      for num_learners in learners:
        for contender in contenders:
          if not applicable(contender, num_learners, straggler):
            continue
          out = os.path.join(FLAGS.out_dir, "runs", f"{model}_{num_learners}_"
                             f"{contender.replace(':', '_')}_{repeat}")
          print(f"== {model} λ={num_learners} {contender} (repeat "
                f"{repeat + 1}/{FLAGS.repeats})", flush=True)
          figures = run_one(contender, model, num_learners, straggler, out)
          rows.append({"model": model, "learners": num_learners,
                       "contender": contender, "repeat": repeat,
                       "straggler": ",".join(straggler), **figures})
          print(f"   {figures['examples_per_s']:.0f} examples/s", flush=True)
  add_ratios(rows)
  rows = combine_repeats(rows)
  table = markdown(rows)
  reports.write_rows_and_table(FLAGS.out_dir, "throughput", rows, table)
  print(table)
  return 0


if __name__ == "__main__":
  define_flags()
  app.run(main)
