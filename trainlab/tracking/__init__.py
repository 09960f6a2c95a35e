"""The MLflow adapter, one module per concern: uri (which store), runs (opening a stage's run), tracker (logging
to it), lineage (data hashes, dataset inputs), secrets (masking), retry (SQLite locks), queue and spool (an
outage of the server), replay (logging what was spooled)."""

import os

# MLflow 3 sends usage telemetry by default; this pipeline runs offline and must not touch the network.
# setdefault: a user who sets the variable explicitly keeps their choice. Read when mlflow is used, so
# setting it here, before any module of this package imports mlflow, is enough.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
