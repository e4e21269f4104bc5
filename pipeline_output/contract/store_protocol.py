"""What every arm is: the `Store` protocol both arms implement, and the capabilities each declares.

The publish pipeline (`publish.py`) talks to an arm only through `Store`: the freshness oracle
(`target_state`), the dry run (`plan`), the input check done once before any lock (`prepare`), the
write itself (`write`, which takes the attempt's `summary` properties and the prepared input, and
returns a `WriteResult` carrying the plan it executed), `read`, and `find_marker` (which commit, if
any, carries a window attempt's marker: the exactly-once repair after a crash).

`Capabilities` are declared up front, the way dlt destinations declare theirs: what column types an
arm stores, which of them can be a primary-key column, its identifier length, its column limit,
and the write modes it has a handler for (`write_modes`). They are checked before any I/O: against
a spec when the code location loads (`check_specs`, called by `build_definitions`: names, and every
write mode the spec's strategy may plan), against the computed frame for every arm a write is
about to touch (`check_frame`, called by the publish pipeline), so a `dual` write of a column the
legacy arm cannot store fails before the Iceberg arm writes a file, and against the plan a write
executes (`check_plan`: a write mode the arm has no handler for is one `UnsupportedWrite`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, Unpack

import polars as pl
from polars.datatypes import FloatType, IntegerType

from pipeline_output.contract.slices import PartitionSlice
from pipeline_output.contract.spec import ARMS, STRATEGIES, Arm, DatasetSpec, WriteMode
from pipeline_output.contract.windows import Window
from pipeline_output.errors import BadInput, InvalidSpec, UnsupportedWrite

if TYPE_CHECKING:
    from pipeline_output.contract.plan import TargetState, WritePlan, WriteResult

ATTEMPT_MARKER = "window-attempt"  # the summary key a window attempt's marker is written under

_NESTED = (pl.List, pl.Array, pl.Struct)

# The types a primary-key column may have, on both arms alike (one rule, so a dataset the legacy
# arm accepts can be flipped to Iceberg): Iceberg identifier fields must be primitive and not
# float/double, and a float is no exact key anyway (NaN, -0.0 and rounding make equal-looking
# keys differ). A typeless `Null` column (an empty compute) takes the table's type, or string.
KEY_TYPES: tuple[type[pl.DataType], ...] = (
    IntegerType,
    pl.Decimal,
    pl.Boolean,
    pl.String,
    pl.Binary,
    pl.Date,
    pl.Datetime,
    pl.Time,
    pl.Null,
)
_KEY_TYPE_NAMES = "integers, decimals, booleans, strings, binary, dates, times, timestamps"


@dataclass(frozen=True)
class Capabilities:
    """What an arm can store; `None` means no limit of that kind."""

    arm: Arm
    label: str  # how messages name the arm
    nested_types: bool
    max_identifier_length: int | None
    max_columns: int | None
    scalar_types: tuple[type[pl.DataType], ...] | None  # None: every scalar type polars has
    key_types: tuple[type[pl.DataType], ...]  # the types a primary-key column may have
    advice: str  # what to do when a dataset needs more than this arm offers
    write_modes: frozenset[WriteMode]  # the write modes it has a handler for (`spec.WRITE_MODES`)

    def check_write_modes(self, spec: DatasetSpec) -> None:
        """Refuse a spec whose strategy may plan a write mode this arm has no handler for."""
        strategy = STRATEGIES.get(spec.strategy)
        for situation, decision in strategy.decisions() if strategy is not None else ():
            if decision.write_mode not in self.write_modes:
                advice = f"; {self.advice}" if self.advice else ""
                raise InvalidSpec(
                    f"dataset {spec.name!r}: strategy {spec.strategy!r} plans the write mode "
                    f"{decision.write_mode!r} ({situation}), which the {self.label} has no "
                    f"handler for{advice}"
                )

    def check_plan(self, spec: DatasetSpec, plan: WritePlan) -> None:
        """Refuse a plan whose write mode this arm has no handler for (before any I/O)."""
        if plan.write_mode not in self.write_modes:
            raise UnsupportedWrite(
                f"dataset {spec.name!r}: the {self.label} has no handler for the write mode "
                f"{plan.write_mode!r} (strategy {plan.strategy!r}, {plan.reason}); nothing was "
                "written"
            )

    def check_spec(self, spec: DatasetSpec) -> None:
        """Refuse a spec this arm cannot hold (names too long for it), naming the dataset."""
        limit = self.max_identifier_length
        if limit is None:
            return
        names = [
            ("dataset name", spec.name),
            *(("primary-key column", c) for c in spec.primary_key),
            *(("partition column", t.column) for t in spec.partition_terms),
            *(("sort column", c) for c in spec.sort_by),
        ]
        if spec.watermark:
            names.append(("watermark column", spec.watermark))
        for what, name in names:
            if len(name.encode()) > limit:
                raise InvalidSpec(
                    f"dataset {spec.name!r}: {what} {name!r} is longer than the {self.label}'s "
                    f"{limit}-byte identifier limit; {self.advice}"
                )

    def check_frame(self, spec: DatasetSpec, frame: pl.DataFrame) -> None:
        """Refuse a frame this arm cannot store, naming the dataset, the column and the cause."""
        self.check_key_types(spec, frame)
        if self.max_columns is not None and frame.width > self.max_columns:
            raise BadInput(
                f"dataset {spec.name!r}: {frame.width} columns, more than the {self.label}'s "
                f"limit of {self.max_columns}; {self.advice} (nothing was written)"
            )
        for name, dtype in frame.schema.items():
            if self.max_identifier_length is not None and (
                len(name.encode()) > self.max_identifier_length
            ):
                raise BadInput(
                    f"dataset {spec.name!r}: column {name!r} is longer than the {self.label}'s "
                    f"{self.max_identifier_length}-byte identifier limit; {self.advice} "
                    "(nothing was written)"
                )
            if isinstance(dtype, _NESTED):
                if not self.nested_types:
                    raise BadInput(
                        f"dataset {spec.name!r}: column {name!r} has the nested type {dtype}, "
                        f"which the {self.label} does not store; {self.advice} "
                        "(nothing was written)"
                    )
                continue
            if self.scalar_types is not None and not isinstance(dtype, self.scalar_types):
                stored = ", ".join(t.__name__ for t in self.scalar_types)
                raise BadInput(
                    f"dataset {spec.name!r}: column {name!r} has type {dtype}, which the "
                    f"{self.label} does not store (it stores {stored}); {self.advice} "
                    "(nothing was written)"
                )

    def check_key_types(self, spec: DatasetSpec, frame: pl.DataFrame) -> None:
        """Refuse a primary-key column whose type is not one of `key_types` (floats, nested)."""
        for name in spec.primary_key:
            dtype = frame.schema.get(name)
            if dtype is None or isinstance(dtype, self.key_types):
                continue
            if isinstance(dtype, FloatType):
                why = (
                    "a float is not an exact key (NaN, -0.0 and rounding make equal-looking keys "
                    "differ) and Iceberg identifier fields cannot be float or double"
                )
            elif isinstance(dtype, _NESTED):
                why = (
                    "a nested value cannot be a key (Iceberg identifier fields must be primitive, "
                    "and the legacy arm stores no nested types)"
                )
            else:
                why = "that type cannot be a key"
            raise BadInput(
                f"dataset {spec.name!r}: primary-key column {name!r} has type {dtype}, which "
                f"neither arm accepts as a key: {why}; a key column must be one of "
                f"{_KEY_TYPE_NAMES} (cast it, e.g. a float to a decimal or an integer, or hash a "
                "nested value into a string) (nothing was written)"
            )


def arms_a_spec_may_write(spec: DatasetSpec) -> tuple[Arm, ...]:
    """The arms a dataset can be written to over its life: only Iceberg when declared
    `mode="iceberg"`, else both (it starts on the legacy arm and is flipped to Iceberg)."""
    return ("iceberg",) if spec.mode == "iceberg" else ARMS


def check_specs(specs: Sequence[DatasetSpec], capabilities: dict[Arm, Capabilities]) -> None:
    """The load-time check: every spec against every arm it may be written to (its names, and
    the write modes its strategy may plan)."""
    for spec in specs:
        for arm in arms_a_spec_may_write(spec):
            capabilities[arm].check_spec(spec)
            capabilities[arm].check_write_modes(spec)


class WriteScope(TypedDict, total=False):
    """Which rows a write is about: a delta window or a Dagster partition (neither: the dataset)."""

    window: Window | None  # the delta window the rows belong to (None: the whole dataset)
    partition: PartitionSlice | None  # the Dagster partition the rows belong to (None: none)


class WriteOptions(WriteScope, total=False):
    """The per-write options every arm's `write` takes (and the publish pipeline passes on)."""

    run_id: str | None  # the Dagster run, recorded with the write
    summary: dict[str, str] | None  # `pipeline-output.*` properties, e.g. the attempt marker


