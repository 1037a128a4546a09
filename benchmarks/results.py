"""Reads what the tasks of one benchmark run wrote (benchmarks/task.py)."""

import glob
import json
import os


def read_figures(out):
  """The chief's figures, with the peak memory (MB) of each kind of task."""
  with open(os.path.join(out, "figures.json")) as stream:
    figures = json.load(stream)
  memory = {}
  for path in glob.glob(os.path.join(out, "memory_*.json")):
    with open(path) as stream:
      entry = json.load(stream)
    kind = entry["task"].split(":")[0]
    memory[kind] = max(memory.get(kind, 0), entry["peak_memory_mb"])
  return {**figures, "memory_mb": memory}
