"""Static checks (ruff's pyflakes rules, configured in pyproject.toml) over every Python file of the project."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_no_undefined_names_unused_imports_or_unbound_locals():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]


MAX_FUNCTION_LINES = 60  # "about 50": a function a reader takes in at one screen


def test_every_function_fits_on_one_screen():
    """No function or method in the project's code is longer than MAX_FUNCTION_LINES lines (docstring included)."""
    import ast

    long = []
    for folder in ("trainlab", "pipelines", "stages", "benchmarks"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split these functions:\n" + "\n".join(long)
