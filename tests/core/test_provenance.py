"""A run's dirty flag on a real Git + DVC repo: a stage is dirty only when what it reads (its code, data, params,
dvc.yaml) differs from the commit, not because DVC deleted its git-tracked outs before running it."""

from __future__ import annotations

import json

from tests.pipelines.conftest import REPO, commit_all, dvc, git, make_fake_repo
from trainlab.core.provenance import git_state
from trainlab.tracking.runs import default_run_name

# The stage records what git_state says from inside `dvc repro`, and what a whole-tree `git status` says there.
FILES = {
    "record.py": """
        import json, os, subprocess
        from trainlab.core.provenance import git_state
        tree = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                              text=True, check=True).stdout.splitlines()
        record = {**git_state(), "tree": tree, "stage_env": os.environ.get("DVC_STAGE")}
        open(os.environ["RECORD"], "w").write(json.dumps(record))
        json.dump({"score": 1}, open("score.json", "w"))
    """,
    "input.txt": "the data\n",
    "notes.txt": "not read by the stage\n",
    "score.json": '{"score": 1}',  # committed, as the repo commits its metrics; the stage writes the same bytes
    "dvc.yaml": """
        stages:
          score:
            cmd: python record.py
            deps: [record.py, input.txt]
            params: [base.seed]
            metrics:
              - score.json:
                  cache: false
    """,
}


def test_a_stage_is_dirty_only_when_what_it_reads_differs_from_the_commit(tmp_path, monkeypatch):
    root = make_fake_repo(tmp_path / "repo", FILES)
    record = tmp_path / "record.json"
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("RECORD", str(record))
    monkeypatch.delenv("DVC_STAGE", raising=False)
    commit = git(["rev-parse", "HEAD"], root).strip()

    def repro(*args: str) -> dict:
        dvc(["repro", *args], root)
        return json.loads(record.read_text())

    first = repro()  # as on a fresh clone: DVC deletes the committed score.json, then runs the stage
    assert first["stage_env"] == "score" and " D score.json" in first["tree"], first  # the whole tree is not clean
    assert (first["git_commit"], first["git_dirty"]) == (commit, "false")
    assert default_run_name("score", first) == f"score {commit[:7]}"
    assert not git(["status", "--porcelain", "--untracked-files=no"], root).strip()  # score.json is back as committed

    (root / "notes.txt").write_text("edited, but the stage does not read it\n")
    assert repro("--force")["git_dirty"] == "false"

    (root / "input.txt").write_text("other data\n")  # a dep
    edited = repro()
    assert edited["git_dirty"] == "true"
    assert default_run_name("score", edited) == f"score {commit[:7]}-dirty"

    git(["checkout", "--", "input.txt", "notes.txt"], root)
    commit_all(root, "lock")
    with open(root / "params.yaml", "a") as params:  # a params file the stage reads
        params.write("# edited\n")
    assert repro("--force")["git_dirty"] == "true"


def test_a_stage_named_outside_dvc_is_judged_on_what_it_reads(tmp_path, monkeypatch):
    """The stage name a run is opened with (trainlab.tracking.runs) scopes the check as $DVC_STAGE does."""
    root = make_fake_repo(tmp_path / "repo", FILES)
    monkeypatch.chdir(root)
    monkeypatch.delenv("DVC_STAGE", raising=False)
    (root / "score.json").unlink()  # the stage's own out, as it is being rewritten
    git_state.cache_clear()
    try:
        assert git_state(str(root), "score")["git_dirty"] == "false"
        assert git_state(str(root))["git_dirty"] == "true"  # no stage: the whole tree
        assert git_state(str(root), "no_such_stage")["git_dirty"] == "true"
        (root / "record.py").write_text("# edited code\n")
        git_state.cache_clear()
        assert git_state(str(root), "score")["git_dirty"] == "true"
    finally:
        git_state.cache_clear()
