r"""The drop-in compatibility table: tf_keras's parameter-server tests
(tests/compatibility_cases.py), each under stock ParameterServerStrategy and
under RudraStrategy (async, hardsync), with only the strategy line changed.

  python -m benchmarks.compatibility [--out_dir=runs/compatibility]

Prints a markdown table (case, stock, Rudra async, Rudra hardsync: "pass",
or the error's type) and how many cases end as on stock; writes
OUT_DIR/compatibility.md and compatibility.json. Each strategy runs on its
own fresh cluster (about two minutes each on 2 cores).
"""

import json
import os

from absl import app
from absl import flags

from tests import compatibility_cases
from tests.support import run_in_fresh_process

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", None, "Also write the table and the outcomes "
                    "here.")

RUN_TIMEOUT_S = 900


def cell(outcome, gradients=None):
  if outcome != "pass":
    return outcome.split(":", 1)[0]
  return "pass" if gradients is None else f"pass ({gradients} gradients)"


def table(runs):
  kinds = compatibility_cases.STRATEGY_KINDS
  lines = ["| case | " + " | ".join(kinds) + " |",
           "|---|" + "---|" * len(kinds)]
  for name in compatibility_cases.CASES:
    cells = [cell(runs[kind]["outcomes"][name],
                  runs[kind]["gradients"][name]
                  if name in compatibility_cases.TRAINED_100_STEPS else None)
             for kind in kinds]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  stock = runs["stock"]["outcomes"]
  for kind in kinds[1:]:
    same = sum(
        cell(runs[kind]["outcomes"][name]) == cell(stock[name])
        for name in compatibility_cases.CASES)
    passed = sum(outcome == "pass"
                 for outcome in runs[kind]["outcomes"].values())
    lines.append(f"\n{kind}: {same} of {len(stock)} cases end as on stock; "
                 f"{passed} pass (stock: "
                 f"{sum(o == 'pass' for o in stock.values())}).")
  return "\n".join(lines)


def main(argv):
  del argv
  runs = {kind: run_in_fresh_process(compatibility_cases.run_cases,
                                     kind=kind, timeout=RUN_TIMEOUT_S)
          for kind in compatibility_cases.STRATEGY_KINDS}
  text = table(runs)
  print(text)
  if FLAGS.out_dir:
    os.makedirs(FLAGS.out_dir, exist_ok=True)
    with open(os.path.join(FLAGS.out_dir, "compatibility.md"), "w") as f:
      f.write(text + "\n")
    with open(os.path.join(FLAGS.out_dir, "compatibility.json"), "w") as f:
      json.dump(runs, f, indent=1)


if __name__ == "__main__":
  app.run(main)
