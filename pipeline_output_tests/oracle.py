"""An independent oracle for the Iceberg arm: the decision table applied with plain polars.

Nothing here imports `pipeline_output`: the expected table contents and counters are computed from the
inputs alone, so a bug in the store cannot hide in a shared helper. Frames are compared as typed
multisets (order-independent).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl
from polars.testing import assert_frame_equal

# The decision table, written out again on purpose (an independent oracle), not imported from plan.py.
DECISIONS: dict[tuple[str, str], str] = {
    ("snapshot_replace", "first_deploy"): "replace",
    ("snapshot_replace", "re_deploy"): "upsert",
    ("snapshot_replace", "window"): "upsert",
    ("append_always", "first_deploy"): "replace",
    ("append_always", "re_deploy"): "append",
    ("append_always", "window"): "append",
    ("append_new", "first_deploy"): "replace",
    ("append_new", "re_deploy"): "append_new",
    ("append_new", "window"): "append_new",
    ("replace", "first_deploy"): "replace",
    ("replace", "re_deploy"): "replace",
    ("replace", "window"): "replace",
    ("sync", "first_deploy"): "replace",
    ("sync", "re_deploy"): "sync",
    ("sync", "window"): "sync",
    # a Dagster partition's slice: made exactly the compute's rows (by key, or dropped), or
    # appended to
    ("snapshot_replace", "partition"): "sync",
    ("append_always", "partition"): "append",
    ("append_new", "partition"): "append_new",
    ("replace", "partition"): "replace",
    ("sync", "partition"): "sync",
}

# Every strategy, in the order the tests parametrize over it.
STRATEGIES = ("snapshot_replace", "append_always", "append_new", "replace", "sync")
IDEMPOTENT = ("replace", "snapshot_replace", "append_new", "sync")
# Keyed strategies whose identical rerun changes nothing (no snapshot, no deploy record).
KEYED_NOOP = ("snapshot_replace", "append_new", "sync")


@dataclass
class Expected:
    """What a write should leave behind and report."""

    write_mode: str
    first_deploy: bool
    table: pl.DataFrame
    counters: dict[str, int] = field(default_factory=dict)
    # Whether the write changes anything (False: the store must not commit a snapshot).
    changes: bool = True


def in_window(column: str, low: object, high: object) -> pl.Expr:
    """`low < column <= high` (half-open window, `low=None` = open bottom)."""
    expr = pl.col(column) <= pl.lit(high)
    if low is not None:
        expr = (pl.col(column) > pl.lit(low)) & expr
    return expr


def _align(target: pl.DataFrame, compute: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Give both frames the union of columns (target order first), missing ones null."""
    cols = list(target.columns) + [c for c in compute.columns if c not in target.columns]
    schema = dict(target.schema)
    for name, dtype in compute.schema.items():
        schema.setdefault(name, dtype)

    def fill(frame: pl.DataFrame) -> pl.DataFrame:
        missing = [pl.lit(None, dtype=schema[c]).alias(c) for c in cols if c not in frame.columns]
        return frame.with_columns(missing).select(cols)

    return fill(target), fill(compute)


def _row_equal(cols: list[str]) -> pl.Expr:
    """Row equality where null == null and NaN == NaN (the 'unchanged' test)."""
    parts = []
    for c in cols:
        parts.append(pl.col(c).eq_missing(pl.col(f"{c}__t")))
    return pl.all_horizontal(parts) if parts else pl.lit(True)


def _nan_safe(frame: pl.DataFrame) -> pl.DataFrame:
    """Replace NaN by a sentinel-free marker column-wise so eq_missing sees NaN == NaN."""
    out = []
    for name, dtype in frame.schema.items():
        if dtype in (pl.Float32, pl.Float64):
            # NaN -> null plus a flag column, so NaN compares equal to NaN and unequal to null.
            out.append(pl.col(name).fill_nan(None).alias(name))
            out.append(pl.col(name).is_nan().fill_null(False).alias(f"{name}__isnan"))
        else:
            out.append(pl.col(name))
    return frame.select(out)


def classify(target: pl.DataFrame, compute: pl.DataFrame, pk: list[str]) -> dict[str, pl.DataFrame]:
    """Split rows by key: new compute rows, matched-changed, matched-identical, unmatched target."""
    target, compute = _align(target, compute)
    t_safe = _nan_safe(target)
    c_safe = _nan_safe(compute)
    cmp_cols = [c for c in c_safe.columns if c not in pk]
    joined = c_safe.with_row_index("__ci").join(
        t_safe.rename({c: f"{c}__t" for c in cmp_cols}).with_columns(pl.lit(True).alias("__hit")),
        on=pk,
        how="left",
        nulls_equal=False,
    )
    hit = pl.col("__hit").fill_null(False)
    new_idx = joined.filter(~hit)["__ci"]
    same_idx = joined.filter(hit & _row_equal(cmp_cols))["__ci"]
    changed_idx = joined.filter(hit & ~_row_equal(cmp_cols))["__ci"]
    ci = compute.with_row_index("__ci")
    unmatched = target.join(compute.select(pk), on=pk, how="anti")
    return {
        "new": ci.filter(pl.col("__ci").is_in(new_idx.implode())).drop("__ci"),
        "changed": ci.filter(pl.col("__ci").is_in(changed_idx.implode())).drop("__ci"),
        "same": ci.filter(pl.col("__ci").is_in(same_idx.implode())).drop("__ci"),
        "unmatched": unmatched,
        "target": target,
        "compute": compute,
    }


