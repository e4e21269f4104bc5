"""A model node's definition (`services.model.ModelSpec`) is checked when it is built, before any
I/O, and names the node in every error."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.errors import InvalidSpec
from pipeline_output.services.model import ROW_INDEX, ModelSpec

SOURCE = DatasetSpec(name="people", primary_key="id", strategy="replace")


def predict(frame: Any) -> list[float]:
    return [0.0] * frame.height


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"predict": "not a function"}, r"model node 'scores': predict must be callable"),
        ({"batch_rows": 0}, r"model node 'scores': batch_rows must be at least 1, got 0"),
    ],
)
def test_a_model_spec_with_a_bad_option_fails_naming_the_node(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidSpec, match=message):
        ModelSpec(**{"name": "scores", "source": SOURCE, "predict": predict, **options})


def test_a_model_spec_with_a_bad_name_fails_before_anything_is_read() -> None:
    with pytest.raises(InvalidSpec, match="model node name"):
        ModelSpec(name="Scores!", source=SOURCE, predict=predict)


def test_a_model_spec_writes_a_replace_keyed_by_the_row_index_and_freezes_its_features() -> None:
    features = ["a", "b"]
    model = ModelSpec(name="scores", source=SOURCE, predict=predict, features=features, mode="dual")
    features.append("c")
    assert model.features == ("a", "b")
    assert model.output.strategy == "replace"
    assert model.output.primary_key == (ROW_INDEX,)
    assert model.output.mode == "dual"
