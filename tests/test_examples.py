"""examples/: TensorFlow's parameter-server tutorial, both parts, run as
written (`python -m examples.<name> --strategy=rudra`) in a child process,
on RudraStrategy, and README's Keras 3 quick start; what they print must
show every step went through the protocol."""

import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 600


def run_example(name, *flags):
  completed = subprocess.run(
      [sys.executable, "-m", f"examples.{name}", *flags], cwd=REPO,
      capture_output=True, text=True, timeout=TIMEOUT_S,
      env=dict(os.environ, PYTHONPATH=REPO), check=False)
  assert completed.returncode == 0, completed.stderr[-3000:]
  return completed.stdout


def summary_counts(line):
  return {key: int(value) for key, value in
          re.findall(r"(updates|gradients|pending|dropped|duplicates)=(\d+)",
                     line)}


def test_the_tutorials_fit_part_trains_every_step_through_the_protocol():
  # 5 epochs x 20 steps (steps_per_execution 10) on 3 learners, async:
  # 100 gradients, 100 updates; the tutorial's legacy SGD counts 100 steps.
  out = run_example("tutorial_fit", "--strategy=rudra")
  lines = out.strip().splitlines()
  assert "5 epochs of 20 steps" in lines[-2]
  assert lines[-2].endswith("optimizer iterations 100"), lines[-2]
  losses = re.search(r"loss by epoch ([\d., ]+);", lines[-2]).group(1)
  assert len(losses.split(", ")) == 5
  assert summary_counts(lines[-1]) == {
      "updates": 100, "gradients": 100, "pending": 0, "dropped": 0,
      "duplicates": 0}, lines[-1]


def test_the_tutorials_custom_loop_part_runs_as_written():
  # 4 epochs x 5 steps, then one more whose loss is fetched: 21 gradients
  # (the first shard's figures; every shard counts the same), async: 21
  # updates.
  out = run_example("tutorial_custom_loop", "--strategy=rudra")
  lines = out.strip().splitlines()
  epochs = [line for line in lines if line.startswith("Finished epoch")]
  assert [line.split(",")[0] for line in epochs] == [
      f"Finished epoch {i}" for i in range(4)]
  for prefix in ("Final loss is", "Evaluation accuracy:",
                 "Distributed evaluation accuracy:"):
    assert any(line.startswith(prefix) for line in lines), prefix
  assert "Checkpoints: 3 kept, latest ckpt-4" in lines[-2], lines[-2]
  assert summary_counts(lines[-1]) == {
      "updates": 21, "gradients": 21, "pending": 0, "dropped": 0,
      "duplicates": 0}, lines[-1]


def test_the_keras3_quick_start_trains_through_the_protocol():
  # README's Keras 3 quick start: 3 epochs of ceil(1000 / 32) = 32 learner
  # steps, 2-softsync on 4 learners (c = 2): 96 gradients, 48 updates.
  out = run_example("keras3_quick_start")
  epoch_lines = [line for line in out.splitlines() if line.startswith("32/32")]
  assert len(epoch_lines) == 3
  assert all("gradients: 32.0000" in line for line in epoch_lines)
  assert summary_counts(out.strip().splitlines()[-1]) == {
      "updates": 48, "gradients": 96, "pending": 0, "dropped": 0,
      "duplicates": 0}
  accuracy = float(re.search(r"evaluate: loss [\d.]+, accuracy ([\d.]+)",
                             out).group(1))
  assert accuracy > 0.8  # a linear rule: learnt, not guessed (0.5)
