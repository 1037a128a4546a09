"""docs/study.md stands on its committed rows (docs/study/).

Three links of one chain: every study/ link in the study names a committed
file; every "mean (low–high)" figure in the study appears in a committed
table under docs/study/; and each table there is what its tool writes
from the committed rows beside it (launch.sweep's tables and curves,
launch.lr_grid's α0 grids, launch.gap_report's divisor tables). So a
figure edited by hand, a table not regenerated after its rows changed, or
rows not committed fail here.
"""

import json
import os
import re

import pytest

from launch import gap_report
from launch import lr_grid
from launch import sweep

STUDY_DIR = os.path.join(os.path.dirname(__file__), os.pardir, "docs")
STUDY = os.path.join(STUDY_DIR, "study.md")
ROWS = os.path.join(STUDY_DIR, "study")

# (rows, table, how launch.sweep writes it): each sweep folder's
# results.json committed as ROWS, its table.md or curves.md as TABLE.
SWEEP_TABLES = [
    ("sweep_lambda30_mu4.json", "sweep_lambda30_mu4.md", "markdown"),
    ("sweep_mu_lambda.json", "sweep_mu_lambda.md", "markdown"),
    ("sweep_mu_lambda_epochs10.json", "sweep_mu_lambda_epochs10.md",
     "markdown"),
    ("sweep_mu_lambda_epochs10.json", "sweep_mu_lambda_epochs10_curves.md",
     "curves"),
    ("lambda30_epochs10.json", "lambda30_epochs10.md", "markdown"),
    ("lambda30_epochs10.json", "lambda30_epochs10_curves.md", "curves"),
    ("single_learner_curve.json", "single_learner_curve.md", "curves"),
    ("compensation_lambda30.json", "compensation_lambda30.md", "markdown"),
    ("compensation_cluster_lambda4.json", "compensation_cluster_lambda4.md",
     "markdown"),
    ("compensation_cluster_dc_lambda4.json",
     "compensation_cluster_dc_lambda4.md", "markdown"),
    ("backup_straggler_lambda30.json", "backup_straggler_lambda30.md",
     "markdown"),
    ("backup_straggler_lambda30_epochs10.json",
     "backup_straggler_lambda30_epochs10.md", "markdown"),
    ("backup_straggler_lambda30_epochs10.json",
     "backup_straggler_lambda30_epochs10_curves.md", "curves"),
    ("compensation_lambda30_epochs10.json",
     "compensation_lambda30_epochs10.md", "markdown"),
    ("compensation_lambda30_epochs10.json",
     "compensation_lambda30_epochs10_curves.md", "curves"),
    ("alpha0.05_lambda30_epochs10.json", "alpha0.05_lambda30_epochs10.md",
     "markdown"),
    ("alpha0.05_lambda30_epochs10.json",
     "alpha0.05_lambda30_epochs10_curves.md", "curves"),
    ("alpha0.01_lambda30_epochs10.json", "alpha0.01_lambda30_epochs10.md",
     "markdown"),
    ("alpha0.01_lambda30_epochs10.json",
     "alpha0.01_lambda30_epochs10_curves.md", "curves"),
    ("alpha0.005_lambda30_epochs10.json", "alpha0.005_lambda30_epochs10.md",
     "markdown"),
    ("alpha0.005_lambda30_epochs10.json",
     "alpha0.005_lambda30_epochs10_curves.md", "curves"),
    ("alpha0.1_lambda30_epochs10.json", "alpha0.1_lambda30_epochs10.md",
     "markdown"),
    ("alpha0.1_lambda30_epochs10.json",
     "alpha0.1_lambda30_epochs10_curves.md", "curves"),
]

# (table, {α0: rows}): launch.lr_grid's table of the sweeps, one per α0.
LR_GRIDS = [
    ("lr_grid_lambda30.md", {
        0.005: "alpha_grid_lr0.005.json", 0.01: "alpha_grid_lr0.01.json",
        0.02: "sweep_lambda30_mu4.json", 0.05: "alpha_grid_lr0.05.json",
        0.1: "alpha_grid_lr0.1.json"}),
    ("lr_grid_lambda30_epochs10.md", {
        0.005: "alpha0.005_lambda30_epochs10.json",
        0.01: "alpha0.01_lambda30_epochs10.json",
        0.02: "lambda30_epochs10.json",
        0.05: "alpha0.05_lambda30_epochs10.json",
        0.1: "alpha0.1_lambda30_epochs10.json"}),
]

