r"""Parameter-server capacity: pushes/s the ps tasks absorb, by model size.

  python -m benchmarks.ps_capacity --sizes_mb=0.1,1,10,100 --ps_tasks=1,2,4 \
      --out_dir=runs/ps_capacity

Learners train benchmarks/blob_model.py's model (all weights, next to no
compute: each step pulls and pushes the full size) with RudraStrategy
"async" (c = 1: every push is an update), 20 steps per scheduled closure and
pulls without the lock, so the learners push as fast as the ps tasks and the
network let them. The weights are in 8 variables, spread round-robin over
the ps tasks, each ps task holding its own shard state. Reports pushes/s,
the MB/s of gradients pushed, the CPU cores the ps tasks, the learners and
all tasks used, the ps tasks' CPU per push, and the peak memory of a ps
task, for every (size, ps tasks) pair; with --link_mbit also the network
bound, the fraction of it reached, the bytes the ps links carried per push
over the 2M a pull and a push need, and how busy each kind of link was
(emulated_hosts.LinkMeter, over the timed epoch); OUT_DIR/ps_capacity.json
and ps_capacity.md.

With --compensations=none,delay each point runs once per compensation rule
(rudra_tf/compensation.py), side by side: a rule's push also carries the
pulled weights θ_pulled (M more bytes) and its update runs under the
shard's lock; "vs none" is the pushes/s over the same point's without one.
"""

import os
import sys

from absl import app
from absl import flags

from benchmarks import results
from launch import local_cluster
from launch import reports

FLAGS = flags.FLAGS
STEPS_PER_EXECUTION = 20
# On rate-limited links a step takes seconds, not milliseconds: fewer steps
# per closure keep every learner busy within a short timed epoch.
LINK_STEPS_PER_EXECUTION = 2


def steps_for(size_mb, pushes):
  """Timed pushes for a model size (big models push less often)."""
  steps = pushes if size_mb <= 10 else int(pushes * 10 / size_mb)
  return max(STEPS_PER_EXECUTION, steps // STEPS_PER_EXECUTION *
             STEPS_PER_EXECUTION)


def steps_on_links(bound_pushes_per_s, timed_s, per_closure):
  """Timed pushes that take about `timed_s` at the network bound (whole
  closures, at least two per learner)."""
  steps = int(bound_pushes_per_s * timed_s) // per_closure * per_closure
  return max(2 * FLAGS.num_learners * per_closure, steps)


def run_point(size_mb, num_ps, out, compensation="none"):
  bound = network_bound(num_ps, FLAGS.num_learners, FLAGS.link_mbit, size_mb)
  if bound:
    per_closure = LINK_STEPS_PER_EXECUTION
    steps = steps_on_links(bound, FLAGS.timed_s, per_closure)
  else:
    per_closure = STEPS_PER_EXECUTION
    steps = steps_for(size_mb, FLAGS.pushes)
  command = [sys.executable, "-m", "benchmarks.task", "--strategy=rudra",
             "--protocol=async", "--lr_policy=none", "--lr=0.01",
             "--dataset=synthetic", "--minibatch=4", f"--blob_mb={size_mb}",
             f"--steps_per_epoch={steps}",
             f"--steps_per_execution={per_closure}",
             "--noconsistent_pulls", f"--out={out}",
             f"--compensation={compensation}"]
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  link_meter = None
  if FLAGS.link_mbit:
    code, link_meter = _run_on_emulated_hosts(command[2:], num_ps, out)
  else:
    code = local_cluster.LocalProcessCluster(
        command, num_learners=FLAGS.num_learners, num_ps=num_ps,
        environment=dict(os.environ, PYTHONPATH=repo)).run()
  if code != 0:
    raise RuntimeError(f"{size_mb} MB with {num_ps} ps failed ({code})")
  figures = results.read_figures(out)
  wire = (wire_figures(link_meter, figures, num_ps, size_mb)
          if link_meter else {})
  return {**wire, "size_mb": size_mb, "ps_tasks": num_ps,
          "compensation": compensation,
          "learners": FLAGS.num_learners, "pushes": steps,
          "link_mbit": FLAGS.link_mbit or None,
          "network_bound_pushes_per_s": bound,
          "bound_fraction": (figures["pushes_per_s"] / bound) if bound
                            else None,
          "pushes_per_s": figures["pushes_per_s"],
          "pushed_mb_per_s": figures["pushes_per_s"] * size_mb,
          "ps_peak_memory_mb": figures["memory_mb"].get("ps", 0.0),
          "cpu_cores": figures["cpu_cores"],
          "ps_cpu_ms_per_push": _ps_cpu_ms_per_push(figures)}


