"""Reads what the tasks of one benchmark run wrote (benchmarks/task.py)."""

import glob
import json
import os

from benchmarks import cpu_meter


def read_figures(out):
  """The chief's figures, with memory and CPU of each kind of task.

  Adds `memory_mb` (peak resident set, the largest task of each kind),
  `cpu_cores` (CPU seconds per second of the timed epoch, summed over the
  tasks of each kind, and "total" over all tasks) and `cpu_ms_per_push`
  (CPU milliseconds of all tasks together per gradient computed). A kind
  with a task that stopped before the epoch ended has no CPU figure, and
  then neither has the total.
  """
  with open(os.path.join(out, "figures.json")) as stream:
    figures = json.load(stream)
  begin, end = figures["timed_begin"], figures["timed_end"]
  memory, cpu = {}, {}
  for path in sorted(glob.glob(os.path.join(out, "task_*.json"))):
    with open(path) as stream:
      entry = json.load(stream)
    kind = entry["task"].split(":")[0]
    memory[kind] = max(memory.get(kind, 0), entry["peak_memory_mb"])
    seconds = cpu_meter.cpu_seconds_between(entry["cpu_samples"], begin, end)
    if kind not in cpu or cpu[kind] is not None:
      cpu[kind] = None if seconds is None else cpu.get(kind, 0.0) + seconds
  total = None if None in cpu.values() else sum(cpu.values())
  cores = {kind: None if seconds is None else seconds / (end - begin)
           for kind, seconds in cpu.items()}
  cores["total"] = None if total is None else total / (end - begin)
  gradients = figures["pushes_per_s"] * (end - begin)
  return {**figures, "memory_mb": memory, "cpu_cores": cores,
          "cpu_ms_per_push": None if total is None
          else 1000 * total / gradients}


def format_figure(value, spec):
  """A table cell: the value in `spec`, or "–" where there is none."""
  return "–" if value is None else format(value, spec)


def median(values):
  """The median of a non-empty list (the mean of the middle two if even)."""
  values = sorted(values)
  middle = len(values) // 2
  return (values[middle] if len(values) % 2 else
          (values[middle - 1] + values[middle]) / 2)
