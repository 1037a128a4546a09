"""A launch.train deploy across emulated hosts (launch/emulated_hosts.py,
launch/emulated_deploy.py): every task on its own host and address, links
at 20 Mbit/s, faults made by taking a host's link down.

Skipped, with the reason, where this machine cannot make namespaces."""

import json
import time

import pytest

from launch import emulated_deploy
from launch import emulated_hosts

AVAILABLE, WHY_NOT = emulated_hosts.available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT)

LINK_MBIT = 20
# 2 epochs of 60 steps, each learner step at least 50 ms: long enough to
# cut a link in the middle of a fit.
STEPS = 60
FLAGS = ["--model=mlp", "--dataset=synthetic", "--protocol=async",
         "--epochs=2", f"--steps_per_epoch={STEPS}", "--minibatch=8",
         "--progress_every_s=1", "--emulated_step_ms=50"]
# A learner's link is down this long: shorter than the watchdog's verdict
# on a ps, long enough that the old serve loop (3 s) gave up on the chief.
LEARNER_CUT_S = 8


def test_a_learner_host_cut_off_mid_fit_comes_back_and_trains_on(tmp_path):
  results = tmp_path / "results.json"
  with emulated_hosts.EmulatedHosts(4, rate_mbit=LINK_MBIT) as hosts:
    deploy = emulated_deploy.EmulatedDeploy(
        hosts, 2, 1, FLAGS + [f"--results={results}"], str(tmp_path))
    deploy.start()
    # Cut once training runs (both learners have their step functions).
    deploy.wait_for_line("chief", r"epoch 1/2 step [1-9]")
    learner_host = deploy.host_of("worker", 0)
    hosts.set_link(learner_host, up=False)
    time.sleep(LEARNER_CUT_S)
    # The learner did not take the silence for the chief's end.
    assert deploy.processes[("worker", 0)].poll() is None, deploy.output(
        "worker", 0)
    hosts.set_link(learner_host, up=True)
    codes = deploy.wait(timeout_s=600)
  assert set(codes.values()) == {0}, deploy.output("chief")[-3000:]
  saved = json.loads(results.read_text())
  # Every step pushed once and was applied once; both learners trained.
  assert saved["gradients"] == saved["updates"] == 2 * STEPS
  assert saved["duplicates"] == 0 and saved["pending"] == 0
  assert sum(saved["learner_gradients"]) == 2 * STEPS
  assert min(saved["learner_gradients"]) > 0
  assert "chief finished; exiting" in deploy.output("worker", 0)


def test_a_ps_host_cut_off_ends_the_run_and_the_same_command_resumes(
    tmp_path):
  results = tmp_path / "results.json"
  checkpoints = tmp_path / "ckpt"
  flags = FLAGS + [f"--results={results}", f"--checkpoint_dir={checkpoints}",
                   "--checkpoint_every_steps=20"]
  with emulated_hosts.EmulatedHosts(4, rate_mbit=LINK_MBIT) as hosts:
    deploy = emulated_deploy.EmulatedDeploy(hosts, 2, 1, flags,
                                            str(tmp_path / "first"))
    deploy.start()
    deploy.wait_for_line("chief", r"ckpt-40 \(40 steps trained\)")
    ps_host = deploy.host_of("ps", 0)
    hosts.set_link(ps_host, up=False)
    chief = deploy.processes[("chief", 0)]
    assert chief.wait(120) == 3
    assert ("error: parameter-server task ps:0 became unreachable during "
            "training; run the same command again with the same "
            "--checkpoint_dir") in deploy.output("chief")
    # The ps host's network comes back; every task ends on its own.
    hosts.set_link(ps_host, up=True)
    first = deploy.wait(timeout_s=120)
    assert first[("chief", 0)] == 3
    # The same command on every host again.
    again = emulated_deploy.EmulatedDeploy(hosts, 2, 1, flags,
                                           str(tmp_path / "again"))
    again.start()
    codes = again.wait(timeout_s=600)
  assert set(codes.values()) == {0}, again.output("chief")[-3000:]
  chief_output = again.output("chief")
  assert "resumed from" in chief_output
  resumed_at = int(chief_output.split("resumed from")[1].split("ckpt-")[1]
                   .split()[0])
  assert resumed_at >= 40
  saved = json.loads(results.read_text())
  # The counts continue from the checkpoint: exactly the steps that were
  # left were trained, and every one applied once.
  assert saved["gradients"] == saved["updates"] == 2 * STEPS
  assert saved["duplicates"] == 0
