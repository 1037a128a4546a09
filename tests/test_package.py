"""`pip install .` builds a wheel with the package, the models and the
launch scripts as console entry points."""

import os
import subprocess
import sys
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(command, **kwargs):
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=600, **kwargs)
  assert result.returncode == 0, result.stdout + result.stderr
  return result.stdout


def test_wheel_installs_into_a_fresh_venv_and_runs_its_entry_point(tmp_path):
  # No build isolation and no dependency downloads: the wheel is built from
  # this checkout, and the venv sees the already-installed dependencies.
  run([sys.executable, "-m", "pip", "wheel", "--no-deps",
       "--no-build-isolation", "-w", str(tmp_path / "dist"), REPO])
  wheel, = (tmp_path / "dist").glob("rudra_tf-*.whl")
  names = zipfile.ZipFile(wheel).namelist()
  for module in ("rudra_tf/strategy.py", "rudra_tf/protocol.py",
                 "models/cifar10_full.py", "models/alexnet.py",
                 "launch/train.py", "launch/cluster_config.py"):
    assert module in names, module
  entry_points = next(n for n in names if n.endswith("entry_points.txt"))
  assert "rudra-train = launch.train:run" in zipfile.ZipFile(wheel).read(
      entry_points).decode()

  # Nothing but the venv may provide the package (Bazel sets PYTHONPATH).
  environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  environment.pop("PYTHONPATH", None)
  venv = tmp_path / "venv"
  run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
      env=environment)
  run([str(venv / "bin" / "pip"), "install", "--no-deps", "--no-index",
       str(wheel)], env=environment)
  location = run([str(venv / "bin" / "python"), "-c",
                  "import rudra_tf, models, launch; print(rudra_tf.__file__)"],
                 cwd=str(tmp_path), env=environment)
  assert location.startswith(str(venv)), location
  help_text = run([str(venv / "bin" / "rudra-train"), "--help"],
                  cwd=str(tmp_path), env=environment)
  for flag in ("--protocol", "--lr_policy", "--learners", "--global_batch"):
    assert flag in help_text, flag
