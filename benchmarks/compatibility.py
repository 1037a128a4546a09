r"""The drop-in compatibility table: tf_keras's parameter-server tests
(tests/compatibility_cases.py, tests/sharded_variable_cases.py), each under
stock ParameterServerStrategy and under RudraStrategy (async, hardsync),
with only the strategy line changed.

  python -m benchmarks.compatibility [--out_dir=runs/compatibility]

Prints a markdown table (case, stock, Rudra async, Rudra hardsync: "pass",
or the error's type; the gradients the shards counted where a case trains)
and how many cases end as on stock; writes OUT_DIR/compatibility.md and
compatibility.json. Per strategy: one fresh cluster for the fit and
coordinator cases, one for the sharded-variable cases, and one for each
train-and-serve case (about five minutes per strategy on 2 cores).
"""

import json
import os

from absl import app
from absl import flags

from tests import compatibility_cases
from tests import sharded_variable_cases

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", None, "Also write the table and the outcomes "
                    "here.")


def cell(outcome, gradients=None):
  if outcome != "pass":
    return outcome.split(":", 1)[0]
  return "pass" if gradients is None else f"pass ({gradients} gradients)"


def table(runs):
  kinds = compatibility_cases.STRATEGY_KINDS
  names = list(runs["stock"]["outcomes"])
  counted = (compatibility_cases.TRAINED_100_STEPS |
             set(compatibility_cases.KPL_TRAIN_AND_SERVE))
  lines = ["| case | " + " | ".join(kinds) + " |",
           "|---|" + "---|" * len(kinds)]
  for name in names:
    cells = [cell(runs[kind]["outcomes"][name],
                  runs[kind]["gradients"][name] if name in counted else None)
             for kind in kinds]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  stock = runs["stock"]["outcomes"]
  refused = sharded_variable_cases.REFUSED_UNDER_RUDRA
  for kind in kinds[1:]:
    outcomes = runs[kind]["outcomes"]
    same = sum(cell(outcomes[name]) == cell(stock[name]) for name in names)
    as_refused = sum(name in refused and refused[name] in outcomes[name]
                     for name in names)
    passed = sum(outcome == "pass" for outcome in outcomes.values())
    lines.append(
        f"\n{kind}: {same} of {len(names)} cases end as on stock, "
        f"{as_refused} are refused as README says (training in an eager "
        f"strategy.run on the chief); {passed} pass (stock: "
        f"{sum(o == 'pass' for o in stock.values())}).")
  return "\n".join(lines)


def main(argv):
  del argv
  runs = {kind: compatibility_cases.run_all(kind)
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
