"""rudra_tf/push_trace.py: the trace's lines by hand, and a real cluster's
trace against its ledger (the trace's order is the shards' lock order)."""

import numpy as np
import pytest

from rudra_tf import push_trace
from tests.cluster_fixtures import (compiled_mlp, connect_cluster,
                                    repeated_batches, report_as_dict,
                                    synthetic_data)
from tests.support import run_in_fresh_process

# The module docstring's example: learner 0 pulls at 10.0, pushes at 10.2,
# pulls again at 10.3 and pushes at 10.6.
EXAMPLE = """pull 0 0 10.0
push 0 0 0 1 10.2
pull 0 1 10.3
push 0 1 0 1 10.6
"""


def test_steps_of_the_docstring_example():
  events = push_trace.parse(EXAMPLE.splitlines())
  assert events[0] == push_trace.Pull(0, 0, 10.0)
  assert events[1] == push_trace.Push(0, 0, 0, True, 10.2)
  steps = push_trace.learner_steps(events)
  assert list(steps) == [0]
  assert [s.step for s in steps[0]] == pytest.approx([0.2, 0.3])
  assert steps[0][0].gap == pytest.approx(0.1)
  assert steps[0][1].gap is None  # no pull after the last push
  assert push_trace.first_pull_times(events) == {0: 10.0}


def test_two_learners_and_a_stopped_pull():
  # Learner 1 pulls at 1.0 and pushes at 1.5 (σ = 1: learner 0's push at
  # 1.2 was an update); its pull at 2.0 has no push (it was stopped), so it
  # ends its gap (0.5) but makes no step. σ 0 and 1, and a σ of 7 counted
  # in the last of 3 bins.
  events = push_trace.parse("""pull 0 0 1.0
pull 1 0 1.0
push 0 0 0 1 1.2
push 1 0 1 1 1.5
pull 1 2 2.0
pull 0 2 2.1
push 0 2 7 0 2.4
""".splitlines())
  steps = push_trace.learner_steps(events)
  assert [s.step for s in steps[0]] == pytest.approx([0.2, 0.3])
  assert [s.gap for s in steps[0]] == pytest.approx([0.9, None])
  assert [(s.step, s.gap) for s in steps[1]] == pytest.approx([(0.5, 0.5)])
  assert push_trace.staleness_histogram(events, 3) == [1, 1, 1]
  assert events[-1].accepted is False


def test_bad_lines_and_a_push_without_a_pull_are_refused():
  with pytest.raises(ValueError, match=r"line 2 is not 'pull <learner>"):
    push_trace.parse(["pull 0 0 1.0", "push 0 zero 0 1 2.0"])
  with pytest.raises(ValueError, match="line 1"):
    push_trace.parse(["pulled 0 0 1.0"])
  with pytest.raises(ValueError, match="learner 3 pushed at 2.0 without a "
                     "pull before it"):
    push_trace.learner_steps(push_trace.parse(["push 3 0 0 1 2.0"]))
  with pytest.raises(ValueError, match="'pull' or 'push', got 'pop'"):
    push_trace.trace_op("/tmp/x", "pop", 1)


def test_each_model_of_a_strategy_traces_to_files_of_its_own():
  assert push_trace.trace_path("/t", 1) == "/t/shard1.trace"
  assert push_trace.trace_path("/t", 0, generation=2) == (
      "/t/model2_shard0.trace")


@pytest.mark.parametrize("protocol,num_learners,c", [
    ("async", 3, 1), ("2-softsync", 4, 2), ("hardsync", 3, 3)])
def test_a_cluster_trace_is_its_ledger_in_lock_order(tmp_path, protocol,
                                                     num_learners, c):
  result = run_in_fresh_process(fit_with_trace, num_learners=num_learners,
                                protocol=protocol, steps=30,
                                directory=str(tmp_path))
  report = result["report"]
  events = push_trace.parse(result["lines"])
  pushes = [e for e in events if isinstance(e, push_trace.Push)]
  assert len(pushes) == report["gradients"] == 30
  bins = len(report["histogram"])
  assert push_trace.staleness_histogram(events, bins) == list(
      report["histogram"])
  steps = push_trace.learner_steps(events)
  assert [len(steps.get(i, [])) for i in range(num_learners)] == list(
      report["learner_gradients"])
  # Replaying the file in order rebuilds the shard's clock: every pull
  # reads it, every push's σ is it minus the version its learner pulled,
  # and c accepted gradients move it on. Out of lock order, a line would
  # read a clock that is not yet (or no longer) there.
  clock, pending, held = 0, 0, {}
  for event in events:
    if isinstance(event, push_trace.Pull):
      assert event.timestamp == clock, event
      held[event.learner] = event.timestamp
      continue
    assert event.pulled == held.pop(event.learner), event
    assert event.staleness == clock - event.pulled, event
    assert event.accepted
    pending += 1
    if pending == c:
      clock, pending = clock + 1, 0
  assert clock == report["timestamp"] and pending == report["pending"]
  times = [e.time for e in events]
  assert times == sorted(times)


def fit_with_trace(num_learners, protocol, steps, directory):
  """Fits the MLP with a push trace; returns the report and the trace."""
  _, strategy = connect_cluster(1, num_learners, protocol,
                                push_trace_dir=directory)
  x, y = synthetic_data()
  model = compiled_mlp(strategy, "sgd_momentum", "divide_by_n")
  model.fit(repeated_batches(x, y, 4), epochs=1, steps_per_epoch=steps,
            verbose=0)
  result = {"report": report_as_dict(strategy)}
  with open(push_trace.trace_path(directory, 0)) as stream:
    result["lines"] = stream.read().splitlines()
  result["report"]["histogram"] = np.asarray(
      result["report"]["histogram"]).tolist()
  result["report"]["learner_gradients"] = np.asarray(
      result["report"]["learner_gradients"]).tolist()
  return result


@pytest.mark.parametrize("bad", ["", 7])
def test_a_bad_trace_folder_is_refused_before_connecting(bad):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import rudra_tf  # pylint: disable=g-import-not-at-top
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec({"chief": ["localhost:1"], "ps": ["localhost:2"],
                            "worker": ["localhost:3"]}), rpc_layer="grpc")
  with pytest.raises(ValueError, match="push_trace_dir must be a folder "
                     f"path or None, got {bad!r}"):
    rudra_tf.RudraStrategy(resolver, push_trace_dir=bad)
