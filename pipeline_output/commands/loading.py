"""Loading the project's definitions for commands (the code location `workspace.yaml` names)."""

from __future__ import annotations

import importlib
from typing import Any

from pipeline_output.spec import DatasetSpec

DEFINITIONS = "pipeline_output.definitions:defs"


def load_definitions() -> Any:
    """The project's `dagster.Definitions`."""
    module_name, _, attr = DEFINITIONS.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def dataset_specs() -> dict[str, DatasetSpec]:
    """Every dataset (and model node) of the project, by name."""
    from pipeline_output.defs.dataset import spec_of

    out = {}
    for asset in load_definitions().assets or []:
        spec = spec_of(asset) if hasattr(asset, "metadata_by_key") else None
        if spec is not None:
            out[spec.name] = spec
    return out
