"""Static checks over every Python file of the project: ruff's rules configured in pyproject.toml (F, E501, I)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def ruff(*args: str, source: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *args],
                          cwd=REPO, input=source, capture_output=True, text=True, timeout=120)


def test_no_undefined_names_unused_imports_unbound_locals_long_lines_or_unsorted_imports():
    proc = ruff(".")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]


def test_the_configured_rules_catch_an_unused_import_a_long_line_and_unsorted_imports():
    """The project's configuration, applied to a module of trainlab/: each of the three rule families fires."""
    long_line = "x = " + repr("a" * 115)  # 121 columns
    proc = ruff("--stdin-filename", "trainlab/lint_probe.py", "-", source=f"import sys\nimport os\n\n{long_line}\n")
    found = {code for code in ("F401", "E501", "I001") if f" {code} " in proc.stdout}
    assert proc.returncode == 1 and found == {"F401", "E501", "I001"}, proc.stdout + proc.stderr


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
