"""Checks a --checkpoint_dir before anything starts; records what it holds.

TensorFlow's checkpoints say nothing about the run that wrote them. The chief
also writes `rudra_run.json` (the flags that fix the model, the protocol and
the cluster shape), and every task checks it before any server starts: a
directory written by a different model or protocol, or with missing or
unreadable files, gets a one-line error and is left exactly as it was.
"""

import json
import os
import re
import tempfile

RUN_FILE = "rudra_run.json"
# Flags a resumed run must share with the run that wrote the checkpoint:
# the variables (model, dataset shapes), the shard state (protocol, λ, ps
# tasks), the meaning of the saved counters and slots (lr_policy) and of a
# checkpoint's number, the steps trained (steps_per_epoch, and minibatch,
# from which the default steps_per_epoch follows), the compensation rule
# (whose per-parameter state the checkpoint holds).
MUST_MATCH = ("model", "dataset", "protocol", "num_learners", "num_ps",
              "lr_policy", "steps_per_epoch", "minibatch", "compensation")

# Identity fields newer than some run files, with the value those runs had.
ADDED_LATER = {"compensation": "none"}


def run_identity(config):
  return {name: getattr(config, name) for name in MUST_MATCH}


def latest_checkpoint(directory):
  """The latest checkpoint prefix TF's `checkpoint` file names, or None."""
  state = os.path.join(directory, "checkpoint")
  if not os.path.exists(state):
    return None
  with open(state) as f:
    match = re.search(r'^model_checkpoint_path: "(.*)"$', f.read(), re.M)
  if not match:
    raise ValueError(f"{state} is corrupt (no model_checkpoint_path); "
                     "restore it or use another --checkpoint_dir.")
  prefix = match.group(1)
  return prefix if os.path.isabs(prefix) else os.path.join(directory, prefix)


def missing_files(prefix):
  """Files of checkpoint `prefix` that are absent: the .index and every
  .data-K-of-N shard (one per task that saved variables)."""
  folder, name = os.path.split(prefix)
  present = set(os.listdir(folder)) if os.path.isdir(folder) else set()
  missing = [] if name + ".index" in present else [name + ".index"]
  shards = [re.fullmatch(re.escape(name) + r"\.data-(\d+)-of-(\d+)", f)
            for f in present]
  counts = {int(m.group(2)) for m in shards if m}
  if not counts:
    return missing + [name + ".data-*"]
  total = max(counts)
  found = {int(m.group(1)) for m in shards if m}
  return missing + [f"{name}.data-{k:05d}-of-{total:05d}"
                    for k in range(total) if k not in found]


def check_writable(directory):
  """Creates `directory` if needed and writes a file there, or raises
  ValueError saying why it cannot be used."""
  try:
    os.makedirs(directory, exist_ok=True)
    with tempfile.TemporaryFile(dir=directory):
      pass
  except OSError as error:
    raise ValueError(
        f"--checkpoint_dir={directory} cannot be created or written "
        f"({error.strerror or error}); give a folder this task can write "
        "(on a real cluster, one every task shares).") from None


def check_resumable(config):
  """Raises ValueError unless `config` can resume from its checkpoint_dir
  (a directory that does not exist yet must be creatable and writable)."""
  directory = config.checkpoint_dir
  if not directory:
    return
  check_writable(directory)
  latest = latest_checkpoint(directory)
  if latest is not None:
    missing = missing_files(latest)
    if missing:
      raise ValueError(f"--checkpoint_dir={directory}: the latest checkpoint "
                       f"{latest} lacks {', '.join(missing)}; restore the "
                       "files or use another --checkpoint_dir.")
  path = os.path.join(directory, RUN_FILE)
  if not os.path.exists(path):
    if latest is not None:
      raise ValueError(f"--checkpoint_dir={directory} holds checkpoints but "
                       f"no {RUN_FILE}, so it was not written by "
                       "launch/train.py; use another --checkpoint_dir.")
    return
  try:
    with open(path) as f:
      saved = json.load(f)
  except ValueError:
    raise ValueError(f"{path} is corrupt (not JSON); restore it or use "
                     "another --checkpoint_dir.") from None
  current = run_identity(config)
  saved = {**ADDED_LATER, **saved}
  differences = [f"{name} {saved.get(name)!r} there, {value!r} now"
                 for name, value in current.items()
                 if saved.get(name) != value]
  if differences:
    raise ValueError(f"--checkpoint_dir={directory} belongs to a different "
                     f"run ({'; '.join(differences)}); resume with the same "
                     "flags or use a new --checkpoint_dir. Nothing was "
                     "changed.")


def record_run(config):
  """Writes RUN_FILE into the checkpoint_dir (the chief, before training)."""
  os.makedirs(config.checkpoint_dir, exist_ok=True)
  path = os.path.join(config.checkpoint_dir, RUN_FILE)
  if not os.path.exists(path):
    with open(path, "w") as f:
      json.dump(run_identity(config), f, indent=1)
