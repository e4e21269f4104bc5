"""The model node: score a source dataset window by window, write every prediction as one replace.

Owns the deterministic read of the source — the ledger's applied windows in order for a delta
source (each window read from the source table with `low < watermark <= high`), else fixed-size
batches in primary-key order (only the key columns are read to cut the batches, then each batch by a
key-range filter) — the `predict` contract (`_attach`: a polars DataFrame or Series; a prediction
carrying the source's key columns or `__source_row_index__` is joined to the input rows on them,
one to one; one carrying neither has one row per input row, in input order; anything else fails
naming the model node, nothing written), and the output shape: every row carries
`__source_row_index__` (its 0-based position in that read order) and the source's primary-key
columns. The Iceberg arm streams predictions to data files batch by batch and commits
them once: exactly one replace snapshot, whose summary records the source snapshot and the windows
read. Pure core: no Dagster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from pipeline_output.contract.plan import WriteResult
from pipeline_output.contract.spec import DatasetSpec, Mode, check_identifier
from pipeline_output.contract.windows import WindowLog
from pipeline_output.errors import BadInput, InvalidSpec
from pipeline_output.services.publish import Publisher, ResolvedMode
from pipeline_output.services.reads import scan_table, within

ROW_INDEX = "__source_row_index__"
DEFAULT_BATCH_ROWS = 100_000

Predict = Callable[[pl.DataFrame], Any]


@dataclass
class ModelRun:
    """What a scoring run did."""

    name: str
    batches: list[str] = field(default_factory=list)
    rows_scored: int = 0
    source_snapshot_id: int | None = None
    results: dict[str, WriteResult] = field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def throughput_rows_s(self) -> float:
        return self.rows_scored / self.duration_s if self.duration_s else 0.0


def output_spec(name: str, *, mode: Any = None) -> DatasetSpec:
    """The model node's output: replaced as a whole, keyed by `__source_row_index__`."""
    return DatasetSpec(name=name, primary_key=(ROW_INDEX,), strategy="replace", mode=mode)


@dataclass(frozen=True)
class ModelSpec:
    """A model node's definition, checked when built: its `name` (the output dataset's), the
    `source` dataset it scores, `predict`, the `features` it sees (None: every source column), the
    source rows read per batch and the output's `mode`."""

    name: str
    source: DatasetSpec
    predict: Predict
    features: tuple[str, ...] | None = None
    batch_rows: int = DEFAULT_BATCH_ROWS
    mode: Mode | None = None

    def __post_init__(self) -> None:
        check_identifier(self.name, what="model node name")
        if not callable(self.predict):
            raise InvalidSpec(f"model node {self.name!r}: predict must be callable")
        if self.batch_rows < 1:
            raise InvalidSpec(
                f"model node {self.name!r}: batch_rows must be at least 1, got {self.batch_rows}"
            )
        if self.features is not None:
            object.__setattr__(self, "features", tuple(self.features))

    @property
    def output(self) -> DatasetSpec:
        """The dataset the node writes (`output_spec`)."""
        return output_spec(self.name, mode=self.mode)


