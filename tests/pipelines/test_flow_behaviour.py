"""The pipeline flow on tiny fake DVC repos, against a real Prefect server: retries, failures, skips, experiments."""

from __future__ import annotations

import json

import pytest
import yaml

from pipelines.execute import PermanentStageError
from tests.pipelines.conftest import dvc, git, make_fake_repo, task_runs_by_name

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

FLAKY_FILES = {
    # fails (exit 1, as a crash would) the first time it runs, then succeeds
    "flaky.py": """
        import pathlib, sys
        counter = pathlib.Path("../flaky-attempts")
        attempt = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(attempt))
        if attempt == 1:
            sys.exit("simulated crash")
        pathlib.Path("out").mkdir(exist_ok=True)
        pathlib.Path("out/flaky.txt").write_text("ok")
    """,
    # bad data: the stage reports it the way trainlab.core.cli does, with DataError's exit code 3
    "bad.py": """
        import sys
        print("error: data/x.csv row 3: not a number")
        sys.exit(3)
    """,
    "after.py": "open('out/after.txt', 'w').write('x')\n",
    "score.py": "import json; json.dump({'test_score': 0.5, 'n': 3}, open('score.json', 'w'))\n",
    "dvc.yaml": """
        stages:
          flaky:
            cmd: python flaky.py
            deps: [flaky.py]
            outs: [out/flaky.txt]
          bad:
            cmd: python bad.py
            deps: [bad.py, out/flaky.txt]
            outs: [out/bad.txt]
          after_bad:
            cmd: python after.py
            deps: [after.py, out/bad.txt]
            outs: [out/after.txt]
          independent:
            cmd: python score.py
            deps: [score.py]
            metrics:
              - score.json:
                  cache: false
    """,
}

SEEDED_FILES = {
    "prep.py": "import pathlib; pathlib.Path('prep.txt').write_text('prepared')\n",
    "seeded.py": """
        import json, yaml
        seed = yaml.safe_load(open("params.yaml"))["base"]["seed"]
        json.dump({"test_score": seed / 10}, open("score.json", "w"))
        open("model.txt", "w").write(str(seed))
    """,
    "dvc.yaml": """
        stages:
          prep:
            cmd: python prep.py
            deps: [prep.py]
            outs: [prep.txt]
          seeded:
            cmd: python seeded.py
            deps: [seeded.py, prep.txt]
            params: [base.seed]
            outs: [model.txt]
            metrics:
              - score.json:
                  cache: false
    """,
}


def test_transient_failures_retry_permanent_ones_fail_at_once_and_block_dependents(prefect_api, tmp_path):
    from pipelines.flow import pipeline

    repo = make_fake_repo(tmp_path / "repo", FLAKY_FILES)
    state = pipeline(root=str(repo), retries=2, retry_delay_s=0.2, return_state=True)

    assert state.is_failed()
    error = state.result(raise_on_failure=False)
    assert isinstance(error, PermanentStageError) and error.exit_code == 3
    assert "data/x.csv row 3: not a number" in str(error)
    assert (tmp_path / "flaky-attempts").read_text() == "2"  # crashed once, retried once, then ran
    runs = task_runs_by_name(str(state.state_details.flow_run_id))
    assert runs["flaky"][0].state.is_completed() and runs["flaky"][0].run_count == 2
    assert runs["bad"][0].state.is_failed() and runs["bad"][0].run_count == 1  # no retry for bad data
    assert runs["independent"][0].state.is_completed()
    assert "after_bad" not in runs  # blocked by its failed upstream, never started


def test_second_run_skips_every_stage_and_dvc_status_is_clean(prefect_api, tmp_path):
    from pipelines.flow import pipeline

    repo = make_fake_repo(tmp_path / "repo", SEEDED_FILES)
    first = pipeline(root=str(repo), retries=0)
    second = pipeline(root=str(repo), retries=0)

    assert [(s["stage"], s["status"]) for s in first["stages"]] == [("prep", "ran"), ("seeded", "ran")]
    assert [(s["stage"], s["status"]) for s in second["stages"]] == [("prep", "skipped"), ("seeded", "skipped")]
    assert second["stages"][1]["metrics"] == {"test_score": 0.1}
    assert all(s["seconds"] > 0 for s in first["stages"] + second["stages"])
    assert "up to date" in dvc(["status"], repo).stdout


def test_overrides_run_as_a_dvc_experiment_and_leave_params_yaml_alone(prefect_api, tmp_path):
    from pipelines.flow import pipeline

    repo = make_fake_repo(tmp_path / "repo", SEEDED_FILES)
    pipeline(root=str(repo), retries=0)
    params_before = (repo / "params.yaml").read_text()

    summary = pipeline(root=str(repo), overrides={"base.seed": 7}, experiment_name="seed-7", retries=0)

    assert summary["experiment"] == "seed-7" and summary["experiment_ref"].endswith("/seed-7")
    assert [(s["stage"], s["status"]) for s in summary["stages"]] == [("prep", "skipped"), ("seeded", "ran")]
    assert summary["stages"][1]["metrics"] == {"test_score": 0.7}
    assert (repo / "params.yaml").read_text() == params_before  # the workspace was not edited
    assert "up to date" in dvc(["status"], repo).stdout
    shown = json.loads(dvc(["exp", "show", "--json"], repo).stdout)
    exps = {e["name"]: e for baseline in shown for e in (baseline.get("experiments") or []) for e in e["revs"]}
    data = exps["seed-7"]["data"]
    assert data["params"]["params.yaml"]["data"]["base"]["seed"] == 7
    assert data["metrics"]["score.json"]["data"]["test_score"] == 0.7
    applied = yaml.safe_load(git(["show", f"{summary['experiment_ref']}:params.yaml"], repo))
    assert applied["base"]["seed"] == 7
    assert "# kept comment" in git(["show", f"{summary['experiment_ref']}:params.yaml"], repo)
