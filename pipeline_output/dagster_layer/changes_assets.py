"""Incremental downstreams in Dagster: a `@dataset` parameter annotated `Changes` receives the
changes of that upstream dataset since the snapshot this dataset last consumed
(`services/incremental.py`).

The input's IO-manager load reads nothing: it hands over the upstream's `DatasetSpec` and the
columns the input's `columns` metadata asks for (`ChangesSource`; Dagster's convention for an
input's projection, as `dg.AssetIn(metadata={"columns": [...]})`). The
asset's output is a `ChangesOutput` (that upstream and the compute, still to call); the IO
manager resolves the upstream's mode and runs `consume_changes` — position, changes, compute,
write, ledger record, under the downstream's lock — and reports the consumed range and the change
counts as the materialisation's metadata. The definition carries the upstream's name (`CHANGES_OF_KEY`), so
the location refuses, when it loads, an upstream written only to the legacy arm.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.errors import InvalidSpec
from pipeline_output.services.incremental import CHANGE_TYPES, Changes, ConsumeOutcome

CHANGES_OF_KEY = "pipeline_output/changes_of"  # definition metadata: the upstream's dataset name
CHANGES_INPUT_KEY = "pipeline_output/changes_input"  # input metadata: this input is a `Changes`
COLUMNS_KEY = "columns"  # input metadata (Dagster's convention): the upstream columns to read


@dataclass(frozen=True)
class ChangesSource:
    """A `Changes` input as its IO-manager load hands it over: the upstream dataset, and the
    columns of its change rows the input asks for (None: all)."""

    upstream: DatasetSpec
    columns: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ChangesOutput:
    """An incremental downstream's output: the compute of its rows from the changes of
    `upstream` (`columns` of them; None: all), called by the IO manager once the changes are
    read (`consume_changes`)."""

    upstream: DatasetSpec
    compute: Callable[[Changes], Any]
    columns: tuple[str, ...] | None = None


def changes_metadata(outcome: ConsumeOutcome) -> dict[str, Any]:
    """The materialisation metadata of one run: the consumed range, the change counts by type,
    and whether (and why) it was a full refresh."""
    c = outcome.changes
    meta: dict[str, Any] = {
        "pipeline_output/changes_upstream": c.upstream,
        "pipeline_output/changes_from_snapshot": str(c.from_snapshot)
        if c.from_snapshot is not None
        else "none (the empty table)",
        "pipeline_output/changes_to_snapshot": str(c.to_snapshot),
        "pipeline_output/changes_full_refresh": c.full_refresh,
        "pipeline_output/changes_action": outcome.action,
    }
    for kind in CHANGE_TYPES:
        meta[f"pipeline_output/changes_{kind}"] = int(c.counts.get(kind, 0))
    if c.full_refresh:
        meta["pipeline_output/changes_reason"] = c.reason
    if outcome.repaired:
        meta["pipeline_output/changes_repaired"] = True
    return meta


def check_changes_upstreams(
    specs: Mapping[str, DatasetSpec], changes_of: Mapping[str, str], *, default_mode: str
) -> None:
    """Refuse, when the location loads, a downstream whose `Changes` upstream is written only to
    the legacy Postgres arm (`changes_of`: downstream name -> upstream name)."""
    for down, up in changes_of.items():
        spec = specs.get(up)
        if spec is None:
            continue  # not a dataset of this location: refused at run time
        mode = spec.mode or default_mode
        if mode == "pg":
            # the declared mode, not a persisted flip: a flip can be reverted after the location
            # loaded, and a pg-only upstream would then leave the downstream nothing to read
            source = "declared mode='pg'" if spec.mode else "the project's default mode 'pg'"
            raise InvalidSpec(
                f"dataset {down!r} reads the changes of {up!r}, which writes only the legacy "
                f"Postgres arm ({source}; a flip does not count: it can be reverted), and that "
                f"arm keeps no snapshots: declare {up!r} mode='iceberg' or mode='dual'"
            )


def changes_param(kinds: Mapping[str, str], *, dataset: str) -> str | None:
    """The compute's parameter annotated `Changes` (at most one), else None."""
    found = [name for name, kind in kinds.items() if kind == "changes"]
    if len(found) > 1:
        raise InvalidSpec(
            f"@dataset {dataset!r}: parameters {found} are annotated Changes; a dataset consumes "
            "the changes of one upstream"
        )
    return found[0] if found else None


def mark_changes_input(ins: dict[str, dg.AssetIn], param: str, *, dataset: str) -> str:
    """Mark `param`'s input as a `Changes` input; the upstream's dataset name. Its `columns`
    metadata, when given, must name columns (checked against the upstream's schema when a run
    reads the changes)."""
    asset_in = ins[param]
    metadata = dict(asset_in.metadata or {})
    if COLUMNS_KEY in metadata:
        changes_columns(metadata[COLUMNS_KEY], dataset=dataset, param=param)
    ins[param] = asset_in._replace(metadata={**metadata, CHANGES_INPUT_KEY: True})
    assert asset_in.key is not None
    return asset_in.key.path[-1]


def changes_columns(value: Any, *, dataset: str, param: str) -> tuple[str, ...] | None:
    """The columns a `Changes` input's `columns` metadata asks for (None: not given)."""
    if value is None:
        return None
    if (
        isinstance(value, str)
        or not isinstance(value, list | tuple)
        or not value
        or not all(isinstance(c, str) and c for c in value)
    ):
        raise InvalidSpec(
            f"@dataset {dataset!r}: the Changes input {param!r} has metadata columns={value!r}; "
            "give a non-empty list of the upstream's column names"
        )
    return tuple(value)
