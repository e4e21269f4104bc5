"""Dataset specs: the frozen, validated description of a produced dataset.

Owns the closed vocabularies (mode, arm, write-strategy hint) and the strategy registry: every
write mode (`WRITE_MODES`: what it does, whether it matches by key, whether it writes the rows as
given, ...) and every strategy (`STRATEGIES`: the write mode and delete scope it plans in each
situation — the decision table `plan.plan_write` reads — and what follows from them: keyed,
window-scoped). Each arm registers a handler per write mode and declares them
(`Capabilities.write_modes`), checked against every spec when the code location loads; docs/concepts.md's
strategy table is checked against the registry. Adding a strategy is one `StrategyDef` here (and,
for a new write mode, its `WriteModeDef` and a handler on each arm).

Also `DatasetSpec` / `Delta`. Every check that can be made without I/O is made here, at
construction, so a bad spec fails when code loads.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Literal, get_args

from pipeline_output.contract.partitioning import PartitionTerm, parse_terms
from pipeline_output.errors import InvalidArgument, InvalidSpec

Strategy = str  # a name in `STRATEGIES` (checked when a spec is built)
WriteMode = str  # a name in `WRITE_MODES`: the primitive an arm executes
Mode = Literal["pg", "iceberg", "dual"]
Arm = Literal["pg", "iceberg"]  # a store: the legacy Postgres row store or the Iceberg table
WriteStrategyHint = Literal[
    "auto",  # per data file, by cost (stores/iceberg/write/merge.py, MergePolicy)
    "copy-on-write",  # rewrite every data file a merge changes
    "merge-on-read",  # keep changed data files; positional delete files + new rows
]
Situation = Literal["first_deploy", "re_deploy", "window", "partition"]
DeleteScope = Literal[
    "none",
    "all",
    "window",  # the target rows inside the delta window
    "absent_keys",
    "absent_keys_in_window",
    "slice",  # the target rows inside the Dagster partition's slice
    "absent_keys_in_slice",
]
# scopes that limit a write's deletes to the rows of a window or a partition slice
SCOPED = frozenset({"window", "absent_keys_in_window", "slice", "absent_keys_in_slice"})

MODES: tuple[str, ...] = get_args(Mode)
ARMS: tuple[Arm, ...] = get_args(Arm)
WRITE_STRATEGY_HINTS: tuple[str, ...] = get_args(WriteStrategyHint)
SITUATIONS: tuple[Situation, ...] = get_args(Situation)


@dataclass(frozen=True)
class WriteModeDef:
    """A write mode: the primitive an arm executes. Each arm has a handler per mode it declares
    (`Capabilities.write_modes`): the Iceberg arm's `merge.WRITE_HANDLERS`, the legacy arm's
    `staging.WRITE_HANDLERS`."""

    name: str
    effect: str  # what it does, in words (`WritePlan.describe`)
    slice_effect: str  # what it does to a Dagster partition's slice `{}`
    window_effect: str | None = None  # what it does when a delta window `{}` scopes it
    keyed: bool = False  # matches rows by key: a strategy that uses it needs a primary_key
    as_given: bool = False  # writes the computed rows as they are (files written before the lock)
    idempotent: bool = True  # writing the same rows again changes nothing (Delta lookback re-reads)
    blind_retry: bool = False  # its rows do not depend on the target: re-applied on a newer head
    # the row-level operation it is: Iceberg's `write.<op>.mode` table property picks
    # copy-on-write or merge-on-read for it (None: it never deletes rows by position)
    row_level: Literal["merge", "delete"] | None = None


WRITE_MODES: dict[WriteMode, WriteModeDef] = {
    m.name: m
    for m in (
        WriteModeDef(
            "replace",
            effect="replace every target row with the compute's rows",
            slice_effect="replace the target rows of {} with the compute's rows",
            window_effect="replace only the target rows inside {}",
            as_given=True,
            row_level="delete",
        ),
        WriteModeDef(
            "upsert",
            effect="update rows whose key matches, insert new keys, keep all other rows",
            slice_effect="update matched keys, insert new keys (all inside {})",
            keyed=True,
            row_level="merge",
        ),
        WriteModeDef(
            "append",
            effect="append every computed row",
            slice_effect="append every computed row (all inside {})",
            as_given=True,
            idempotent=False,
            blind_retry=True,
        ),
        WriteModeDef(
            "append_new",
            effect="insert only rows whose key is absent from the target; leave others",
            slice_effect="insert only rows whose key is absent from the target (all inside {})",
            keyed=True,
            as_given=True,
        ),
        WriteModeDef(
            "sync",
            effect="update matched keys, insert new keys, delete target rows whose key is absent",
            slice_effect="make {} exactly the compute's rows: update matched keys, insert new "
            "keys, delete the slice's rows whose key is absent",
            window_effect="update matched keys, insert new keys, delete target rows whose key is "
            "absent (deletion limited to rows inside {})",
            keyed=True,
            row_level="merge",
        ),
    )
}


@dataclass(frozen=True)
class Decision:
    """What a strategy writes in one situation: the write mode and the scope of its deletes."""

    write_mode: WriteMode
    delete_scope: DeleteScope
    doc: str  # its cell in docs/concepts.md's strategy table


REPLACE_ALL = Decision("replace", "all", "replace")


@dataclass(frozen=True)
class StrategyDef:
    """A strategy: its row of the decision table (a `Decision` per situation; None: that
    situation is refused with `UnsupportedWrite`) and the properties that follow from it."""

    name: str
    re_deploy: Decision
    window: Decision | None  # a delta window
    partition: Decision | None  # a Dagster partition's slice
    first_deploy: Decision = REPLACE_ALL  # the target's first write: every strategy's a replace
    note: str = ""  # after its name in docs/concepts.md's table, e.g. "(default)"

    def __post_init__(self) -> None:
        for situation, decision in self.decisions():
            if decision.write_mode not in WRITE_MODES:
                raise InvalidSpec(
                    f"strategy {self.name!r}: its {situation} write mode "
                    f"{decision.write_mode!r} is not one of WRITE_MODES"
                )

    def decisions(self) -> Iterator[tuple[Situation, Decision]]:
        """(situation, decision) for each situation the strategy writes."""
        for situation in SITUATIONS:
            decision = self.decide(situation)
            if decision is not None:
                yield situation, decision

    def decide(self, situation: Situation) -> Decision | None:
        """The decision in `situation` (None: not written)."""
        decision: Decision | None = getattr(self, situation)
        return decision

    @property
    def write_modes(self) -> frozenset[WriteMode]:
        """Every write mode it may plan: an arm must implement them all to be written to."""
        return frozenset(d.write_mode for _, d in self.decisions())

    @property
    def keyed(self) -> bool:
        """Whether it matches rows by key (one of its write modes does): it needs a primary_key."""
        return any(WRITE_MODES[m].keyed for m in self.write_modes)

    @property
    def window_scoped(self) -> bool:
        """Whether a delta window's write deletes within its window: the window it writes is the
        one it read (`Delta.lookback`'s earlier windows included), not only its own."""
        return self.window is not None and self.window.delete_scope in SCOPED

    @property
    def rereads_safely(self) -> bool:
        """Whether a window may be written again (`Delta.lookback`): its write is idempotent."""
        return self.window is None or WRITE_MODES[self.window.write_mode].idempotent


STRATEGIES: dict[Strategy, StrategyDef] = {
    s.name: s
    for s in (
        StrategyDef(
            "snapshot_replace",
            note="(default)",
            re_deploy=Decision(
                "upsert", "none", "upsert: update matched keys, insert new, **keep** unmatched"
            ),
            window=Decision("upsert", "none", "upsert the window's rows"),
            partition=Decision(
                "sync", "absent_keys_in_slice", "sync, deletion limited to the partition's slice"
            ),
        ),
        StrategyDef(
            "append_always",
            re_deploy=Decision("append", "none", "append"),
            window=Decision("append", "none", "append the window's rows"),
            partition=Decision("append", "none", "append into the slice"),
        ),
        StrategyDef(
            "append_new",
            re_deploy=Decision(
                "append_new",
                "none",
                "insert only rows whose key is absent (matched rows untouched)",
            ),
            window=Decision("append_new", "none", "same"),
            partition=Decision("append_new", "none", "same, into the slice"),
        ),
        StrategyDef(
            "replace",
            re_deploy=Decision("replace", "all", "replace"),
            window=Decision("replace", "window", "replace only the target rows inside the window"),
            partition=Decision("replace", "slice", "replace only the target rows inside the slice"),
        ),
        StrategyDef(
            "sync",
            re_deploy=Decision(
                "sync",
                "absent_keys",
                "upsert **and delete** target rows whose key is absent from the compute",
            ),
            window=Decision(
                "sync", "absent_keys_in_window", "same, deletion limited to rows inside the window"
            ),
            partition=Decision(
                "sync", "absent_keys_in_slice", "same, deletion limited to the slice"
            ),
        ),
    )
}


def strategy_table() -> str:
    """docs/concepts.md's strategy table and the sentence on keys after it, from the registry."""
    head = [
        "| strategy | first deploy | re-deploy | delta window | Dagster partition |",
        "|---|---|---|---|---|",
    ]
    rows = []
    for s in STRATEGIES.values():
        cells = [f"`{s.name}`" + (f" {s.note}" if s.note else "")]
        for situation in SITUATIONS:
            decision = s.decide(situation)
            cells.append(decision.doc if decision is not None else "refused (`UnsupportedWrite`)")
        rows.append("| " + " | ".join(cells) + " |")
    keyed = [f"`{s.name}`" for s in STRATEGIES.values() if s.keyed]
    listed = ", ".join(keyed[:-1]) + f" and {keyed[-1]}" if len(keyed) > 1 else "".join(keyed)
    return "\n".join(
        [*head, *rows, "", f"{listed} need a primary key (checked when the spec is built)."]
    )


# what other tools (dbt's incremental strategies, dlt's write dispositions) and our own write modes
# call a strategy: an unknown strategy of these names is answered with ours
OTHER_NAMES: dict[str, Strategy] = {
    "upsert": "snapshot_replace",
    "merge": "snapshot_replace",
    "delete+insert": "snapshot_replace",
    "append": "append_always",
    "insert_overwrite": "replace",
    "overwrite": "replace",
}


def _known_as(given: object) -> str:
    """The part of an unknown strategy's error that names ours for another tool's name."""
    ours = OTHER_NAMES.get(given) if isinstance(given, str) else None
    if ours is None:
        return ""
    does = STRATEGIES[ours].re_deploy.doc.replace("**", "")
    return f"for {given!r} use {ours!r} (a re-deploy: {does}); "


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

        strategy = STRATEGIES.get(self.strategy) if isinstance(self.strategy, str) else None
        if strategy is None:
            raise InvalidSpec(
                f"dataset {name!r}: unknown strategy {self.strategy!r}; "
                f"{_known_as(self.strategy)}valid strategies: {', '.join(STRATEGIES)}"
            )
        if strategy.keyed and not pk:
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
            if self.delta.lookback and not strategy.rereads_safely:
                mode = strategy.window.write_mode if strategy.window else ""
                raise InvalidSpec(
                    f"dataset {name!r}: Delta lookback re-reads earlier windows, which "
                    f"{self.strategy} would {mode} twice; use lookback=0 or an idempotent strategy"
                )

    @property
    def strategy_def(self) -> StrategyDef:
        """The strategy's registry entry (`STRATEGIES`)."""
        return STRATEGIES[self.strategy]

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
