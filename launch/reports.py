"""Writes a script's result rows (JSON) and their markdown table side by side."""

import json
import os


def write_rows_and_table(out_dir, stem, rows, table):
  """OUT_DIR/STEM.json (the rows) and OUT_DIR/STEM.md (the table)."""
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, stem + ".json"), "w") as stream:
    json.dump(rows, stream, indent=2)
  with open(os.path.join(out_dir, stem + ".md"), "w") as stream:
    stream.write(table)