def options_of(options: WriteOptions) -> tuple[Window | None, str | None, dict[str, str] | None]:
    """`window`, `run_id` and `summary` of `options` (None where absent)."""
    return options.get("window"), options.get("run_id"), options.get("summary")


class WindowRead(TypedDict, total=False):
    """Which rows a read is about: those inside `window` (neither given: every row)."""

    window: Window | None  # only the rows inside this window (of `watermark`)
    watermark: str | None  # the window's column (default: the spec's own watermark)


class ReadOptions(WindowRead, total=False):
    """The options every arm's `read` takes."""

    columns: Sequence[str] | None  # only these columns


class Store(Protocol):
    """One arm. Both `IcebergStore` and `PostgresStore` implement it (see the module docstring)."""

    arm: Arm
    capabilities: Capabilities

    def target_state(self, spec: DatasetSpec | str) -> TargetState: ...

    def plan(self, spec: DatasetSpec, **scope: Unpack[WriteScope]) -> WritePlan: ...

    def prepare(self, spec: DatasetSpec, data: Any, **scope: Unpack[WriteScope]) -> Any: ...

    def write(
        self, spec: DatasetSpec, data: Any, *, prepared: Any = None, **options: Unpack[WriteOptions]
    ) -> WriteResult: ...

    def read(self, spec: DatasetSpec | str, **options: Unpack[ReadOptions]) -> pl.DataFrame: ...

    def find_marker(self, spec: DatasetSpec | str, marker: str) -> int | None: ...
