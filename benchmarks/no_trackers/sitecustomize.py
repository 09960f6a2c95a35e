"""On PYTHONPATH, makes MLflow, DVC and Prefect unimportable: a CPU rehearsal of the bare GPU machine's environment.

NO_TRACKERS_ALSO=mlxtend,cronsim hides those too, except from the folders on PYTHONPATH: a rehearsal of a package
the GPU machine lacks until scripts/gpu-check's preflight installs its wheel from .whl/ into such a folder."""

import importlib.machinery
import os
import sys

ABSENT = ("mlflow", "dvc", "prefect")
ALSO = tuple(x for x in os.environ.get("NO_TRACKERS_ALSO", "").split(",") if x)


class _Absent:
    """A meta-path finder that answers as Python does for a package that is not installed."""

    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in ALSO and path is None:  # found only where PYTHONPATH points (the preflight's --site)
            spec = importlib.machinery.PathFinder.find_spec(
                name, [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and "no_trackers" not in p])
            if spec is not None:
                return spec
        if top in ABSENT or (top in ALSO and path is None):
            raise ModuleNotFoundError(f"No module named {name!r} (benchmarks/no_trackers: as on the GPU machine)",
                                      name=name)
        return None


sys.meta_path.insert(0, _Absent())