def source_batches(
    *,
    publisher: Publisher,
    ledger: WindowLog,
    source: DatasetSpec,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> tuple[int | None, Iterator[tuple[str, pl.DataFrame]]]:
    """(source snapshot id, iterator of (label, rows)) in the node's deterministic read order."""
    table = publisher.iceberg.load(source)
    if table is None or table.current_snapshot() is None:
        raise BadInput(
            f"model source {source.name!r} has no Iceberg table yet; materialise it first"
        )
    snapshot = table.current_snapshot()
    assert snapshot is not None
    snapshot_id = snapshot.snapshot_id
    pk = list(source.primary_key)
    # the source pinned to this snapshot, read by polars' native Iceberg scan: each read below
    # pushes its columns and its range to the files' and row groups' statistics
    rows = scan_table(table, name=publisher.iceberg.table_name(source), snapshot_id=snapshot_id)

    def by_windows() -> Iterator[tuple[str, pl.DataFrame]]:
        assert source.delta is not None
        watermark = source.delta.watermark
        for row in ledger.applied_windows(source.name):
            frame = within(rows, row.window, watermark).collect()
            order = pk or [watermark]
            yield f"window {row.window}", frame.sort(order, maintain_order=True)

    def by_key_batches() -> Iterator[tuple[str, pl.DataFrame]]:
        if not pk:
            frame = rows.collect()
            for i, offset in enumerate(range(0, max(frame.height, 1), batch_rows)):
                yield f"batch {i}", frame.slice(offset, batch_rows)
            return
        first = pk[0]
        ordered = rows.select(first).collect().get_column(first).sort()
        n = ordered.len()
        start = 0
        index = 0
        while start < n:
            lo = ordered[start]
            end = min(start + batch_rows, n) - 1
            hi = ordered[end]
            # keep every row of the last key value in this batch
            end = int(ordered.search_sorted(hi, side="right")) - 1
            key = pl.col(first)
            frame = rows.filter((key >= pl.lit(lo)) & (key <= pl.lit(hi))).collect()
            yield f"batch {index}", frame.sort(pk, maintain_order=True)
            index += 1
            start = end + 1

    if source.delta is not None and ledger.applied_windows(source.name):
        return snapshot_id, by_windows()
    return snapshot_id, by_key_batches()


def predictions(
    model: ModelSpec, batches: Iterator[tuple[str, pl.DataFrame]], *, run: ModelRun
) -> Iterator[pl.DataFrame]:
    """Apply the model's `predict` batch by batch; each output carries the row index and the
    source key.

    `predict` sees the `features` columns (`__source_row_index__` among them when named there),
    else every source column; its rows are matched to the input rows by `_attach`."""
    name, predict, features = model.name, model.predict, model.features
    source_pk = model.source.primary_key
    offset = 0
    for label, frame in batches:
        run.batches.append(label)
        if frame.height == 0:
            continue
        index = pl.int_range(offset, offset + frame.height, dtype=pl.Int64, eager=True).alias(
            ROW_INDEX
        )
        keys = pl.concat([index.to_frame(), frame.select(list(source_pk))], how="horizontal")
        inputs = frame
        if features is not None:
            indexed = frame.with_columns(index) if ROW_INDEX in features else frame
            missing = [f for f in features if f not in indexed.columns]
            if missing:
                raise BadInput(
                    f"model node {name!r}: feature column(s) {missing} not in the source"
                )
            inputs = indexed.select(list(features))
        try:
            out = predict(inputs)
        except BadInput:
            raise
        except Exception as exc:
            raise BadInput(
                f"model node {name!r}: predict failed on {label}: {type(exc).__name__}: {exc}; "
                "nothing was written"
            ) from exc
        if isinstance(out, pl.Series):
            out = out.to_frame(out.name or "prediction")
        if not isinstance(out, pl.DataFrame):
            raise BadInput(
                f"model node {name!r}: predict returned {type(out).__name__} on {label}; expected a "
                "polars DataFrame or Series with one row per input row (nothing was written)"
            )
        yield _attach(name=name, label=label, keys=keys, out=out, source_pk=source_pk)
        offset += frame.height
        run.rows_scored += frame.height


def _attach(
    *, name: str, label: str, keys: pl.DataFrame, out: pl.DataFrame, source_pk: Sequence[str]
) -> pl.DataFrame:
    """The prediction rows `out` matched to the input rows `keys` (`__source_row_index__` and the
    source's key columns, in input order). Joined on the key columns `out` carries
    (`__source_row_index__`, or the source's whole key), which must match the input one to one;
    by position when it carries neither (then one row per input row). Anything else: `BadInput`."""
    where = f"model node {name!r}: predict's output on {label}"
    carried = [c for c in keys.columns if c in out.columns]
    keyed = ROW_INDEX in carried or (bool(source_pk) and all(c in carried for c in source_pk))
    if not keyed:
        if carried:
            raise BadInput(
                f"{where} carries key column(s) {carried} but neither the whole key "
                f"{list(source_pk)} nor {ROW_INDEX}: its rows cannot be matched to the input "
                "(nothing was written)"
            )
        if out.height != keys.height:
            raise BadInput(
                f"{where} has {out.height} rows for {keys.height} input rows; without the key "
                f"columns {list(source_pk)} or {ROW_INDEX} it must return one row per input row, "
                "in input order (nothing was written)"
            )
        return pl.concat([keys, out], how="horizontal")
    rule = (
        f"rows carrying {carried} are joined to the input on them, one to one (nothing was written)"
    )
    try:
        out = out.with_columns([pl.col(c).cast(keys.schema[c], strict=True) for c in carried])
    except pl.exceptions.PolarsError as exc:
        raise BadInput(
            f"{where}: key column(s) {carried} do not cast to the input's types "
            f"({' '.join(str(exc).split())[:200]}); {rule}"
        ) from exc
    returned = out.select(carried)
    nulls = returned.filter(pl.any_horizontal(pl.all().is_null())).height
    if nulls:
        raise BadInput(f"{where} has {nulls} row(s) with a null key; {rule}")
    duplicated = returned.filter(returned.is_duplicated())
    if duplicated.height:
        raise BadInput(
            f"{where} returns the key {duplicated.row(0, named=True)} more than once "
            f"({duplicated.height} rows share a key); {rule}"
        )
    wanted = keys.select(carried)
    if wanted.is_duplicated().any():
        raise BadInput(
            f"{where}: the source's key {carried} is not unique in this batch; return "
            f"{ROW_INDEX} (name it in `features`) to match predictions (nothing was written)"
        )
    extra = returned.join(wanted, on=carried, how="anti")
    if extra.height:
        raise BadInput(
            f"{where} has {extra.height} row(s) whose key is no input row's, e.g. "
            f"{extra.row(0, named=True)}; {rule}"
        )
    missing = wanted.join(returned, on=carried, how="anti")
    if missing.height:
        raise BadInput(
            f"{where} has no row for {missing.height} input row(s), e.g. "
            f"{missing.row(0, named=True)}; {rule}"
        )
    return keys.join(out, on=carried, how="left", maintain_order="left")


def score(
    model: ModelSpec,
    *,
    publisher: Publisher,
    ledger: WindowLog,
    mode: ResolvedMode,
    run_id: str | None = None,
) -> ModelRun:
    """Score the model's source and replace its output in one snapshot per arm."""
    started = time.perf_counter()
    run = ModelRun(name=model.name)
    source = model.source
    snapshot_id, batches = source_batches(
        publisher=publisher, ledger=ledger, source=source, batch_rows=model.batch_rows
    )
    run.source_snapshot_id = snapshot_id
    out = publisher.publish_stream(
        model.output,
        predictions(model, batches, run=run),
        mode=mode,
        run_id=run_id,
        summary={"model-source": source.name, "model-source-snapshot": str(snapshot_id)},
        finalize_summary=lambda: {
            "model-batches": str(len(run.batches)),
            "model-windows": ";".join(run.batches)[:4000],
            "model-rows": str(run.rows_scored),
        },
    )
    run.results.update(out.results)
    run.duration_s = time.perf_counter() - started
    return run
