"""Run a stage module and record when heavy libraries load and the first training step starts and ends (cold start).

    BENCH_FIRST_STEP_FILE=out.json python -m benchmarks.first_step stages.train_classifier ARGS...

Writes wall-clock timestamps (time.time()) to the JSON file right after the first optimizer step, then exits at once
when BENCH_EXIT_AFTER_FIRST_STEP=1 (the rest of the stage is not part of the cold start). Run to its end, the stage
also leaves the end of its last optimizer step (`last_step_end`) and the start and end of its test-split evaluation
(`test_eval_start`, `test_eval_end`: the `evaluate` call of trainlab.jobs.train; validation goes through the engine's
own name for it) and the end of training (`fit_end`: the last epoch's validation done), written at exit. Only the
standard library is imported before the stage, so the stage's own import order is what gets measured.
"""

from __future__ import annotations

import time

STARTED = time.time()

import atexit
import importlib.abc
import importlib.machinery
import json
import os
import runpy
import sys

HEAVY = ("torch", "torchvision", "torchmetrics", "numpy", "pandas", "mlflow", "prefect", "dvc", "sklearn",
         "matplotlib", "lightning", "safetensors", "pydantic", "yaml", "PIL", "scipy", "torch._dynamo",
         "torchmetrics", "alembic", "sqlalchemy")
# Modules after whose import torch is loaded, so the step hooks can be installed.
HOOK_AFTER = ("trainlab.engine.loop", "trainlab.jobs.train")

marks: dict[str, float] = {"process_start": STARTED}
_state = {"hooked": False}


def _write() -> None:
    path = os.environ.get("BENCH_FIRST_STEP_FILE")
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(marks, f)
        os.replace(tmp, path)


def _install_hooks() -> None:
    if _state["hooked"]:
        return
    _state["hooked"] = True
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook

    handles = []

    def first_forward(module, args):
        if module.training and "first_forward" not in marks:
            marks["first_forward"] = time.time()

    def first_step(optimizer, args, kwargs):
        marks["last_step_end"] = time.time()
        if "first_step_end" in marks:
            return
        marks["first_step_end"] = marks["last_step_end"]
        handles[0].remove()
        _write()
        if os.environ.get("BENCH_EXIT_AFTER_FIRST_STEP") == "1":
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    handles += [register_module_forward_pre_hook(first_forward), register_optimizer_step_post_hook(first_step)]


def _marked(fn, name: str):
    """`fn` leaving `<name>_start` and `<name>_end` marks."""
    def timed(*args, **kwargs):
        marks[f"{name}_start"] = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            marks[f"{name}_end"] = time.time()
    return timed


class _Timed(importlib.abc.Loader):
    """Wraps a module's loader to time its execution (for a top-level package: the whole `import x`)."""

    def __init__(self, loader, name: str):
        self.loader, self.name = loader, name

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        t0 = time.time()
        try:
            self.loader.exec_module(module)
        finally:
            if self.name in HEAVY:
                marks[f"import_start:{self.name}"] = t0
                marks[f"import_end:{self.name}"] = time.time()
        if self.name in HOOK_AFTER:
            _install_hooks()
        if self.name == "trainlab.jobs.train":
            module.evaluate = _marked(module.evaluate, "test_eval")
            module.fit = _marked(module.fit, "fit")

    def __getattr__(self, item):  # get_resource_reader, is_package, ...
        return getattr(self.loader, item)


class _Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if not (name in HEAVY or name in HOOK_AFTER) or f"import_start:{name}" in marks:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _Timed(spec.loader, name)
        return spec


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m benchmarks.first_step MODULE [ARGS...]")
    module, args = sys.argv[1], sys.argv[2:]
    sys.meta_path.insert(0, _Watch())
    atexit.register(lambda: (marks.setdefault("exit", time.time()), _write()))
    sys.argv = [module, *args]
    marks["stage_start"] = time.time()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
