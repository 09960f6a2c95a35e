"""Docs check: the commands README.md and the docs show are run here, named with the test that runs them, or marked
`# not run here: <why>`; test selections select what they say; links, named tests and the stage table are true."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md",
        REPO / "data" / "raw" / "README.md"]
LINKED_DOCS = [*DOCS, REPO / "tests" / "reliability" / "README_TABLE.md"]
NOT_RUN = re.compile(r"#\s*not run here:\s*(\S.*)")

# Commands the docs show that a test runs: the command -> the test(s) that run it (or the function it calls).
BY_TEST: dict[str, tuple[str, ...]] = {
    # scripts/repro = setup + `dvc repro` + the summary: no test runs the whole default pipeline once through the
    # script; the full_pipeline test runs its `dvc repro --force` twice, test_summary its summary.
    "scripts/repro": (
        "tests/reliability/test_repro_twice.py::test_dvc_repro_force_twice_on_the_default_data_gives_identical_metrics",
        "tests/jobs/test_summary.py::test_summary_shows_headline_metrics_times_and_the_fastest_setting"),
    "scripts/repro train_classifier": (
        "tests/reliability/test_faults.py::test_kill_9_mid_epoch_then_dvc_repro_resumes_bitwise_equal",),
    # `dvc repro` with everything up to date: the flow's second run asks DVC stage by stage
    "dvc repro": ("tests/pipelines/test_pipeline.py::test_second_run_skips_every_stage_and_leaves_dvc_status_clean",),
    # with base.distributed.nproc_per_node > 1 the stage re-launches itself under torchrun (test_ddp_stage, 2 processes)
    "dvc repro train_classifier": ("tests/scaleout/test_dvc_remote.py::test_push_then_pull_into_a_fresh_clone",
                                   "tests/scaleout/test_ddp_stage.py::test_two_processes_end_with_the_weights_of_one"),
    "python -m stages.train_classifier data/prepared/classification models/classifier reports/classifier": (
        "tests/stages/test_train.py::test_a_run_that_cannot_open_stops_training_with_exit_6_and_writes_nothing",
        "tests/scaleout/test_ddp_stage.py::test_two_processes_end_with_the_weights_of_one"),
    "torchrun --standalone --nproc_per_node=4 -m stages.train_classifier data/prepared/classification "
    "models/classifier reports/classifier": (
        "tests/engine/test_distributed.py::test_two_gloo_processes_match_one_process",),
    "prefect server start --host 127.0.0.1": (
        "tests/pipelines/test_schedule_local.py::test_schedule_reuses_a_running_local_server_and_leaves_it_running",),
    # the flow tests call pipelines.flow.pipeline, the function the command line calls
    "python -m pipelines.flow": (
        "tests/pipelines/test_pipeline.py::test_first_run_executes_every_stage_under_one_parent_mlflow_run",),
    "python -m pipelines.flow -S classifier.lr=0.01 -S base.seed=1 --name lr-0.01": (
        "tests/pipelines/test_flow_behaviour.py::test_overrides_run_as_a_dvc_experiment_and_leave_params_yaml_alone",),
    "python -m pipelines.schedule": (
        "tests/pipelines/test_schedule_local.py::test_schedule_with_no_server_starts_one_whose_schedule_runs_the_job",
        "tests/pipelines/test_units.py::test_schedule_comes_from_params_or_the_command_line"),
    'python -m pipelines.schedule --cron "*/30 * * * *" --timezone Europe/Berlin': (
        "tests/pipelines/test_units.py::test_schedule_comes_from_params_or_the_command_line",),
    "python -m pipelines.schedule --interval 600": (
        "tests/pipelines/test_schedule.py::test_served_flow_runs_on_its_schedule_and_promotes_champions",),
    "python -m pipelines.schedule --pool trainlab-process": (
        "tests/pipelines/test_schedule.py::test_python_deploy_takes_the_cron_from_params",),
    "prefect worker start --pool trainlab-process": (
        "tests/pipelines/test_schedule.py::test_prefect_yaml_deploys_to_a_process_pool_whose_worker_runs_the_job",),
    "prefect work-pool create trainlab-process --type process": (
        "tests/pipelines/test_schedule.py::test_prefect_yaml_deploys_to_a_process_pool_whose_worker_runs_the_job",),
    'prefect --no-prompt deploy --prefect-file pipelines/prefect.yaml --name trainlab-retrain --cron '
    '"$(python -m pipelines.schedule --print-cron)" --timezone "$(python -m pipelines.schedule --print-timezone)"': (
        "tests/pipelines/test_schedule.py::test_prefect_yaml_deploys_to_a_process_pool_whose_worker_runs_the_job",),
    "prefect deployment run trainlab-retrain/trainlab-retrain": (
        "tests/pipelines/test_schedule.py::test_prefect_yaml_deploys_to_a_process_pool_whose_worker_runs_the_job",),
    # the sweep tests call pipelines.sweep.sweep, the function the command line calls
    "python -m pipelines.sweep --grid classifier.lr=0.001,0.003 --grid base.seed=1,2 --concurrency 2 --name lr-seed": (
        "tests/pipelines/test_sweep.py::test_sweep_runs_points_two_at_a_time_as_experiments_and_mlflow_runs",),
    "python -m pipelines.sweep --grid classifier.lr=0.001,0.003 --target train_classifier": (
        "tests/pipelines/test_sweep.py::test_sweep_runs_points_two_at_a_time_as_experiments_and_mlflow_runs",),
    "prefect --no-prompt deploy --prefect-file pipelines/prefect.yaml --name sweep-point": (
        "tests/pipelines/test_sweep.py::test_sweep_points_run_on_a_work_pool_by_its_worker",),
    "prefect worker start --pool trainlab-process --limit 2": (
        "tests/pipelines/test_sweep.py::test_sweep_points_run_on_a_work_pool_by_its_worker",),
    "python -m pipelines.sweep --grid classifier.lr=0.001,0.003 --deployment trainlab-sweep-point/sweep-point": (
        "tests/pipelines/test_sweep.py::test_sweep_points_run_on_a_work_pool_by_its_worker",),
    # the search tests call pipelines.search.search, the function the command line calls; the resume test runs the
    # command itself, kills it and runs it again
    "python -m pipelines.search pipelines/spaces/classifier.yaml --trials 16 --parallel 2": (
        "tests/pipelines/test_search.py::test_a_study_runs_trials_two_at_a_time_as_experiments_nested_runs_and_plots",
        "tests/pipelines/test_search.py::test_a_killed_search_resumes_its_study_and_runs_the_killed_trial_again"),
    "dvc exp apply classifier-007": (
        "tests/pipelines/test_search.py::test_a_study_runs_trials_two_at_a_time_as_experiments_nested_runs_and_plots",),
    "python -m pipelines.compare classifier": (
        "tests/pipelines/test_compare.py::test_cli_prints_the_table_and_says_why_it_does_not_promote",),
    "python -m pipelines.compare segmenter --markdown": (
        "tests/pipelines/test_compare.py::test_cli_prints_the_table_and_says_why_it_does_not_promote",),
    "python -m pipelines.compare text --promote": (
        "tests/pipelines/test_compare.py::test_cli_prints_the_table_and_says_why_it_does_not_promote",
        "tests/pipelines/test_compare.py::test_promotion_moves_champion_only_for_a_better_version"),
    "python -m trainlab.tracking.replay": (
        "tests/reliability/test_outage.py::test_server_gone_for_good_exit_6_with_outputs_then_replay_and_rerun_complete_the_run",),
    "python -m trainlab.verify models/classifier": (
        "tests/test_verify.py::test_a_run_verified_on_the_machine_that_trained_it_is_identical",),
    "python -m trainlab.verify models/classifier --epochs 1": (
        "tests/test_verify.py::test_a_fingerprint_difference_is_named_in_the_verdict",),
    "python -m trainlab.verify models/classifier --bisect": (
        "tests/test_verify.py::test_an_injected_nondeterminism_is_found_at_its_epoch_and_with_bisect_at_its_step",),
    "python -m trainlab.verify --lock": (
        "tests/pipelines/test_reproducible.py::test_verify_lock_finds_every_output_but_the_profiles_identical_to_the_committed_dvc_lock",),
    "python -m benchmarks --only trail": (
        "tests/test_benchmarks.py::test_the_trail_part_times_the_verify_trail_against_training",),
    "python -m benchmarks --quick --only classifier,mfu": (
        "tests/test_benchmarks.py::test_quick_classifier_and_mfu_parts_write_their_reports",),
    # the predict tests run the command's main() in-process on the test split written out as files; test_readme_model
    # runs the README's model commands as written, in the tiny repo after its first pipeline run
    "python -m trainlab.predict models/classifier path/to/digits/ --out predictions/digits": (
        "tests/jobs/test_predict.py::test_raw_test_split_gives_exactly_the_accuracy_evaluate_reports",
        "tests/pipelines/test_readme_model.py::test_model_commands_work_as_written_after_the_first_run"),
    "python -m trainlab.predict models:/trainlab-text@champion reviews.csv --out predictions/reviews": (
        "tests/jobs/test_predict.py::test_texts_from_stdin_and_tsv",
        "tests/jobs/test_predict.py::test_the_registry_champion_predicts_what_the_model_folder_does",
        "tests/pipelines/test_readme_model.py::test_model_commands_work_as_written_after_the_first_run"),
    "mlflow models serve -m models:/trainlab-classifier@champion --env-manager local --host 127.0.0.1 --port 5001": (
        "tests/serving/test_server.py::test_classifier_server_answers_base64_images_and_400_for_a_corrupt_one",
        "tests/pipelines/test_readme_model.py::test_model_commands_work_as_written_after_the_first_run"),
}

# The narrow experiment table docs/reproducibility.md gives: each model's test figure and the params most changed.
HEADLINE_KEEP = r"^(Experiment|Created)$|.*test_(accuracy|mean_iou)|.*\.(arch|epochs|lr|batch_size|seed)$"
HEADLINE_TABLE = f"dvc exp show --drop '.*' --keep '{HEADLINE_KEEP}'"

# Cheap, offline commands this check runs itself (in the repo, reading the committed reports): command -> argv.
RUN_HERE: dict[str, list[str]] = {
    "dvc metrics show": ["dvc", "metrics", "show"],
    "dvc plots show": ["dvc", "plots", "show", "-o", "{tmp}/dvc_plots"],  # written to tmp, not the repo
    "dvc exp show": ["dvc", "exp", "show", "--no-pager"],
    "dvc exp show --only-changed": ["dvc", "exp", "show", "--only-changed", "--no-pager"],
    HEADLINE_TABLE: ["dvc", "exp", "show", "--drop", ".*", "--keep", HEADLINE_KEEP, "--no-pager"],
}

# `scripts/test ARGS` selections the docs show -> what every selected test must be (by its markers and path).
NOT_FULL = "full_pipeline"
# docs/scaleout.md's selection: every test its table names (test_the_scaleout_selection_runs_every_test_of_its_table)
SCALEOUT_TESTS = ("tests/scaleout tests/engine/test_distributed.py tests/pipelines/test_schedule.py "
                  "tests/pipelines/test_sweep.py")
SELECTIONS = {
    "": lambda node, marks: NOT_FULL not in marks,
    '-m "not slow"': lambda node, marks: "slow" not in marks and NOT_FULL not in marks,
    "-m slow": lambda node, marks: "slow" in marks and NOT_FULL not in marks,
    "-m reliability": lambda node, marks: "reliability" in marks and NOT_FULL not in marks,
    "-m integration": lambda node, marks: "integration" in marks and NOT_FULL not in marks,
    "-m gpu": lambda node, marks: "gpu" in marks and NOT_FULL not in marks,
    "-m full_pipeline": lambda node, marks: NOT_FULL in marks,
    "tests/pipelines": lambda node, marks: node.startswith("tests/pipelines/") and NOT_FULL not in marks,
    'tests/pipelines -m "not slow"': lambda node, marks: node.startswith("tests/pipelines/") and "slow" not in marks,
    SCALEOUT_TESTS: lambda node, marks: node.startswith(tuple(SCALEOUT_TESTS.split())) and NOT_FULL not in marks,
}
EVERYTHING = "-m 'full_pipeline or not full_pipeline'"  # a -m naming full_pipeline keeps it: every test

# Lines that only set up the shell (they run nothing to check); scripts/test and scripts/repro begin the same way.
SETUP = re.compile(r"^(source \.venv/bin/activate|export [A-Z_]+=\S.*)$")


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    text: str
    not_run: str | None  # the reason, when marked `# not run here: <why>`

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def code_blocks(path: Path) -> list[tuple[int, str, list[tuple[int, str]]]]:
    """(line of the opening fence, language, [(line number, line)]) of every fenced block."""
    blocks, current = [], None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fence = line.strip()
        if fence.startswith("```"):
            if current is None:
                current = (number, fence[3:].strip(), [])
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current[2].append((number, line))
    assert current is None, f"{path}: a code block opened at line {current[0]} is not closed"
    return blocks


def shell_commands(path: Path) -> list[Command]:
    """Every command of the doc's bash blocks; continuation lines joined, trailing comments read for the mark."""
    doc, commands = str(path.relative_to(REPO)), []
    for _, language, lines in code_blocks(path):
        if language != "bash":
            continue
        block_reason, pending, start = None, "", 0
        for number, line in lines:
            text = line.strip()
            if not pending and text.startswith("#"):
                mark = NOT_RUN.match(text)
                block_reason = mark[1] if mark else block_reason
                continue
            start = start if pending else number
            command, *comment = re.split(r"\s+#(?=\s|$)", text, maxsplit=1)
            if command.endswith("\\"):
                pending += command[:-1].strip() + " "
                continue
            command, pending = " ".join((pending + command).split()), ""
            if not command:
                continue
            mark = NOT_RUN.search("#" + comment[0]) if comment else None
            commands.append(Command(doc, start, command, mark[1] if mark else block_reason))
    return commands


