"""PyReportJob: a report from SQL to a CSV file, in Python.

Args: [db, statement, file_name]. Runs the query on the runner's database
``db`` (granted in wasmjobs.toml) and writes the rows, with a header line,
to ``/reports/<file_name>`` in the plugin's preopened directory.
"""

import csv
import os

from wasmjobs_guest import WitWorld, Dead, job, log, sql  # noqa: F401 (WitWorld is the component's export)

REPORTS = "/reports"


@job
def perform(info, db, statement, file_name):
    if os.sep in file_name or file_name in ("", ".", ".."):
        raise Dead(f"file name {file_name!r} must be a plain name inside {REPORTS}")
    result = sql.query(db, statement)
    path = f"{REPORTS}/{file_name}"
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(result.columns)
        writer.writerows(result.rows)
    log.info(f"{path}: {len(result.rows)} rows, {len(result.columns)} columns")
