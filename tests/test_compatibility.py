"""Drop-in compatibility: tf_keras's own parameter-server tests
(tests/compatibility_cases.py and tests/sharded_variable_cases.py, ported
with only the strategy line changed) run under stock
ParameterServerStrategy and under RudraStrategy (async and hardsync), each
on its own cluster in a fresh process.

Every case must end under RudraStrategy as it ends under stock: pass where
stock passes, and fail with the same error type where stock fails (the
jit_compile=True cases: tf_keras cannot compile the PS train function on
either), except the sharded-variable cases that train in an eager
strategy.run on the chief, which RudraStrategy refuses with its own error.
`python -m benchmarks.compatibility` prints the table.
"""

import pytest

from tests import compatibility_cases
from tests import sharded_variable_cases

RUDRA_KINDS = ["rudra_async", "rudra_hardsync"]


@pytest.fixture(scope="module")
def runs():
  return {kind: compatibility_cases.run_all(kind)
          for kind in compatibility_cases.STRATEGY_KINDS}


@pytest.fixture(scope="module")
def outcomes(runs):
  return {kind: run["outcomes"] for kind, run in runs.items()}


def _error_type(outcome):
  return outcome.split(":", 1)[0]


@pytest.mark.parametrize("name", list(compatibility_cases.CASES))
@pytest.mark.parametrize("kind", RUDRA_KINDS)
def test_a_ported_case_ends_as_on_stock(outcomes, kind, name):
  stock, rudra = outcomes["stock"][name], outcomes[kind][name]
  if stock == "pass":
    assert rudra == "pass", rudra
  else:
    assert _error_type(rudra) == _error_type(stock), (stock, rudra)


def test_only_the_jit_compile_cases_fail_on_stock(outcomes):
  # The baseline: if stock fails elsewhere, the port (or the cluster) is
  # wrong, and "ends as on stock" would prove nothing there.
  failing = sorted(name for name, outcome in outcomes["stock"].items()
                   if outcome != "pass")
  assert failing == sorted(
      name for name in compatibility_cases.CASES if "jit_compile" in name), (
          {name: outcomes["stock"][name] for name in failing})


@pytest.mark.parametrize("name", sorted(compatibility_cases.TRAINED_100_STEPS))
@pytest.mark.parametrize("kind", RUDRA_KINDS)
def test_each_step_of_a_ported_fit_is_one_protocol_gradient(runs, kind, name):
  # 10 epochs x 10 steps: 100 gradients counted by the shards (the plain
  # legacy SGD of the original pushed through the protocol, not around it).
  assert runs[kind]["gradients"][name] == 100


@pytest.mark.parametrize("name", list(compatibility_cases.KPL_TRAIN_AND_SERVE))
def test_a_train_and_serve_case_passes_on_stock(outcomes, name):
  assert outcomes["stock"][name] == "pass"


@pytest.mark.parametrize("name", list(compatibility_cases.KPL_TRAIN_AND_SERVE))
@pytest.mark.parametrize("kind", RUDRA_KINDS)
def test_a_train_and_serve_case_passes_with_each_step_one_gradient(
    runs, kind, name):
  # 4 rounds of 7 scheduled steps: 28 gradients counted by the shard.
  assert runs[kind]["outcomes"][name] == "pass"
  assert runs[kind]["gradients"][name] == 28


def test_every_sharded_variable_case_passes_on_stock(outcomes):
  failing = {name: outcomes["stock"][name]
             for name in sharded_variable_cases.CASES
             if outcomes["stock"][name] != "pass"}
  assert not failing


@pytest.mark.parametrize("name", list(sharded_variable_cases.CASES))
@pytest.mark.parametrize("kind", RUDRA_KINDS)
def test_a_sharded_variable_case_ends_as_on_stock_or_is_refused(
    outcomes, kind, name):
  outcome = outcomes[kind][name]
  refusal = sharded_variable_cases.REFUSED_UNDER_RUDRA.get(name)
  if refusal is None:
    assert outcome == "pass", outcome
  else:
    assert outcome.startswith("ValueError:") and refusal in outcome, outcome
