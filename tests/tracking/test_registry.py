"""The registry convention on a real MLflow store: a model's first registered version is its `champion`; a later
version leaves the alias where it is (only compare/promote moves it)."""

from __future__ import annotations

import pytest
import torch

from tests.tracking.conftest import client_for
from trainlab.tracking.registry import CHAMPION
from trainlab.tracking.runs import start_run

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


def test_the_first_registered_version_is_the_champion_and_a_later_one_does_not_take_it(params, store, capsys):
    versions = []
    for _ in range(2):
        with start_run(params, stage="train_classifier") as tracker:
            versions.append(tracker.log_model(torch.nn.Linear(4, 2), "classifier", torch.randn(2, 4), "tiny"))
    assert versions == ["1", "2"]
    assert str(client_for(store).get_model_version_by_alias("tiny", CHAMPION).version) == "1"
    assert "tiny v1 is the champion (the model had none): models:/tiny@champion" in capsys.readouterr().out

    client_for(store).delete_registered_model_alias("tiny", CHAMPION)  # e.g. removed by hand: the next version
    with start_run(params, stage="train_classifier") as tracker:
        assert tracker.log_model(torch.nn.Linear(4, 2), "classifier", torch.randn(2, 4), "tiny") == "3"
    assert str(client_for(store).get_model_version_by_alias("tiny", CHAMPION).version) == "3"
