r"""Chaos: kill tasks of a local run at random moments; are the totals exact?

  python -m benchmarks.chaos --learner_kills=56 --out_dir=runs/chaos

A kill here comes from outside the job, as an operator's `kill -9` would, at
a moment drawn at random: not at a closure boundary, not at a gradient
count the fault injector picks (launch/faults.py). Each run starts
launch/train.py's local cluster (the MLP on synthetic data, λ = 3), reads
the task pids from the launcher's pid file and:

* learner runs: SIGKILLs a random serving learner every `--gap_s` seconds
  (uniform in [gap/2, 3·gap/2]) until the run has made its kills; the
  launcher restarts each one and TF re-runs its closure;
* ps and chief runs: SIGKILLs ps:0 or the chief once, at a random moment of
  the second epoch, then runs the same command again, which resumes from
  the last checkpoint (`--checkpoint_every_steps`, so inside the epoch).

A run is exact when it exits 0 and its results say: gradients == epochs ×
steps_per_epoch (no step trained twice, none lost), updates · c + pending ==
gradients − dropped, the staleness histogram and the per-learner counts
both sum to the gradients. It prints one line per run and, per protocol,
`chaos: <protocol>: k of k runs exact (n learner kills, ...)`; exit code 1
if any run was not exact. Writes OUT_DIR/chaos.json.
"""

import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIDS_VARIABLE = "RUDRA_TASK_PIDS"  # launch.local_cluster's, without its import
PROTOCOLS = ("hardsync", "1-backup-hardsync", "1-softsync", "2-softsync",
             "async")
# A learner is killed only once its (restarted) server accepts connections:
# a kill during TensorFlow's import tests the launcher, not the protocol.
SERVING_CHECK_S = 0.2
JOB_TIMEOUT_S = 600


@dataclasses.dataclass
class RunResult:
  """What one chaos run did and whether its totals were exact."""
  protocol: str
  steps_per_execution: int
  kind: str  # "learner", "ps" or "chief"
  kills: list
  expected_gradients: int
  exit_codes: list
  results: dict = None
  failures: list = dataclasses.field(default_factory=list)
  resumed_from: str = None  # ps and chief runs: the resumed run's line

  @property
  def exact(self):
    return not self.failures

  def line(self):
    counts = self.results or {}
    moments = ", ".join(f"{name}@{t:.1f}s" for name, t in self.kills)
    return (f"{self.protocol} spe={self.steps_per_execution} {self.kind}: "
            f"{len(self.kills)} kill(s) [{moments}] | gradients "
            f"{counts.get('gradients')} of {self.expected_gradients}, "
            f"duplicates {counts.get('duplicates')} | "
            + (f"{self.resumed_from} | " if self.resumed_from else "")
            + ("exact" if self.exact else "NOT EXACT: " +
               "; ".join(self.failures)))


def check_totals(results, expected_gradients):
  """The failures of a finished run's results (empty: exact)."""
  failures = []
  gradients = results["gradients"]
  if gradients != expected_gradients:
    failures.append(f"gradients {gradients} != {expected_gradients}")
  accepted = gradients - results["dropped"]
  c = results["gradients_per_update"]
  if results["updates"] * c + results["pending"] != accepted:
    failures.append(f"updates {results['updates']} * c {c} + pending "
                    f"{results['pending']} != {accepted}")
  if sum(results["staleness_histogram"]) != gradients:
    failures.append(f"histogram sums to {sum(results['staleness_histogram'])}")
  if sum(results["learner_gradients"]) != gradients:
    failures.append(f"learner counts sum to "
                    f"{sum(results['learner_gradients'])}")
  return failures


def job_command(protocol, steps_per_execution, results, *, learners=3,
                epochs=2, steps_per_epoch=1000, checkpoint_dir=None,
                checkpoint_every_steps=None, restarts=100):
  command = [sys.executable, "-m", "launch.train", "--model=mlp",
             "--dataset=synthetic", "--minibatch=8", f"--learners={learners}",
             "--ps_tasks=1", f"--protocol={protocol}", "--lr=0.05",
             f"--epochs={epochs}", f"--steps_per_epoch={steps_per_epoch}",
             f"--steps_per_execution={steps_per_execution}",
             f"--learner_restarts={restarts}", f"--results={results}"]
  if checkpoint_dir:
    command.append(f"--checkpoint_dir={checkpoint_dir}")
  if checkpoint_every_steps:
    command.append(f"--checkpoint_every_steps={checkpoint_every_steps}")
  return command