def all_commands() -> list[Command]:
    return [command for path in DOCS for command in shell_commands(path)]


def scripts_test_args(command: str) -> str | None:
    return command.removeprefix("scripts/test").strip() if command.split()[:1] == ["scripts/test"] else None


def run_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}


# --- one subprocess collects every selection (pytest's imports are paid once) ----------------------------------

COLLECT = r"""
import json, sys
import pytest

class Recorder:
    items = []
    def pytest_collection_finish(self, session):
        self.items = [(item.nodeid, sorted({m.name for m in item.iter_markers()})) for item in session.items]

result = {}
for key, args in json.loads(sys.argv[1]).items():
    recorder = Recorder()
    code = pytest.main(["--collect-only", "-qq", "-p", "no:cacheprovider", *args], plugins=[recorder])
    result[key] = {"code": int(code), "items": recorder.items}
print("\n@@collected@@" + json.dumps(result))
"""


@cache
def collector() -> subprocess.Popen:
    wanted = {key: shlex.split(key) for key in [*SELECTIONS, EVERYTHING]}
    return subprocess.Popen([sys.executable, "-c", COLLECT, json.dumps(wanted)], cwd=REPO, env=run_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def result_of(proc: subprocess.Popen, marker: str) -> dict[str, dict]:
    try:
        out, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    assert marker in out, out[-3000:]
    return json.loads(out.rsplit(marker, 1)[1])


@cache
def collected() -> dict[str, dict]:
    return result_of(collector(), "@@collected@@")


# --- one subprocess prints the --help of every module the docs run with `python -m` -------------------------------

HELP = r"""
import contextlib, io, json, runpy, sys

result = {}
for module in json.loads(sys.argv[1]):
    out = io.StringIO()
    sys.argv = [module, "--help"]
    code = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code
        except Exception as exc:  # e.g. a module the docs name that does not exist (any more)
            code = f"{type(exc).__name__}: {exc}"
    result[module] = {"code": code, "help": out.getvalue()}
sys.stdout.write("\n@@help@@" + json.dumps(result))
"""

STAGES = sorted(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"])


def python_modules() -> list[str]:
    modules = {f"stages.{stage}" for stage in STAGES}
    for command in all_commands():
        modules.update(re.findall(r"python -m ([\w.]+)", command.text))
    return sorted(modules)


@cache
def helper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HELP, json.dumps(python_modules())], cwd=REPO, env=run_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@cache
def helps() -> dict[str, dict]:
    return result_of(helper(), "@@help@@")


@pytest.fixture(scope="module", autouse=True)
def start_in_background():
    """Both subprocesses start at once and run while the cheap checks run; stopped at the end if nobody read them."""
    procs = collector(), helper()
    yield
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def node_exists(node: str) -> bool:
    nodes = [item for item, _ in collected()[EVERYTHING]["items"]]
    return any(n == node or n.startswith(node + "[") for n in nodes)


# --- the checks --------------------------------------------------------------------------------------------------

def test_every_code_block_names_its_language():
    unnamed = [f"{path.relative_to(REPO)}:{line}" for path in LINKED_DOCS for line, language, _ in code_blocks(path)
               if not language]
    assert not unnamed, f"code blocks without a language (bash for commands, text for the rest): {unnamed}"


def test_every_shell_command_is_run_here_named_with_its_test_or_marked_not_run_here():
    commands = all_commands()
    assert len(commands) > 30  # the extraction found the docs' commands
    unaccounted = [str(c) for c in commands
                   if c.not_run is None and not SETUP.match(c.text) and c.text not in BY_TEST
                   and c.text not in RUN_HERE and scripts_test_args(c.text) not in SELECTIONS]
    assert not unaccounted, ("commands the docs show that no test runs; add the test to BY_TEST, the command to "
                             "RUN_HERE, or mark it '# not run here: <why>':\n" + "\n".join(unaccounted))
    shown = {c.text for c in commands if c.not_run is None}
    stale = [c for c in [*BY_TEST, *RUN_HERE] if c not in shown]
    assert not stale, f"entries for commands the docs no longer show: {stale}"
    assert all(c.not_run.strip() for c in commands if c.not_run is not None)


def test_test_selections_named_in_the_text_are_checked_too():
    inline = {m.removeprefix("scripts/test").strip() for path in LINKED_DOCS
              for m in re.findall(r"`(scripts/test[^`]*)`", path.read_text())}
    assert inline and not inline - set(SELECTIONS), f"add to SELECTIONS: {inline - set(SELECTIONS)}"


def test_the_tests_named_for_doc_commands_exist():
    missing = [node for nodes in BY_TEST.values() for node in nodes if not node_exists(node)]
    assert not missing, f"BY_TEST names tests that do not exist: {missing}"


def test_every_test_the_docs_name_exists():
    named = {m for path in LINKED_DOCS
             for m in re.findall(r"tests/[\w/]+\.py::\w+(?:\[[^\]`]*\])?", path.read_text())}
    assert len(named) > 40
    missing = sorted(node for node in named if not node_exists(node))
    assert not missing, f"the docs name tests that do not exist: {missing}"
    files = {m for path in LINKED_DOCS for m in re.findall(r"`(tests/[\w/]+\.py)", path.read_text())}
    assert not [f for f in files if not (REPO / f).is_file()]


@pytest.mark.parametrize("command", sorted(RUN_HERE))
def test_cheap_commands_run(command, tmp_path):
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in RUN_HERE[command]]
    proc = subprocess.run([str(BIN / argv[0]), *argv[1:]], cwd=REPO, env=run_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"{command}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"


def exp_show_columns(*args: str) -> list[str]:
    proc = subprocess.run([str(BIN / "dvc"), "exp", "show", "--csv", *args], cwd=REPO, env=run_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.splitlines()[0].split(",")


def test_the_headline_experiment_table_is_narrow_and_shows_every_models_test_figure():
    columns = exp_show_columns("--drop", ".*", "--keep", HEADLINE_KEEP)
    assert len(columns) <= 30, columns
    for metric in ("reports/classifier/metrics.json:test_accuracy", "test_mean_iou",
                   "reports/text/metrics.json:test_accuracy", "classifier.lr"):
        assert metric in columns, (metric, columns)


# The counts docs/reproducibility.md gives, each found by the words around it (the number is group 1). "about N"
# (counts that grow with every param and module) must be within 10%, the others exact.
REPRO_COUNTS = {
    "params": r"every leaf of params\.yaml \((about \d+) of them",
    "deps": r"the hash of every file a stage depends on \((about \d+):",
    "headline columns": r"the params most often changed \((\d+) columns\)",
    "columns": r"every param, metric and dependency hash \((about \d+) columns\)",
}


def param_leaves(node) -> int:
    return sum(param_leaves(value) for value in node.values()) if isinstance(node, dict) and node else 1


def test_the_counts_docs_reproducibility_gives_are_todays():
    text = " ".join((REPO / "docs" / "reproducibility.md").read_text().split())
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    actual = {"params": param_leaves(yaml.safe_load((REPO / "params.yaml").read_text())),
              "deps": len({dep for stage in stages.values() for dep in stage.get("deps", [])}),
              "headline columns": len(exp_show_columns("--drop", ".*", "--keep", HEADLINE_KEEP)),
              "columns": len(exp_show_columns())}
    wrong = []
    for name, pattern in REPRO_COUNTS.items():
        found = re.search(pattern, text)
        assert found, f"docs/reproducibility.md no longer gives the {name} count ({pattern})"
        stated = int(found[1].removeprefix("about "))
        if abs(stated - actual[name]) > (0.1 * actual[name] if found[1].startswith("about") else 0):
            wrong.append(f"{name}: says {found[1]}, is {actual[name]}")
    assert not wrong, f"docs/reproducibility.md: {wrong}"


def test_the_scaleout_selection_runs_every_test_of_its_table():
    text = (REPO / "docs" / "scaleout.md").read_text()
    table = set(re.findall(r"`(tests/[\w/]+\.py)`", text.split("\n## ", 1)[0]))  # the table above the first section
    assert f"scripts/test {SCALEOUT_TESTS}" in text
    assert table and all(test.startswith(tuple(SCALEOUT_TESTS.split())) for test in table), table


def test_the_license_pyproject_names_is_in_the_repo_and_dvc_plots_is_git_ignored():
    assert 'license = "MIT"' in (REPO / "pyproject.toml").read_text()
    assert (REPO / "LICENSE").read_text().startswith("MIT License")
    proc = subprocess.run(["git", "check-ignore", "-q", "dvc_plots/index.html"], cwd=REPO)
    assert proc.returncode == 0, "dvc_plots/ (what dvc plots show writes) is not git-ignored"


@pytest.mark.parametrize("key", ["cron", "timezone"])
def test_the_cron_and_time_zone_the_docs_deploy_with_come_from_params(key):
    proc = subprocess.run([sys.executable, "-m", "pipelines.schedule", f"--print-{key}"], cwd=REPO, env=run_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == yaml.safe_load((REPO / "params.yaml").read_text())["schedule"][key]


@pytest.mark.parametrize("args", sorted(SELECTIONS))
def test_test_selections_select_what_the_docs_say(args):
    result = collected()[args]
    assert result["code"] == 0 and result["items"], f"scripts/test {args}: exit {result['code']}, nothing collected"
    wrong = [node for node, marks in result["items"] if not SELECTIONS[args](node, set(marks))]
    assert not wrong, f"scripts/test {args} selects {len(wrong)} tests it should not, e.g. {wrong[:5]}"


def test_the_default_run_leaves_out_only_the_full_pipeline_test():
    everything = {node for node, _ in collected()[EVERYTHING]["items"]}
    default = {node for node, _ in collected()[""]["items"]}
    full = {node for node, marks in collected()[EVERYTHING]["items"] if NOT_FULL in marks}
    assert full and everything - default == full


def test_options_the_docs_pass_exist():
    """Every --option a `python -m` command in the docs passes is in that module's --help."""
    unknown = []
    for command in all_commands():
        for module, args in re.findall(r"python -m ([\w.]+)((?: [^|;&)]*)?)", command.text):
            shown = helps()[module]
            assert shown["code"] in (0, None), f"{module} --help: exit {shown['code']}\n{shown['help'][-2000:]}"
            unknown += [f"{command}: {option}" for option in re.findall(r"(?<!\S)(--[\w-]+|-[A-Za-z])\b", args)
                        if not re.search(rf"(?<![\w-]){re.escape(option)}\b", shown["help"])]
    assert not unknown, "options the docs pass that the command does not take:\n" + "\n".join(unknown)


def test_every_stage_answers_help():
    for stage in STAGES:
        shown = helps()[f"stages.{stage}"]
        assert shown["code"] == 0 and f"python -m stages.{stage}" in shown["help"], shown["help"][-2000:]


def test_every_stage_help_shows_debug():
    assert all("--debug" in helps()[f"stages.{stage}"]["help"] for stage in STAGES)


def test_links_point_to_files_that_exist():
    broken = []
    for path in LINKED_DOCS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"[a-z]+:", target):
                    continue
                file, _, anchor = target.partition("#")
                resolved = (path.parent / file).resolve() if file else path
                if not resolved.exists():
                    broken.append(f"{path.relative_to(REPO)}:{number}: {target}")
                elif anchor and anchor not in heading_slugs(resolved):
                    broken.append(f"{path.relative_to(REPO)}:{number}: {target} (no such heading)")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def heading_slugs(path: Path) -> set[str]:
    headings = re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_readme_is_a_page_a_newcomer_reads_and_its_stage_table_is_dvc_yaml():
    """Lines within 120 columns, no measurement log (its figures are generated: tests/test_figures.py), and one row
    per dvc.yaml stage, in order."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300 and max(map(len, readme.splitlines())) <= 120
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert re.findall(r"^\| `(\w+)` \|", readme, flags=re.M) == list(stages)


def test_dvc_dag_draws_every_stage_of_the_readme_table():
    proc = subprocess.run([str(BIN / "dvc"), "dag"], cwd=REPO, env=run_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert all(f"| {stage} |" in proc.stdout for stage in STAGES), proc.stdout


def layout_folders() -> list[str]:
    """The folders the README's Layout block names: top-level ones, and trainlab/'s sub-packages indented below."""
    readme = (REPO / "README.md").read_text()
    block = next(lines for _, language, lines in code_blocks(REPO / "README.md")
                 if language == "text" and any(line.startswith("trainlab/") for _, line in lines))
    assert "## Layout" in readme
    folders = []
    for _, line in block:
        if not line.strip():
            continue
        name = line.split()[0]
        if name.endswith("/"):
            folders.append(("trainlab/" if line.startswith("  ") else "") + name)
    return folders


def test_the_readme_layout_names_folders_that_exist():
    folders = layout_folders()
    assert len(folders) > 10
    missing = [folder for folder in folders if not (REPO / folder).is_dir()]
    assert not missing, f"README's layout names folders that do not exist: {missing}"
