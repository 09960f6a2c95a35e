"""params.yaml validation: the repo's file loads; bad keys, types, ranges and cron fail with the key path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainlab.core.config import Params, TextParams, load_params
from trainlab.core.errors import ParamsError

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def test_repo_params_load_and_cover_every_section(repo_params):
    assert set(Params.model_fields) == {"base", "data", "classifier", "segmenter", "text", "evaluate", "profile",
                                        "tracking", "schedule"}
    raw = (REPO / "params.yaml").read_text()
    for section in Params.model_fields:
        assert f"\n{section}:" in "\n" + raw, f"params.yaml lacks section {section}"
    assert repo_params.base.seed == 42


def test_unknown_key_names_path_line_and_closest_key(tmp_path):
    path = write(tmp_path, "base:\n  seed: 1\nclassifier:\n  epochs: 2\n  lrr: 0.1\n")
    with pytest.raises(ParamsError) as err:
        load_params(path)
    msg = str(err.value)
    assert "classifier.lrr" in msg
    assert f"{path}:5" in msg
    assert "did you mean 'classifier.lr'" in msg


def test_wrong_type_and_out_of_range_and_bad_choice(tmp_path):
    path = write(tmp_path, "classifier:\n  epochs: many\n  lr: -1\nbase:\n  precision: fp8\n")
    with pytest.raises(ParamsError) as err:
        load_params(path)
    msg = str(err.value)
    assert "3 problems" in msg  # epochs: not a whole number nor auto, one problem
    assert "classifier.epochs" in msg and "valid integer" in msg and "'auto'" in msg
    assert "classifier.lr" in msg and "greater than 0" in msg
    assert "base.precision" in msg and "'fp32'" in msg and "'bf16'" in msg


def test_true_or_false_for_a_number_is_an_error_not_a_1_or_0(tmp_path):
    """YAML's yes/no read as 1/0 would train on batches of one or validate every step; a key that takes true or false
    (possibly beside auto) still takes it."""
    path = write(tmp_path, "classifier:\n  batch_size: true\n  validate_every: yes\n  lr: false\n  cutmix: true\n"
                           "  precise_bn: false\nbase:\n  deterministic: false\n")
    with pytest.raises(ParamsError) as err:
        load_params(path)
    msg = str(err.value)
    assert "3 problems" in msg, msg
    for key, line in (("batch_size", 2), ("validate_every", 3), ("lr", 4)):
        assert f"classifier.{key} ({path}:{line}): got" in msg and "true/false is not a number" in msg, msg
    listed = write(tmp_path, "text:\n  char_ngrams: [true, 5]\n  weight_decay: [0.1, false]\n")
    with pytest.raises(ParamsError) as err:
        load_params(listed)
    assert "2 problems" in str(err.value) and "text.char_ngrams" in str(err.value), str(err.value)
    assert "text.weight_decay" in str(err.value) and "true/false is not a number" in str(err.value)
    allowed = write(tmp_path, "classifier:\n  cutmix: true\n  precise_bn: false\nbase:\n  deterministic: false\n")
    params = load_params(allowed)
    assert (params.classifier.cutmix, params.classifier.precise_bn, params.base.deterministic) == (True, False, False)


def test_invalid_cron_and_timezone(tmp_path):
    path = write(tmp_path, "schedule:\n  cron: '61 * * * *'\n  timezone: Mars/Base\n")
    with pytest.raises(ParamsError) as err:
        load_params(path)
    assert "schedule.cron" in str(err.value) and "cron" in str(err.value)
    assert "schedule.timezone" in str(err.value)


def test_heads_must_divide_width(tmp_path):
    with pytest.raises(ParamsError, match=r"text.n_heads.*must divide text.d_model \(30\)"):
        load_params(write(tmp_path, "text:\n  d_model: 30\n  n_heads: 4\n"))


def test_text_weight_decay_is_a_number_or_auto_which_each_arch_reads_as_its_own(tmp_path):
    assert load_params(write(tmp_path, "text:\n  weight_decay: 0.001\n")).text.optimizer_weight_decay == 0.001
    for arch, optimizer_decay in (("tfidf_bag", 0.0), ("transformer", 0.01), ("nb_bag", 0.0)):
        text = load_params(write(tmp_path, f"text:\n  arch: {arch}\n  weight_decay: auto\n")).text
        assert text.weight_decay == "auto" and text.optimizer_weight_decay == optimizer_decay
    with pytest.raises(ParamsError, match=r"text.weight_decay.*params.yaml:3.*'auto'"):
        load_params(write(tmp_path, "text:\n  arch: tfidf_bag\n  weight_decay: automatic\n"))
    with pytest.raises(ParamsError, match=r"text.weight_decay \(.*params.yaml:2\).*from 0 to 1, .*or auto; got -0.1"):
        load_params(write(tmp_path, "text:\n  weight_decay: -0.1\n"))
    from pipelines.search_space import _numeric_kind  # a search space may range over it as over any float

    assert _numeric_kind(TextParams.model_fields["weight_decay"].annotation) == "float"


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ParamsError, match="not found"):
        load_params(tmp_path / "nope.yaml")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params(write(tmp_path, "base: [1,\n"))
    with pytest.raises(ParamsError, match="top level must be a mapping"):
        load_params(write(tmp_path, "- 1\n- 2\n"))


def test_overrides_are_validated_too(tmp_path):
    path = write(tmp_path, "base:\n  seed: 3\n")
    params = load_params(path, {"classifier.lr": 0.01, "base.seed": 5})
    assert params.classifier.lr == 0.01 and params.base.seed == 5
    with pytest.raises(ParamsError, match="classifier.lr"):
        load_params(path, {"classifier.lr": "fast"})


def test_section_hash_changes_only_with_its_section(repo_params):
    other = repo_params.model_copy(deep=True)
    other.text.lr = 0.5
    assert other.section_hash("classifier") == repo_params.section_hash("classifier")
    assert other.section_hash("text") != repo_params.section_hash("text")


def test_a_stage_exits_2_with_a_clear_message_and_writes_nothing(tmp_path):
    """The CLI path: a bad params file gives one error line naming the key, exit 2, no traceback, no output."""
    bad = write(tmp_path, "classifier:\n  lrr: 0.1\n")
    code = ("import sys; from trainlab.core.cli import run_cli; from trainlab.core.config import load_params; "
            f"run_cli(lambda argv: load_params({str(bad)!r}), [])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2
    assert "error:" in proc.stderr and "classifier.lrr" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]
