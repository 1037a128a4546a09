r"""Soak: a long local run, checked for exact counts, NaN and memory growth.

  python -m benchmarks.soak --pushes=20000 --out_dir=runs/soak

Trains launch/train.py's job (λ = 4, 2-softsync, MLP on Fashion-MNIST by
default) for at least --pushes gradients, sampling the resident memory of
every task process every --sample_s seconds. At the end it checks, and
prints:

* the exact invariant of every shard: timestamp * c + pending ==
  gradients - dropped (from the results JSON the chief writes);
* no NaN: every epoch's loss and the test loss are finite;
* memory per task flat: the median RSS of each task over the last quarter
  of the run against the median over the second quarter (after warm-up).

With --kill_learner_every_s=30 a random serving learner is also SIGKILLed
about every 30 s (uniform in [15, 45] s; benchmarks/chaos.py's killer), the
launcher restarts it, and the invariant must stay exact: gradients equal to
epochs × steps_per_epoch, none applied twice.

Exit code 0 when all hold, 1 otherwise. Writes OUT_DIR/soak.json.
"""

import json
import math
import os
import statistics
import random
import sys
import threading
import time

from absl import app
from absl import flags

import psutil

from benchmarks import chaos

FLAGS = flags.FLAGS
flags.DEFINE_integer("pushes", 20000, "Gradients to push, at least.")
flags.DEFINE_integer("learners", 4, "λ.")
flags.DEFINE_string("protocol", "2-softsync", "Protocol.")
flags.DEFINE_string("model", "mlp", "Model.")
flags.DEFINE_integer("steps_per_execution", 5, "Steps per closure.")
flags.DEFINE_float("sample_s", 5.0, "Memory sampling period.")
flags.DEFINE_float("max_growth", 0.10, "Largest allowed relative growth of "
                   "a task's memory between the second and last quarter.")
flags.DEFINE_string("out_dir", "runs/soak", "Where soak.json goes.")
flags.DEFINE_float("kill_learner_every_s", None, "Also kill a random learner "
                   "about this often (seconds); the launcher restarts it.")
flags.DEFINE_integer("seed", 0, "Seed of the kill moments.")

STEPS_PER_EPOCH = 2000
# A soak that has not finished by then is stopped (and fails).
SOAK_TIMEOUT_S = 4 * 3600


def _task_name(process):
  try:
    config = json.loads(process.environ().get("TF_CONFIG", "{}"))
  except (psutil.Error, ValueError):
    return None
  task = config.get("task")
  return f"{task['type']}:{task['index']}" if task else None


def _sample(job, samples, pids):
  """Appends each task's RSS (MB) to its series; a restarted task (a new
  pid) gets a series of its own, "worker:2 #2", since a fresh process
  starts small."""
  for child in psutil.Process(job.pid).children(recursive=True):
    name = _task_name(child)
    if name:
      incarnations = pids.setdefault(name, [])
      if child.pid not in incarnations:
        incarnations.append(child.pid)
      series = name if len(incarnations) == 1 else (
          f"{name} #{incarnations.index(child.pid) + 1}")
      try:
        samples.setdefault(series, []).append(child.memory_info().rss / 2**20)
      except psutil.Error:
        pass