# (rows, table): launch.gap_report's table of a gap_aware sweep's rows.
GAP_TABLES = [
    ("gap_aware_divisor_lambda30_epochs10.json",
     "gap_aware_divisor_lambda30_epochs10.md"),
    ("gap_aware_divisor_momentum0.9_lambda30_epochs10.json",
     "gap_aware_divisor_momentum0.9_lambda30_epochs10.md"),
    ("gap_aware_divisor_momentum0_lambda30_epochs10.json",
     "gap_aware_divisor_momentum0_lambda30_epochs10.md"),
    ("gap_aware_divisor_divide_by_n_lambda30_epochs10.json",
     "gap_aware_divisor_divide_by_n_lambda30_epochs10.md"),
]

# A figure with its seeds' range, as the study and sweep tables print it.
MEAN_AND_RANGE = re.compile(r"\d\.\d{4} \(\d\.\d{4}–\d\.\d{4}\)")


def _read(path):
  with open(path, encoding="utf-8") as stream:
    return stream.read()


def _rows(name):
  with open(os.path.join(ROWS, name), encoding="utf-8") as stream:
    return json.load(stream)


def _committed_tables():
  return "".join(_read(os.path.join(ROWS, name))
                 for name in sorted(os.listdir(ROWS)) if name.endswith(".md"))


def test_every_study_link_names_a_committed_file():
  links = set(re.findall(r"\]\((study/[^)\s]+)\)", _read(STUDY)))
  assert links, "docs/study.md links no rows"
  missing = sorted(link for link in links
                   if not os.path.isfile(os.path.join(STUDY_DIR, link)))
  assert not missing, f"docs/study.md links files not committed: {missing}"


def test_every_mean_and_range_in_the_study_is_in_a_committed_table():
  figures = set(MEAN_AND_RANGE.findall(_read(STUDY)))
  assert len(figures) > 50, figures  # the pattern still matches the study
  tables = _committed_tables()
  unbacked = sorted(figure for figure in figures if figure not in tables)
  assert not unbacked, ("figures in docs/study.md that no table under "
                        f"docs/study/ holds: {unbacked}")


@pytest.mark.parametrize("rows_name, table_name, kind", SWEEP_TABLES)
def test_sweep_table_is_what_the_sweep_writes_from_its_rows(
    rows_name, table_name, kind):
  rows = _rows(rows_name)
  written = {"markdown": sweep.markdown_table,
             "curves": sweep.curves_table}[kind](rows)
  assert written == _read(os.path.join(ROWS, table_name)), (
      f"docs/study/{table_name} is not launch.sweep's {kind} table of "
      f"docs/study/{rows_name}: regenerate it from the rows")


@pytest.mark.parametrize("table_name, sweeps", LR_GRIDS)
def test_lr_grid_table_is_what_lr_grid_writes_from_its_sweeps(
    table_name, sweeps):
  averaged = lr_grid.average(
      [(alpha, os.path.join(ROWS, name)) for alpha, name in sweeps.items()])
  assert lr_grid.markdown(averaged) == _read(os.path.join(ROWS, table_name)), (
      f"docs/study/{table_name} is not launch.lr_grid's table of its "
      "sweeps: regenerate it")


@pytest.mark.parametrize("rows_name, table_name", GAP_TABLES)
def test_gap_table_is_what_gap_report_writes_from_its_rows(
    rows_name, table_name):
  written = gap_report.markdown(gap_report.averaged_gaps(_rows(rows_name)))
  assert written == _read(os.path.join(ROWS, table_name)), (
      f"docs/study/{table_name} is not launch.gap_report's table of "
      f"docs/study/{rows_name}: regenerate it from the rows")
