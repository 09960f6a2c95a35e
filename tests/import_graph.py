"""The import graph of this repo's code, for the tests: it lives in trainlab/import_graph.py (code may not import the
tests, and `python -m trainlab.dvc_deps` reads it)."""

from trainlab.import_graph import CODE_ROOTS, REPO, Import, imports_in, module_file, module_name, repo_modules

__all__ = ["CODE_ROOTS", "REPO", "Import", "imports_in", "module_file", "module_name", "repo_modules"]
