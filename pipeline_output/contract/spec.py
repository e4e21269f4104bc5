"""Dataset specs: the frozen, validated description of a produced dataset.

Owns the closed vocabularies (strategy, mode, write mode) and `DatasetSpec` / `Delta`. Every check that
can be made without I/O is made here, at construction, so a bad spec fails when code loads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Literal, get_args

from pipeline_output.contract.partitioning import PartitionTerm, parse_terms
from pipeline_output.errors import InvalidArgument, InvalidSpec

Strategy = Literal[
    "snapshot_replace",  # first: replace; re-deploy: upsert by key, keep unmatched target rows
    "append_always",  # first: replace; re-deploy: append every row
    "append_new",  # first: replace; re-deploy: insert only rows whose key is absent
    "replace",  # always replace (the whole table, or only the window's rows)
    "sync",  # first: replace; re-deploy: upsert and delete target rows absent from the compute
]
Mode = Literal["pg", "iceberg", "dual"]
Arm = Literal["pg", "iceberg"]  # a store: the legacy Postgres row store or the Iceberg table
WriteMode = Literal["replace", "upsert", "append", "append_new", "sync"]
WriteStrategyHint = Literal[
    "auto",  # per data file, by cost (stores/iceberg/write/merge.py, MergePolicy)
    "copy-on-write",  # rewrite every data file a merge changes
    "merge-on-read",  # keep changed data files; positional delete files + new rows
]

STRATEGIES: tuple[str, ...] = get_args(Strategy)
MODES: tuple[str, ...] = get_args(Mode)
ARMS: tuple[Arm, ...] = get_args(Arm)
WRITE_MODES: tuple[str, ...] = get_args(WriteMode)
WRITE_STRATEGY_HINTS: tuple[str, ...] = get_args(WriteStrategyHint)
KEYED_STRATEGIES = frozenset({"snapshot_replace", "append_new", "sync"})

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The Iceberg SQL catalog's name columns hold 255 characters. An arm with a shorter limit declares
# it in its capabilities (the legacy arm: 63 bytes), checked when the code location loads.
MAX_IDENTIFIER_LENGTH = 255

WatermarkValue = int | datetime | date


def window_column(spec: DatasetSpec | str, watermark: str | None) -> str:
    """The column a window read of `spec` filters on: `watermark`, else the spec's own.

    A read of a window with neither is refused (`InvalidArgument`), naming the dataset."""
    column = watermark or (spec.watermark if isinstance(spec, DatasetSpec) else None)
    if column is None:
        name = spec if isinstance(spec, str) else spec.name
        raise InvalidArgument(f"reading a window of {name!r} needs its watermark column")
    return column


def check_identifier(value: object, *, what: str, dataset: str | None = None) -> str:
    """Return `value` if it is a plain identifier (letters, digits, `_`), else raise `InvalidSpec`."""
    where = f"dataset {dataset!r}: " if dataset else ""
    if not isinstance(value, str) or not _IDENTIFIER.match(value):
        raise InvalidSpec(
            f"{where}{what} {value!r} is not a valid identifier "
            "(letters, digits and underscores, not starting with a digit)"
        )
    if len(value) > MAX_IDENTIFIER_LENGTH:
        raise InvalidSpec(
            f"{where}{what} {value!r} is longer than {MAX_IDENTIFIER_LENGTH} characters"
        )
    return value


@dataclass(frozen=True)
class Delta:
    """Incremental settings: the dataset is computed window by window over `source`'s `watermark`.

    Windows are half-open `(low, high]`. `lookback` re-reads that many earlier windows for late data
    (idempotent strategies only); `max_rows` splits a large backlog into several windows; `start`
    makes the first window begin above it instead of being open at the bottom;
    `max_windows_per_run` is how many consecutive pending windows the sensor requests as one
    partition-range run (a backlog in a few runs; a lone new window still gets its own run).
    """

    source: str
    watermark: str
    lookback: int = 0
    max_rows: int | None = None
    start: WatermarkValue | None = None
    max_windows_per_run: int = 100

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source:
            raise InvalidSpec(f"Delta source must be a non-empty name, got {self.source!r}")
        check_identifier(self.watermark, what="Delta watermark column")
        if not isinstance(self.lookback, int) or self.lookback < 0:
            raise InvalidSpec(
                f"Delta lookback must be a non-negative integer, got {self.lookback!r}"
            )
        if self.max_rows is not None and (not isinstance(self.max_rows, int) or self.max_rows < 1):
            raise InvalidSpec(f"Delta max_rows must be a positive integer, got {self.max_rows!r}")
        per_run = self.max_windows_per_run
        if isinstance(per_run, bool) or not isinstance(per_run, int) or per_run < 1:
            raise InvalidSpec(
                f"Delta max_windows_per_run must be a positive integer, got {per_run!r}"
            )


@dataclass(frozen=True)
class DatasetSpec:
    """A produced dataset: its name, key, write strategy and options. Frozen and validated."""

    name: str
    primary_key: tuple[str, ...] = ()
    strategy: Strategy = "snapshot_replace"
    delta: Delta | None = None
    mode: Mode | None = None
    # None: not said (a table that exists keeps its partition spec); (): unpartitioned
    partition_by: tuple[str, ...] | None = None
    sort_by: tuple[str, ...] = ()
    dedupe_by: str | None = None
    allow_empty: bool = False
    description: str | None = None
    write_strategy_hint: WriteStrategyHint = "auto"
    # write-audit-publish: native writes go to a branch of the run, main moves after the checks
    audit: bool = False
    # column descriptions (documentation only: they never change what is written)
    columns: tuple[tuple[str, str], ...] = field(default=(), compare=False, hash=False)
    extra: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        name = check_identifier(self.name, what="dataset name")
        pk = self.primary_key
        if isinstance(pk, str):
            pk = (pk,)
        if not isinstance(pk, (tuple, list)):
            raise InvalidSpec(
                f"dataset {name!r}: primary_key must be a column name or a tuple of names"
            )
        pk = tuple(pk)
        for col in pk:
            check_identifier(col, what="primary-key column", dataset=name)
        if len(set(pk)) != len(pk):
            raise InvalidSpec(f"dataset {name!r}: primary_key repeats a column: {pk!r}")
        object.__setattr__(self, "primary_key", pk)

        for attr in ("partition_by", "sort_by"):
            cols = getattr(self, attr)
            if cols is None and attr == "partition_by":
                continue  # not said: the table's own layout is kept
            cols = (cols,) if isinstance(cols, str) else tuple(cols)
            named = (
                [t.column for t in parse_terms(cols, dataset=name)]
                if attr == "partition_by"
                else cols
            )
            for col in named:
                check_identifier(col, what=f"{attr} column", dataset=name)
            object.__setattr__(self, attr, cols)

        if self.strategy not in STRATEGIES:
            raise InvalidSpec(
                f"dataset {name!r}: unknown strategy {self.strategy!r}; "
                f"valid strategies: {', '.join(STRATEGIES)}"
            )
        if self.strategy in KEYED_STRATEGIES and not pk:
            raise InvalidSpec(
                f"dataset {name!r}: strategy {self.strategy!r} needs a primary_key "
                "(it matches rows by key)"
            )
        if self.write_strategy_hint not in WRITE_STRATEGY_HINTS:
            raise InvalidSpec(
                f"dataset {name!r}: unknown write_strategy_hint {self.write_strategy_hint!r}; "
                f"valid hints: {', '.join(WRITE_STRATEGY_HINTS)}"
            )
        if self.mode is not None and self.mode not in MODES:
            raise InvalidSpec(
                f"dataset {name!r}: unknown mode {self.mode!r}; valid modes: {', '.join(MODES)}"
            )
        columns = self.columns
        if isinstance(columns, Mapping):
            columns = tuple(columns.items())
        for col, text in columns:
            check_identifier(col, what="described column", dataset=name)
            if not isinstance(text, str):
                raise InvalidSpec(f"dataset {name!r}: the description of {col!r} must be text")
        object.__setattr__(self, "columns", tuple((str(c), t) for c, t in columns))
        if not isinstance(self.audit, bool):
            raise InvalidSpec(f"dataset {name!r}: audit must be True or False, got {self.audit!r}")
        if self.dedupe_by is not None:
            check_identifier(self.dedupe_by, what="dedupe_by column", dataset=name)
            if not pk:
                raise InvalidSpec(f"dataset {name!r}: dedupe_by needs a primary_key")
            if self.dedupe_by in pk:
                raise InvalidSpec(f"dataset {name!r}: dedupe_by must not be a primary-key column")
        if self.delta is not None:
            if not isinstance(self.delta, Delta):
                raise InvalidSpec(f"dataset {name!r}: delta must be a Delta(...)")
            if self.delta.lookback and self.strategy == "append_always":
                raise InvalidSpec(
                    f"dataset {name!r}: Delta lookback re-reads earlier windows, which "
                    "append_always would append twice; use lookback=0 or an idempotent strategy"
                )

    @property
    def key_columns(self) -> tuple[str, ...]:
        """The primary key (may be empty)."""
        return self.primary_key

    @property
    def partition_terms(self) -> tuple[PartitionTerm, ...]:
        """`partition_by` parsed: identity columns and Iceberg transforms (`partitioning.py`);
        none when it is not said (`partition_by=None`) or says unpartitioned (`()`)."""
        return parse_terms(self.partition_by or (), dataset=self.name)

    @property
    def sort_columns(self) -> tuple[str, ...]:
        """Columns the data is sorted by on write (explicit sort_by, else the primary key)."""
        return self.sort_by or self.primary_key

    @property
    def watermark(self) -> str | None:
        """The delta watermark column, when the dataset is incremental."""
        return self.delta.watermark if self.delta else None


def spec_to_dict(spec: DatasetSpec) -> dict[str, object]:
    """A JSON-safe dict of the spec (Dagster metadata carries it to the IO manager)."""
    delta = None
    if spec.delta is not None:
        start = spec.delta.start
        delta = {
            "source": spec.delta.source,
            "watermark": spec.delta.watermark,
            "lookback": spec.delta.lookback,
            "max_rows": spec.delta.max_rows,
            "start": start.isoformat() if isinstance(start, (date, datetime)) else start,
            "start_type": type(start).__name__ if start is not None else None,
            "max_windows_per_run": spec.delta.max_windows_per_run,
        }
    return {
        "name": spec.name,
        "primary_key": list(spec.primary_key),
        "strategy": spec.strategy,
        "delta": delta,
        "mode": spec.mode,
        "partition_by": None if spec.partition_by is None else list(spec.partition_by),
        "sort_by": list(spec.sort_by),
        "dedupe_by": spec.dedupe_by,
        "allow_empty": spec.allow_empty,
        "description": spec.description,
        "write_strategy_hint": spec.write_strategy_hint,
        "audit": spec.audit,
        "columns": dict(spec.columns),
    }


def spec_from_dict(data: dict[str, object]) -> DatasetSpec:
    """Inverse of `spec_to_dict`."""
    raw_delta = data.get("delta")
    delta = None
    if isinstance(raw_delta, dict):
        start: object = raw_delta.get("start")
        kind = raw_delta.get("start_type")
        if isinstance(start, str) and kind == "datetime":
            start = datetime.fromisoformat(start)
        elif isinstance(start, str) and kind == "date":
            start = date.fromisoformat(start)
        delta = Delta(
            source=str(raw_delta["source"]),
            watermark=str(raw_delta["watermark"]),
            lookback=int(raw_delta.get("lookback") or 0),
            max_rows=raw_delta.get("max_rows"),
            start=start,  # type: ignore[arg-type]
            max_windows_per_run=int(raw_delta.get("max_windows_per_run") or 100),
        )
    return DatasetSpec(
        name=str(data["name"]),
        primary_key=tuple(data.get("primary_key") or ()),  # type: ignore[arg-type]
        strategy=data.get("strategy", "snapshot_replace"),  # type: ignore[arg-type]
        delta=delta,
        mode=data.get("mode"),  # type: ignore[arg-type]
        partition_by=_partition_by(data.get("partition_by")),
        sort_by=tuple(data.get("sort_by") or ()),  # type: ignore[arg-type]
        dedupe_by=data.get("dedupe_by"),  # type: ignore[arg-type]
        allow_empty=bool(data.get("allow_empty", False)),
        description=data.get("description"),  # type: ignore[arg-type]
        write_strategy_hint=data.get("write_strategy_hint", "auto"),  # type: ignore[arg-type]
        audit=bool(data.get("audit", False)),
        columns=tuple(dict(data.get("columns") or {}).items()),  # type: ignore[call-overload]
    )


def _partition_by(raw: object) -> tuple[str, ...] | None:
    """`partition_by` as `spec_to_dict` stored it: None (not said) stays None."""
    if raw is None:
        return None
    return tuple(raw)  # type: ignore[arg-type]
