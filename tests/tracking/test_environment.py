"""trainlab.tracking's MLflow settings: set unless the user chose otherwise."""

import os
import subprocess
import sys

PROBE = ("import trainlab.tracking; "
         "from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR as v, "
         "MLFLOW_DISABLE_TELEMETRY as t; print(v.get(), t.get())")


def probe(**env: str) -> str:
    base = {k: v for k, v in os.environ.items()
            if k not in ("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "MLFLOW_DISABLE_TELEMETRY")}
    done = subprocess.run([sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True, text=True,
                          check=True)
    return done.stdout.strip()


def test_no_artifact_progress_bars_and_no_telemetry_by_default():
    assert probe() == "False True"


def test_a_users_own_choice_is_kept():
    assert probe(MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="true", MLFLOW_DISABLE_TELEMETRY="false") == "True False"
