"""The decision table: (spec, target state, window) -> write plan. Pure; no I/O, no Dagster.

| strategy          | first deploy | re-deploy                  | delta window                        |
|-------------------|--------------|----------------------------|-------------------------------------|
| snapshot_replace  | replace      | upsert (keep unmatched)    | upsert the window's rows            |
| append_always     | replace      | append                     | append the window's rows            |
| append_new        | replace      | append_new (anti-join)     | append_new of the window's rows     |
| replace           | replace      | replace                    | replace target rows inside window   |
| sync              | replace      | sync (upsert + delete)     | sync, deletes scoped to the window  |

A combination absent from `_DECISIONS` raises `UnsupportedWrite` before any I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline_output.contract.spec import DatasetSpec, Strategy, WriteMode
from pipeline_output.contract.windows import Window
from pipeline_output.errors import UnsupportedWrite

Situation = Literal["first_deploy", "re_deploy", "window"]
DeleteScope = Literal["none", "all", "window", "absent_keys", "absent_keys_in_window"]


@dataclass(frozen=True)
class TargetState:
    """What the freshness oracle found: does the target exist, and has it a committed write?"""

    exists: bool
    has_snapshot: bool
    snapshot_id: int | None = None
    total_rows: int | None = None

    @property
    def first_deploy(self) -> bool:
        """First deploy iff the target has no committed write yet."""
        return not (self.exists and self.has_snapshot)


@dataclass(frozen=True)
class WritePlan:
    """The primitive to execute and why."""

    dataset: str
    strategy: Strategy
    write_mode: WriteMode
    first_deploy: bool
    window: Window | None
    delete_scope: DeleteScope

    @property
    def reason(self) -> str:
        """Why this write mode: first deploy, re-deploy, or the window."""
        if self.first_deploy:
            return "first deploy"
        if self.window is not None:
            return f"window {self.window}"
        return "re-deploy"

    def describe(self) -> str:
        """The expected effect, in one sentence (used by dry runs)."""
        effects: dict[WriteMode, str] = {
            "replace": "replace every target row with the compute's rows",
            "upsert": "update rows whose key matches, insert new keys, keep all other rows",
            "append": "append every computed row",
            "append_new": "insert only rows whose key is absent from the target; leave others",
            "sync": "update matched keys, insert new keys, delete target rows whose key is absent",
        }
        effect = effects[self.write_mode]
        if self.write_mode == "replace" and self.window is not None and not self.first_deploy:
            effect = f"replace only the target rows inside {self.window}"
        elif self.write_mode == "sync" and self.window is not None:
            effect += f" (deletion limited to rows inside {self.window})"
        return f"{self.write_mode} ({self.reason}): {effect}"


# (strategy, situation) -> (write mode, delete scope)
_DECISIONS: dict[tuple[str, Situation], tuple[WriteMode, DeleteScope]] = {
    ("snapshot_replace", "first_deploy"): ("replace", "all"),
    ("snapshot_replace", "re_deploy"): ("upsert", "none"),
    ("snapshot_replace", "window"): ("upsert", "none"),
    ("append_always", "first_deploy"): ("replace", "all"),
    ("append_always", "re_deploy"): ("append", "none"),
    ("append_always", "window"): ("append", "none"),
    ("append_new", "first_deploy"): ("replace", "all"),
    ("append_new", "re_deploy"): ("append_new", "none"),
    ("append_new", "window"): ("append_new", "none"),
    ("replace", "first_deploy"): ("replace", "all"),
    ("replace", "re_deploy"): ("replace", "all"),
    ("replace", "window"): ("replace", "window"),
    ("sync", "first_deploy"): ("replace", "all"),
    ("sync", "re_deploy"): ("sync", "absent_keys"),
    ("sync", "window"): ("sync", "absent_keys_in_window"),
}


def plan_write(spec: DatasetSpec, target: TargetState, window: Window | None = None) -> WritePlan:
    """Decide the write mode for `spec` given the target's state and an optional delta window."""
    if window is not None and spec.delta is None:
        raise UnsupportedWrite(
            f"dataset {spec.name!r}: a window {window} was given but the dataset has no Delta "
            "settings (no watermark column to scope it)"
        )
    situation: Situation
    if target.first_deploy:
        situation = "first_deploy"
    elif window is not None:
        situation = "window"
    else:
        situation = "re_deploy"
    decision = _DECISIONS.get((spec.strategy, situation))
    if decision is None:
        raise UnsupportedWrite(
            f"dataset {spec.name!r}: strategy {spec.strategy!r} has no implemented write for "
            f"{situation.replace('_', ' ')}; nothing was written"
        )
    write_mode, scope = decision
    return WritePlan(
        dataset=spec.name,
        strategy=spec.strategy,
        write_mode=write_mode,
        first_deploy=target.first_deploy,
        window=window,
        delete_scope=scope,
    )