def network_bound(num_ps, num_learners, link_mbit, size_mb):
  """Pushes/s the links allow, or None (no rate limit).

  A step pulls the model's M bytes, then pushes M bytes. Links run at B
  each way (tbf on each direction). A ps host holds M/k: its link sends
  pulls and receives pushes side by side, so k ps hosts allow k·B/M steps
  a second. A learner pulls, then pushes, one after the other: its link
  allows B/(2M), λ learners λ·B/(2M). The bound is the smaller; with
  λ >= 2k learners it is the ps hosts' k·B/M.
  """
  if not link_mbit:
    return None
  model_mbit = size_mb * 8
  return min(num_ps * link_mbit / model_mbit,
             num_learners * link_mbit / (2 * model_mbit))


def wire_figures(meter, figures, num_ps, size_mb):
  """What the links carried in the timed epoch: bytes on the wire per push
  (all ps links, both ways; a push and its pull move 2M at the least) over
  2M, and each kind of link's busiest direction as a fraction of the rate.

  Hosts as EmulatedDeploy places them: the chief 0, learners 1..λ, ps after.
  """
  begin, end = figures["timed_begin"], figures["timed_end"]
  moved = meter.bytes_between(begin, end)
  pushes = figures["pushes_per_s"] * (end - begin)
  learners = range(1, 1 + FLAGS.num_learners)
  ps_hosts = range(1 + FLAGS.num_learners, 1 + FLAGS.num_learners + num_ps)
  capacity = FLAGS.link_mbit * 1e6 / 8 * (end - begin)  # bytes, one way
  def busiest(hosts):
    return [max(moved[h]) / capacity for h in hosts]
  ps_bytes = sum(sum(moved[h]) for h in ps_hosts)
  return {"wire_mb_per_push": ps_bytes / pushes / 1e6,
          "wire_over_2m": ps_bytes / pushes / (2 * size_mb * 1e6),
          "ps_link_use": busiest(ps_hosts),
          "learner_link_use": busiest(learners)}


def _run_on_emulated_hosts(task_argv, num_ps, out):
  """The point's cluster on emulated hosts (one per task) whose links run
  at --link_mbit; returns the chief's exit code and the links' LinkMeter."""
  from launch import emulated_deploy  # pylint: disable=g-import-not-at-top
  from launch import emulated_hosts  # pylint: disable=g-import-not-at-top
  module, flags_ = task_argv[0], task_argv[1:]
  with emulated_hosts.EmulatedHosts(1 + FLAGS.num_learners + num_ps,
                                    rate_mbit=FLAGS.link_mbit) as hosts:
    deploy = emulated_deploy.EmulatedDeploy(
        hosts, FLAGS.num_learners, num_ps, flags_,
        os.path.join(out, "logs"), module=module)
    with emulated_hosts.LinkMeter(hosts) as meter:
      deploy.start()
      code = deploy.run_until_chief_exits()
    return code, meter


def _ps_cpu_ms_per_push(figures):
  """CPU ms of all ps tasks together per push (a push reaches every ps)."""
  cores = figures["cpu_cores"].get("ps")
  return None if cores is None else 1000 * cores / figures["pushes_per_s"]


def add_ratios(rows):
  """`vs_one_ps`: pushes/s over those of 1 ps task at the same size (and
  rule); `vs_no_compensation`: over the same point's without a rule."""
  def rule(row):
    return row.get("compensation", "none")
  one_ps = {(row["size_mb"], rule(row)): row["pushes_per_s"] for row in rows
            if row["ps_tasks"] == 1}
  plain = {(row["size_mb"], row["ps_tasks"]): row["pushes_per_s"]
           for row in rows if rule(row) == "none"}
  for row in rows:
    base = one_ps.get((row["size_mb"], rule(row)))
    row["vs_one_ps"] = row["pushes_per_s"] / base if base else None
    base = plain.get((row["size_mb"], row["ps_tasks"]))
    row["vs_no_compensation"] = (row["pushes_per_s"] / base if base
                                 else None)
  return rows