def memory_growth(series):
  """Median of the last quarter over the median of the second quarter."""
  quarter = max(1, len(series) // 4)
  warm = statistics.median(series[quarter:2 * quarter] or series)
  last = statistics.median(series[-quarter:])
  return last / warm - 1


def check(results, samples, max_growth, expected_gradients=None,
          restarted=()):
  """Returns (figures, failures). Memory growth is checked for the tasks
  that ran from start to end: a task in `restarted` had processes that
  lived only part of the run, each with its own start-up ramp."""
  failures = []
  if expected_gradients is not None:
    failures += chaos.check_totals(results, expected_gradients)
  c = results["gradients_per_update"]
  accepted = results["gradients"] - results["dropped"]
  exact = results["updates"] * c + results["pending"] == accepted
  if not exact:
    failures.append(f"invariant: {results['updates']} * {c} + "
                    f"{results['pending']} != {accepted}")
  losses = [row["loss"] for row in results["epochs"]] + [results["test_loss"]]
  if not all(math.isfinite(loss) for loss in losses):
    failures.append(f"non-finite loss: {losses}")
  growth = {name: memory_growth(series) for name, series in samples.items()
            if len(series) >= 8 and name.split(" #")[0] not in restarted}
  for name, value in growth.items():
    if value > max_growth:
      failures.append(f"{name} memory grew {value:.1%}")
  figures = {"gradients": results["gradients"], "updates": results["updates"],
             "pending": results["pending"], "dropped": results["dropped"],
             "duplicates": results.get("duplicates", 0),
             "gradients_per_update": c, "invariant_exact": exact,
             "losses": losses, "test_accuracy": results["test_accuracy"],
             "wall_time_s": results["wall_time_s"],
             "memory_mb": {name: {"min": min(s), "max": max(s),
                                  "growth": growth.get(name)}
                           for name, s in samples.items()}}
  return figures, failures


def main(argv):
  del argv
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  results_path = os.path.join(FLAGS.out_dir, "results.json")
  epochs = math.ceil(FLAGS.pushes / STEPS_PER_EPOCH)
  command = [sys.executable, "-m", "launch.train", f"--model={FLAGS.model}",
             "--dataset=fashion_mnist", f"--learners={FLAGS.learners}",
             "--ps_tasks=1", f"--protocol={FLAGS.protocol}",
             "--lr_policy=divide_by_n", "--lr=0.05", f"--epochs={epochs}",
             f"--steps_per_epoch={STEPS_PER_EPOCH}",
             f"--steps_per_execution={FLAGS.steps_per_execution}",
             f"--results={results_path}"]
  if FLAGS.kill_learner_every_s:
    command.append("--learner_restarts=1000")
  print(" ".join(command), flush=True)
  job = chaos.Job(command, out=print, timeout_s=SOAK_TIMEOUT_S)
  kills = []
  if FLAGS.kill_learner_every_s:
    killer = threading.Thread(target=lambda: chaos.kill_learners(
        job, 10**6, FLAGS.kill_learner_every_s, random.Random(FLAGS.seed),
        FLAGS.learners, stop_after_epoch_lines=epochs, done=kills),
                              daemon=True)
    killer.start()
  samples, pids = {}, {}
  printed = 0
  while job.running():
    for line in job.lines[printed:]:
      if "epoch" in line or "test accuracy" in line or "error" in line:
        print(line, end="", flush=True)
    printed = len(job.lines)
    _sample(job.process, samples, pids)
    time.sleep(FLAGS.sample_s)
  if job.wait() != 0:
    print("".join(job.lines[-20:]))
    print(f"soak: the job failed with code {job.process.returncode}")
    return 1
  for line in job.lines[printed:]:
    if "epoch" in line or "test accuracy" in line:
      print(line, end="", flush=True)
  with open(results_path) as f:
    results = json.load(f)
  figures, failures = check(
      results, samples, FLAGS.max_growth,
      epochs * STEPS_PER_EPOCH if FLAGS.kill_learner_every_s else None,
      restarted={name for name, incarnations in pids.items()
                 if len(incarnations) > 1})
  figures["learner_kills"] = [
      {"task": name, "after_s": round(t, 1)} for name, t in kills]
  with open(os.path.join(FLAGS.out_dir, "soak.json"), "w") as f:
    json.dump(figures, f, indent=1)
  print(f"gradients {figures['gradients']} | updates {figures['updates']} | "
        f"pending {figures['pending']} | dropped {figures['dropped']} | "
        f"duplicates {figures['duplicates']} | invariant "
        f"{'exact' if figures['invariant_exact'] else 'BROKEN'}")
  if FLAGS.kill_learner_every_s:
    print(f"learner kills {len(kills)} (every ~{FLAGS.kill_learner_every_s:g}"
          f" s: {', '.join(f'{n}@{t:.0f}s' for n, t in kills)})")
  print(f"losses per epoch {[round(x, 4) for x in figures['losses']]} | "
        f"test accuracy {figures['test_accuracy']:.4f} | wall time "
        f"{figures['wall_time_s']:.0f} s")
  for name, memory in sorted(figures["memory_mb"].items()):
    growth = memory["growth"]
    print(f"{name}: RSS {memory['min']:.0f}-{memory['max']:.0f} MB, growth "
          f"second quarter -> last quarter "
          f"{'not checked' if growth is None else f'{growth:+.1%}'}")
  print("soak: " + ("PASS" if not failures else "FAIL: " + "; ".join(failures)))
  return 0 if not failures else 1


if __name__ == "__main__":
  app.run(main)