class Job:
  """A launch/train.py run whose output is collected in a thread."""

  def __init__(self, command, out=None, timeout_s=JOB_TIMEOUT_S):
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                       PYTHONPATH=REPO)
    environment.pop("TF_CONFIG", None)
    self.process = subprocess.Popen(
        command, cwd=REPO, env=environment, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    self.lines = []
    self._out = out
    self.training = threading.Event()  # the chief announced its epochs
    self.epoch_lines = 0
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()
    self._timer = threading.Timer(timeout_s, self.process.kill)
    self._timer.start()

  def _read(self):
    for line in self.process.stdout:
      self.lines.append(line)
      if "gradients per epoch" in line:
        self.training.set()
      if line.startswith("[chief:0] epoch "):
        self.epoch_lines += 1
      if self._out is not None and (line.startswith("[launcher]") or
                                    line.startswith("error")):
        self._out("    " + line.rstrip())

  def running(self):
    return self.process.poll() is None

  def wait(self):
    self.process.wait()
    self._reader.join()
    self._timer.cancel()
    return self.process.returncode

  def pids(self):
    """{"worker:1": pid, ...} from the launcher's pid file, or {}."""
    try:
      children = psutil.Process(self.process.pid).children()
      for child in children:
        path = child.environ().get(PIDS_VARIABLE)
        if path:
          with open(path) as f:
            return json.load(f)
    except (psutil.Error, OSError, ValueError):
      pass
    return {}


def _serving_learners(job, cluster_ports):
  """Names of learners whose current process serves (port open)."""
  from launch import local_cluster  # pylint: disable=g-import-not-at-top
  pids = job.pids()
  return [name for name, address in cluster_ports.items()
          if name in pids and local_cluster.port_open(address)]


def _learner_addresses(job, learners):
  """{"worker:i": address} read from a learner's TF_CONFIG."""
  deadline = time.monotonic() + 120
  while time.monotonic() < deadline and job.running():
    for child in psutil.Process(job.process.pid).children():
      try:
        config = json.loads(child.environ().get("TF_CONFIG", "{}"))
      except (psutil.Error, ValueError):
        continue
      workers = config.get("cluster", {}).get("worker", [])
      if len(workers) == learners:
        return {f"worker:{i}": a for i, a in enumerate(workers)}
    time.sleep(SERVING_CHECK_S)
  return {}


def kill_learners(job, kills, gap_s, rng, learners, stop_after_epoch_lines,
                  done=None):
  """SIGKILLs `kills` random serving learners at random moments.

  Returns `done` (a new list if None) with (name, seconds since training
  began) appended at each kill. Stops early once the chief has printed
  `stop_after_epoch_lines` epoch lines (the run is ending) or the job has
  exited.
  """
  addresses = _learner_addresses(job, learners)
  job.training.wait(timeout=300)
  start, done = time.monotonic(), [] if done is None else done
  while len(done) < kills and job.running() and (
      job.epoch_lines < stop_after_epoch_lines):
    time.sleep(rng.uniform(gap_s / 2, 1.5 * gap_s))
    serving = _serving_learners(job, addresses)
    if not serving:
      continue
    name = rng.choice(serving)
    pid = job.pids().get(name)
    if pid is None or not job.running():
      continue
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      continue
    done.append((name, time.monotonic() - start))
  return done


def learner_run(protocol, steps_per_execution, kills, out_dir, rng, *,
                gap_s=3.0, epochs=2, steps_per_epoch=1000, out=print):
  """One run with `kills` random-time learner kills (module doc)."""
  results_path = os.path.join(
      out_dir, f"learner-{protocol}-{steps_per_execution}.json")
  if os.path.exists(results_path):
    os.remove(results_path)
  job = Job(job_command(protocol, steps_per_execution, results_path,
                        epochs=epochs, steps_per_epoch=steps_per_epoch),
            out=out)
  done = kill_learners(job, kills, gap_s, rng, learners=3,
                       stop_after_epoch_lines=epochs)
  code = job.wait()
  return _judge(RunResult(protocol, steps_per_execution, "learner", done,
                          epochs * steps_per_epoch, [code]), job,
                results_path)


def task_run(protocol, steps_per_execution, task, out_dir, rng, *,
             epochs=2, steps_per_epoch=1000, every_steps=100, out=print):
  """ps:0 or the chief killed once mid-epoch, then the same command again."""
  name = f"{task}-{protocol}-{steps_per_execution}"
  results_path = os.path.join(out_dir, f"{name}.json")
  checkpoint_dir = os.path.join(out_dir, f"{name}-checkpoints")
  if os.path.exists(results_path):
    os.remove(results_path)
  shutil.rmtree(checkpoint_dir, ignore_errors=True)
  command = job_command(protocol, steps_per_execution, results_path,
                        epochs=epochs, steps_per_epoch=steps_per_epoch,
                        checkpoint_dir=checkpoint_dir,
                        checkpoint_every_steps=every_steps)
  job = Job(command, out=out)
  job.training.wait(timeout=300)
  while job.running() and job.epoch_lines < 1:  # into the second epoch
    time.sleep(SERVING_CHECK_S)
  start = time.monotonic()
  time.sleep(rng.uniform(0.5, 4.0))
  pid = job.pids().get("ps:0" if task == "ps" else "chief:0")
  kills = []
  if pid is not None and job.running():
    os.kill(pid, signal.SIGKILL)
    kills.append((task, time.monotonic() - start))
  first = job.wait()
  resumed = Job(command, out=out)
  second = resumed.wait()
  result = RunResult(protocol, steps_per_execution, task, kills,
                     epochs * steps_per_epoch, [first, second])
  if kills and first == 0:
    result.failures.append("the killed run exited 0")
  resumes = [line.split("] ", 1)[-1].strip() for line in resumed.lines
             if "resumed from" in line]
  if resumes:
    result.resumed_from = resumes[0]
  elif kills:
    result.failures.append("the second run did not resume")
  return _judge(result, resumed, results_path)


def _judge(result, job, results_path):
  if result.exit_codes[-1] != 0:
    result.failures.append(f"exit code {result.exit_codes[-1]}: " +
                           "".join(job.lines[-5:]).strip()[-500:])
    return result
  with open(results_path) as f:
    result.results = json.load(f)
  result.failures += check_totals(result.results, result.expected_gradients)
  return result


def summary_lines(results):
  """`chaos: <protocol>: k of k runs exact (...)`, one per protocol."""
  lines = []
  for protocol in dict.fromkeys(r.protocol for r in results):
    runs = [r for r in results if r.protocol == protocol]
    kills = {kind: sum(len(r.kills) for r in runs if r.kind == kind)
             for kind in ("learner", "ps", "chief")}
    lines.append(
        f"chaos: {protocol}: {sum(r.exact for r in runs)} of {len(runs)} "
        f"runs exact ({kills['learner']} learner kills, {kills['ps']} ps "
        f"and {kills['chief']} chief kills with resume)")
  return lines


def main(argv):
  from absl import flags  # pylint: disable=g-import-not-at-top
  del argv
  config = flags.FLAGS
  os.makedirs(config.out_dir, exist_ok=True)
  rng = random.Random(config.seed)
  protocols = config.protocols
  plans = [(p, spe) for p in protocols for spe in (1, 3)]
  per_run = -(-config.learner_kills // len(plans))
  results = []
  for protocol, spe in plans:
    result = learner_run(protocol, spe, per_run, config.out_dir, rng,
                         gap_s=config.gap_s, epochs=3)
    print(result.line(), flush=True)
    results.append(result)
  for protocol in protocols:
    for task in ("ps", "chief"):
      result = task_run(protocol, 1, task, config.out_dir, rng)
      print(result.line(), flush=True)
      results.append(result)
  lines = summary_lines(results)
  print("\n".join(lines))
  total = sum(len(r.kills) for r in results if r.kind == "learner")
  print(f"chaos: {sum(r.exact for r in results)} of {len(results)} runs "
        f"exact; {total} random-time learner kills")
  with open(os.path.join(config.out_dir, "chaos.json"), "w") as f:
    json.dump([dict(dataclasses.asdict(r), exact=r.exact) for r in results],
              f, indent=1)
  return 0 if all(r.exact for r in results) else 1


def define_flags():
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_integer("learner_kills", 56, "Random-time learner kills in "
                       "all (spread over protocol x steps_per_execution).")
  flags.DEFINE_list("protocols", list(PROTOCOLS), "Protocols to run.")
  flags.DEFINE_float("gap_s", 3.0, "Mean seconds between learner kills.")
  flags.DEFINE_integer("seed", 0, "Seed of the kill moments.")
  flags.DEFINE_string("out_dir", "runs/chaos", "Results and chaos.json.")


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  define_flags()
  app.run(main)