def expect(
    strategy: str,
    target: pl.DataFrame | None,
    compute: pl.DataFrame,
    pk: list[str],
    *,
    window: tuple[object, object] | None = None,
    watermark: str | None = None,
    within: pl.Expr | None = None,
) -> Expected:
    """The expected result of writing `compute` with `strategy` over `target` (None = no table):
    for the whole dataset, a delta `window` of `watermark`, or the Dagster partition whose rows
    `within` selects."""
    first = target is None
    situation = "first_deploy" if first else ("window" if window is not None else "re_deploy")
    if within is not None and not first:
        situation = "partition"
    elif window is not None:
        assert watermark is not None
        within = in_window(watermark, *window)
    mode = DECISIONS[(strategy, situation)]
    n_in = compute.height
    if first:
        return Expected(
            mode, True, compute, {"rows_in": n_in, "rows_total_after": n_in}, changes=n_in > 0
        )
    assert target is not None
    before = target.height

    if mode == "replace":
        if within is None:
            table = _align(target.clear(), compute)[1]
            deleted = before
            kept = 0
        else:
            t, c = _align(target, compute)
            outside = t.filter(~within.fill_null(False))
            if pk:  # a computed key stored outside the window (its row moved) is replaced too
                outside = outside.join(c.select(pk), on=pk, how="anti", nulls_equal=True)
            table = pl.concat([outside, c])
            deleted = before - outside.height
            kept = outside.height
        counters = {
            "rows_in": n_in,
            "rows_total_after": table.height,
            "rows_inserted": n_in,
            "rows_deleted": deleted,
            "rows_preserved": kept,
        }
        return Expected(mode, False, table, counters, changes=True)

    if mode == "append":
        t, c = _align(target, compute)
        table = pl.concat([t, c])
        counters = {
            "rows_in": n_in,
            "rows_inserted": n_in,
            "rows_updated": 0,
            "rows_deleted": 0,
            "rows_total_after": table.height,
            "rows_preserved": before,
        }
        return Expected(mode, False, table, counters, changes=n_in > 0)

    parts = classify(target, compute, pk)
    t, c = parts["target"], parts["compute"]
    if mode == "append_new":
        table = pl.concat([t, parts["new"]])
        skipped = n_in - parts["new"].height
        counters = {
            "rows_in": n_in,
            "rows_inserted": parts["new"].height,
            "rows_skipped": skipped,
            "rows_updated": 0,
            "rows_deleted": 0,
            "rows_total_after": table.height,
        }
        return Expected(mode, False, table, counters, changes=parts["new"].height > 0)

    # upsert / sync
    unmatched = parts["unmatched"]
    if mode == "sync":
        doomed = unmatched if within is None else unmatched.filter(within.fill_null(False))
        kept = unmatched.join(doomed.select(pk), on=pk, how="anti")
    else:
        doomed = unmatched.clear()
        kept = unmatched
    table = pl.concat([kept, c])
    counters = {
        "rows_in": n_in,
        "rows_inserted": parts["new"].height,
        "rows_updated": parts["changed"].height,
        "rows_unchanged": parts["same"].height,
        "rows_deleted": doomed.height,
        "rows_preserved": kept.height,
        "rows_skipped": 0,
        "rows_total_after": table.height,
    }
    changes = bool(parts["new"].height or parts["changed"].height or doomed.height)
    return Expected(mode, False, table, counters, changes=changes)


def canonical(frame: pl.DataFrame, columns: list[str] | None = None) -> pl.DataFrame:
    """Columns in a fixed order, rows sorted by every column (a multiset's canonical form)."""
    cols = columns if columns is not None else sorted(frame.columns)
    frame = frame.select(cols)
    if not cols or frame.height == 0:
        return frame
    return frame.sort(cols, nulls_last=True)


def assert_same_multiset(
    got: pl.DataFrame, expected: pl.DataFrame, *, check_dtypes: bool = True
) -> None:
    """Same columns, same rows with the same multiplicities (order-independent), same types."""
    assert sorted(got.columns) == sorted(expected.columns), (got.columns, expected.columns)
    assert got.height == expected.height, f"row count: got {got.height}, expected {expected.height}"
    cols = sorted(expected.columns)
    assert_frame_equal(
        canonical(got, cols),
        canonical(expected, cols),
        check_dtypes=check_dtypes,
        check_exact=True,
    )


def is_identical_replace(exp: Expected, before: pl.DataFrame | None) -> bool:
    """A replace whose result equals the target it replaces (same columns, same multiset): the store
    may skip it or commit it, and only `rows_in` / `rows_total_after` are then meaningful."""
    return (
        exp.write_mode == "replace"
        and before is not None
        and sorted(before.columns) == sorted(exp.table.columns)
        and canonical(before).equals(canonical(exp.table))
    )


def assert_counters(res: object, exp: Expected, *, identical_replace: bool) -> None:
    """The write result's counters are the oracle's (only the two meaningful ones for an identical
    replace, see `is_identical_replace`)."""
    counters = dict(exp.counters)
    if identical_replace:
        counters = {k: counters[k] for k in ("rows_in", "rows_total_after")}
    got = {k: getattr(res, k) for k in counters}
    assert got == counters, f"counters: got {got}, oracle {counters}"
