"""On PYTHONPATH, makes MLflow, DVC and Prefect unimportable: a CPU rehearsal of the bare GPU machine's environment."""

import sys

ABSENT = ("mlflow", "dvc", "prefect")


class _Absent:
    """A meta-path finder that answers as Python does for a package that is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r} (benchmarks/no_trackers: as on the GPU machine)",
                                      name=name)
        return None


sys.meta_path.insert(0, _Absent())