def markdown(rows):
  lines = ["| model size (MB) | ps tasks | learners | compensation | "
           "link (Mbit/s) | pushes/s | vs 1 ps | vs none | "
           "network bound (pushes/s) | of the bound | "
           "pushed MB/s | CPU cores (ps / learners / all) | ps CPU ms per "
           "push | ps peak memory (MB) | wire bytes per push / 2M | link use "
           "(ps / learners, busiest direction) |", "|---" * 16 + "|"]
  for row in rows:
    cores = row["cpu_cores"]
    lines.append(f"| {row['size_mb']:g} | {row['ps_tasks']} | "
                 f"{row['learners']} | {row.get('compensation', 'none')} | "
                 f"{results.format_figure(row.get('link_mbit'), 'g')} | "
                 f"{row['pushes_per_s']:.2f} | "
                 f"{results.format_figure(row.get('vs_one_ps'), '.2f')} | "
                 f"{results.format_figure(row.get('vs_no_compensation'), '.2f')} | "
                 f"{results.format_figure(row.get('network_bound_pushes_per_s'), '.2f')} | "
                 f"{results.format_figure(row.get('bound_fraction'), '.2f')} | "
                 f"{row['pushed_mb_per_s']:.0f} | "
                 + " / ".join(results.format_figure(cores.get(kind), ".2f")
                              for kind in ("ps", "worker", "total")) +
                 " | " +
                 results.format_figure(row["ps_cpu_ms_per_push"], ".1f") +
                 f" | {row['ps_peak_memory_mb']:.0f} | "
                 f"{results.format_figure(row.get('wire_over_2m'), '.2f')} | "
                 f"{_link_use(row)} |")
  return "\n".join(lines) + "\n"


def _link_use(row):
  if "ps_link_use" not in row:
    return "–"
  def mean(values):
    return sum(values) / len(values)
  return (f"{mean(row['ps_link_use']):.2f} / "
          f"{mean(row['learner_link_use']):.2f}")


def define_flags():
  """The flags of this script (defined when it runs, not on import)."""
  flags.DEFINE_list("sizes_mb", ["0.1", "1", "10", "100"], "Model sizes (MB).")
  flags.DEFINE_list("ps_tasks", ["1", "2", "4"], "ps task counts.")
  flags.DEFINE_integer("num_learners", 2, "Learners pushing.")
  flags.DEFINE_integer("pushes", 1000, "Timed pushes per point (fewer for "
                       "models over 10 MB: pushes / size_mb * 10).")
  flags.DEFINE_string("out_dir", "runs/ps_capacity", "Where results go.")
  flags.DEFINE_float("timed_s", 40, "With --link_mbit: the timed epoch's "
                     "length at the network bound (sets its pushes).")
  flags.DEFINE_list("compensations", ["none"], "Compensation rules, each "
                    "point run once per rule (none, delay, delay_adaptive, "
                    "gap_aware).")
  flags.DEFINE_float("link_mbit", 0, "Run every task on an emulated host of "
                     "its own (launch/emulated_hosts.py; needs root) whose "
                     "link runs at this many Mbit/s each way; 0: every task "
                     "on 127.0.0.1, no network limit.")


def main(argv):
  del argv
  try:
    sizes = [float(v) for v in FLAGS.sizes_mb]
    counts = [int(v) for v in FLAGS.ps_tasks]
  except ValueError as error:
    print(f"error: --sizes_mb and --ps_tasks take numbers ({error})",
          file=sys.stderr)
    return 2
  if min(sizes) <= 0 or min(counts) < 1:
    print("error: sizes must be > 0 MB and ps task counts >= 1",
          file=sys.stderr)
    return 2
  from rudra_tf import compensation as compensation_lib  # pylint: disable=g-import-not-at-top
  try:
    for rule in FLAGS.compensations:
      compensation_lib.Compensation.create(rule)
  except ValueError as error:
    print(f"error: --compensations: {error}", file=sys.stderr)
    return 2
  rows = []
  for size_mb in sizes:
    for num_ps in counts:
      for rule in FLAGS.compensations:
        print(f"== {size_mb:g} MB, {num_ps} ps, compensation {rule}",
              flush=True)
        suffix = "" if rule == "none" else f"_{rule}"
        rows.append(run_point(size_mb, num_ps, os.path.join(
            FLAGS.out_dir, "runs", f"{size_mb:g}mb_{num_ps}ps{suffix}"),
                              rule))
        print(f"   {rows[-1]['pushes_per_s']:.1f} pushes/s", flush=True)
  table = markdown(add_ratios(rows))
  reports.write_rows_and_table(FLAGS.out_dir, "ps_capacity", rows, table)
  print(table)
  return 0


if __name__ == "__main__":
  define_flags()
  app.run(main)
