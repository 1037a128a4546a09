"""launch/flags.py: flag validation (before any server starts), μ and the
emulated step times, TF_CONFIG parsing."""

import json
import os
import subprocess
import sys
import types

import pytest

from launch import flags as launch_flags
from tests.processes import REPO


def flag_values(**overrides):
  values = dict(model="small_cnn", dataset="synthetic", data_dir=None,
                manual_dir=None, protocol="2-softsync", lr=0.1, momentum=0.9,
                lr_policy="divide_by_n", minibatch=None, global_batch=None,
                epochs=1, steps_per_epoch=None, max_staleness=None,
                checkpoint_dir=None, log_dir=None, results=None, seed=0,
                gpus=0, steps_per_execution=1, emulated_step_ms=[],
                learner_restarts=3, kill_task=[], save_model=None,
                checkpoint_every_steps=None, checkpoint_every_secs=None,
                progress_every_s=5.0, keras="tf_keras", compensation="none",
                compensation_strength=None, push_trace_dir=None)
  values.update(overrides)
  return types.SimpleNamespace(**values)


@pytest.mark.parametrize("overrides,learners,ps,fragment", [
    (dict(model="vgg"), 4, 1, "--model='vgg' is unknown; valid models"),
    (dict(keras="keras2"), 4, 1, "--keras='keras2' is unknown; valid values "
     "are tf_keras, keras3."),
    (dict(dataset="mnist"), 4, 1, "valid datasets are"),
    ({}, 0, 1, "--learners must be >= 1"),
    ({}, 4, 0, "--ps_tasks must be >= 1"),
    (dict(protocol="5-softsync"), 4, 1, "n = 5"),
    (dict(lr_policy="half"), 4, 1, "Unknown lr_policy 'half'"),
    (dict(compensation="dc"), 4, 1, "--compensation='dc' "
     "--compensation_strength=None: Unknown compensation 'dc'; valid values "
     "are 'none', 'delay', 'delay_adaptive', 'gap_aware'."),
    (dict(compensation="gap_aware", compensation_strength=0.1), 4, 1,
     "compensation 'gap_aware' takes no strength"),
    (dict(compensation="delay", compensation_strength=-1.0), 4, 1,
     "must be a number >= 0, got -1.0"),
    (dict(protocol="4-backup-hardsync"), 4, 1, "1 <= b < λ"),
    (dict(lr=0.0), 4, 1, "--lr must be > 0"),
    (dict(momentum=1.0), 4, 1, "--momentum must be in [0, 1)"),
    (dict(epochs=0), 4, 1, "--epochs must be >= 1"),
    (dict(steps_per_epoch=0), 4, 1, "--steps_per_epoch must be >= 1"),
    (dict(max_staleness=0), 4, 1, "max_staleness"),
    (dict(progress_every_s=-1.0), 4, 1,
     "--progress_every_s must be >= 0 (0: no in-epoch lines), got -1.0"),
    (dict(global_batch=30), 4, 1, "multiple of λ=4"),
    (dict(global_batch=128, minibatch=16), 4, 1, "contradicts"),
    (dict(minibatch=0), 4, 1, "--minibatch must be >= 1"),
    (dict(dataset="fashion_mnist", data_dir="/nonexistent"), 4, 1,
     "apt-get install dataset-fashion-mnist"),
    (dict(emulated_step_ms=["100", "100"]), 4, 1,
     "--emulated_step_ms has 2 values; give one for every learner or one per"
     " learner (λ=4)"),
    (dict(emulated_step_ms=["-5"]), 4, 1, "values must be >= 0, got -5"),
    (dict(emulated_step_ms=["fast"]), 4, 1, "must be numbers"),
    (dict(save_model="model.h5"), 4, 1,
     "--save_model='model.h5' must end in '.keras'"),
    (dict(checkpoint_dir="/tmp/c", checkpoint_every_steps=0), 4, 1,
     "--checkpoint_every_steps must be > 0, got 0."),
    (dict(checkpoint_dir="/tmp/c", checkpoint_every_secs=-1.0), 4, 1,
     "--checkpoint_every_secs must be > 0, got -1.0."),
    (dict(checkpoint_every_steps=100), 4, 1,
     "--checkpoint_every_steps=100 needs --checkpoint_dir"),
    (dict(checkpoint_every_secs=30.0), 4, 1,
     "--checkpoint_every_secs=30.0 needs --checkpoint_dir"),
])
def test_bad_flags_are_refused(overrides, learners, ps, fragment):
  with pytest.raises(ValueError) as error:
    launch_flags.resolve_config(flag_values(**overrides), learners, ps)
  assert fragment in str(error.value)


def test_emulated_step_times_per_learner():
  config = launch_flags.resolve_config(
      flag_values(emulated_step_ms=["150"]), 3, 1)
  assert config.emulated_step_ms == (150.0, 150.0, 150.0)
  config = launch_flags.resolve_config(
      flag_values(emulated_step_ms=["600", "150", "150"]), 3, 1)
  assert [config.learner_step_time_s(i) for i in range(3)] == [
      0.6, 0.15, 0.15]
  assert launch_flags.resolve_config(
      flag_values(), 3, 1).learner_step_time_s(2) == 0.0


def test_global_batch_sets_mu_per_learner():
  config = launch_flags.resolve_config(flag_values(global_batch=128), 4, 1)
  assert config.minibatch == 32
  config = launch_flags.resolve_config(flag_values(minibatch=8), 4, 1)
  assert config.minibatch == 8


CLUSTER = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],
           "ps": ["127.0.0.1:3"]}


@pytest.mark.parametrize("text,fragment", [
    ("{not json", "not valid JSON"),
    (json.dumps({"task": {"type": "worker"}}), 'needs a "cluster"'),
    (json.dumps({"cluster": CLUSTER}), 'needs a "task"'),
    (json.dumps({"cluster": CLUSTER, "task": {"type": "evaluator"}}),
     "task type 'evaluator' is unknown"),
    (json.dumps({"cluster": CLUSTER, "task": {"type": "worker", "index": 3}}),
     "index 3 is out of range"),
    (json.dumps({"cluster": {"chief": ["a:1"], "worker": ["b:2"]},
                 "task": {"type": "chief"}}), "has no 'ps' job"),
    (json.dumps({"cluster": {**CLUSTER, "ps": ["nohostport"]},
                 "task": {"type": "ps"}}), '"host:port"'),
])
def test_malformed_tf_config(text, fragment):
  with pytest.raises(ValueError) as error:
    launch_flags.parse_tf_config(text)
  assert fragment in str(error.value)
  assert "\n" not in str(error.value)


def test_flag_validation_does_not_import_tensorflow():
  # The launcher supervises the tasks; it stays light and validates flags
  # (data files included) before anything imports TensorFlow.
  code = ("import sys, types; from launch import flags as f; "
          "v = types.SimpleNamespace(**%r); f.resolve_config(v, 2, 1); "
          "print('tensorflow' in sys.modules)") % dict(
              vars(flag_values(dataset="fashion_mnist")))
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, text=True,
                       capture_output=True, env=dict(os.environ,
                                                     PYTHONPATH=REPO),
                       timeout=60)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == "False"


def test_compensation_flags_resolve_to_the_rules_defaults():
  config = launch_flags.resolve_config(
      flag_values(compensation="delay", protocol="1-backup-hardsync"), 4, 1)
  assert (config.compensation, config.compensation_strength) == ("delay", 0.04)
  assert config.protocol == "1-backup-hardsync"
  config = launch_flags.resolve_config(flag_values(), 4, 1)
  assert (config.compensation, config.compensation_strength) == ("none", None)
