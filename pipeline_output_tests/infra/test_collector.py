"""The garbage collector while the package's libraries are imported (`infra/collector.py`): the
first use of the public API imports them with no collection, then freezes what the process holds
and enables the collector again; a process that disabled the collector is left alone. Each case
runs in a fresh interpreter (freezing is for the life of a process)."""

from __future__ import annotations

import subprocess
import sys

FIRST_USE = """
import gc
import pipeline_output as p

full = []
gc.callbacks.append(lambda phase, info: full.append(info["generation"]) if phase == "start" else None)
before = gc.get_freeze_count()
p.build_definitions  # imports Dagster, pyiceberg, pyarrow, polars, psycopg ... and the project
print(len(full), gc.isenabled(), gc.get_freeze_count() > before)
"""

DISABLED_BY_THE_PROCESS = """
import gc
gc.disable()
import pipeline_output as p

p.dataset
print(gc.isenabled(), gc.get_freeze_count())
"""

FAILED_IMPORT = """
import gc
from pipeline_output.infra.collector import imports_paused

try:
    with imports_paused():
        import no_such_module_anywhere  # noqa: F401
except ImportError:
    pass
print(gc.isenabled(), gc.get_freeze_count() > 0)
"""


def _run(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_first_use_of_the_api_imports_without_collections_then_freezes() -> None:
    assert _run(FIRST_USE) == "0 True True"


def test_a_process_that_disabled_the_collector_keeps_it_disabled_and_unfrozen() -> None:
    assert _run(DISABLED_BY_THE_PROCESS) == "False 0"


def test_the_collector_is_enabled_again_when_an_import_fails() -> None:
    assert _run(FAILED_IMPORT) == "True True"


PAUSED = """
import gc, threading
from pipeline_output.infra.collector import paused

inside = []
entered, release = threading.Event(), threading.Event()

def other():
    with paused():
        entered.set()
        release.wait()
        inside.append(gc.isenabled())

t = threading.Thread(target=other)
t.start()
entered.wait()
with paused():
    with paused():
        inside.append(gc.isenabled())
    inside.append(gc.isenabled())
inside.append(gc.isenabled())  # the other thread's block is still open
release.set()
t.join()
after = gc.isenabled()
gc.disable()
with paused():
    pass
print(inside, after, gc.isenabled())
"""


def test_paused_blocks_disable_collection_until_the_last_one_ends_in_any_thread() -> None:
    assert _run(PAUSED) == "[False, False, False, False] True False"


INSTANCE_AFTER_THE_DEFINITIONS = """
import gc, sys
import dagster as dg
import pipeline_output as p

p.build_definitions()
gc.collect()
walked, modules = len(gc.get_objects()), set(sys.modules)
with dg.DagsterInstance.ephemeral():
    gc.collect()
    added = len(gc.get_objects()) - walked
    print(added < 15_000, len(set(sys.modules) - modules) < 50, gc.isenabled())
"""


def test_an_instance_opened_after_the_definitions_adds_few_objects_for_the_collector() -> None:
    """Loading the definitions imports the modules every Dagster instance imports (its run,
    event-log and schedule storages: SQLAlchemy, alembic ...) and freezes them, as a run
    worker that opens its instance first has them: opening an instance afterwards imports a
    few modules more, not ~390, and leaves the collector a few thousand new objects, not
    ~54,000 for the first full collection of the first run to walk."""
    assert _run(INSTANCE_AFTER_THE_DEFINITIONS) == "True True True"
