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

Exit code 0 when all hold, 1 otherwise. Writes OUT_DIR/soak.json.
"""

import json
import math
import os
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags

import psutil

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

STEPS_PER_EPOCH = 2000


def _task_name(process):
  try:
    config = json.loads(process.environ().get("TF_CONFIG", "{}"))
  except (psutil.Error, ValueError):
    return None
  task = config.get("task")
  return f"{task['type']}:{task['index']}" if task else None


def _sample(job, samples):
  for child in psutil.Process(job.pid).children(recursive=True):
    name = _task_name(child)
    if name:
      try:
        samples.setdefault(name, []).append(child.memory_info().rss / 2**20)
      except psutil.Error:
        pass


def memory_growth(series):
  """Median of the last quarter over the median of the second quarter."""
  quarter = max(1, len(series) // 4)
  warm = statistics.median(series[quarter:2 * quarter] or series)
  last = statistics.median(series[-quarter:])
  return last / warm - 1


def check(results, samples, max_growth):
  """Returns (figures, failures)."""
  failures = []
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
            if len(series) >= 8}
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
  print(" ".join(command), flush=True)
  job = subprocess.Popen(command, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
  samples = {}
  next_sample = time.monotonic()
  os.set_blocking(job.stdout.fileno(), False)
  while job.poll() is None:
    for line in iter(job.stdout.readline, ""):
      if "epoch" in line or "test accuracy" in line or "error" in line:
        print(line, end="", flush=True)
    if time.monotonic() >= next_sample:
      _sample(job, samples)
      next_sample += FLAGS.sample_s
    time.sleep(0.2)
  if job.returncode != 0:
    print(f"soak: the job failed with code {job.returncode}")
    return 1
  with open(results_path) as f:
    results = json.load(f)
  figures, failures = check(results, samples, FLAGS.max_growth)
  with open(os.path.join(FLAGS.out_dir, "soak.json"), "w") as f:
    json.dump(figures, f, indent=1)
  print(f"gradients {figures['gradients']} | updates {figures['updates']} | "
        f"pending {figures['pending']} | dropped {figures['dropped']} | "
        f"duplicates {figures['duplicates']} | invariant "
        f"{'exact' if figures['invariant_exact'] else 'BROKEN'}")
  print(f"losses per epoch {[round(x, 4) for x in figures['losses']]} | "
        f"test accuracy {figures['test_accuracy']:.4f} | wall time "
        f"{figures['wall_time_s']:.0f} s")
  for name, memory in sorted(figures["memory_mb"].items()):
    growth = memory["growth"]
    print(f"{name}: RSS {memory['min']:.0f}-{memory['max']:.0f} MB, growth "
          f"second quarter -> last quarter "
          f"{'n/a' if growth is None else f'{growth:+.1%}'}")
  print("soak: " + ("PASS" if not failures else "FAIL: " + "; ".join(failures)))
  return 0 if not failures else 1


if __name__ == "__main__":
  app.run(main)
