"""The MLflow adapter, one module per concern: uri (which store), runs (planning and opening a stage's run), tracker
(logging to it), lineage (data hashes, dataset inputs), secrets (masking), retry (SQLite locks), outage (an error:
no answer, or a refusal), queue and spool (training through an outage of the server), replay (logging what was
spooled). Only MLflow talk: nothing here writes a stage's outputs (trainlab.jobs.outputs does), and it reaches
training only through the Tracker's `failed` event (trainlab.engine.contract), so no stage has it as a DVC dep."""

import os

# MLflow 3 sends usage telemetry by default; this pipeline runs offline and must not touch the network.
# setdefault: a user who sets the variable explicitly keeps their choice. Read when mlflow is used, so
# setting it here, before any module of this package imports mlflow, is enough.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# A stage's log is read by people: no "Downloading artifacts" bars while MLflow checks a logged model's example.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
