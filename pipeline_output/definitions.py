"""The project's Dagster definitions (`pipeline_output.definitions:defs`, loaded by workspace.yaml).

The demo shop dataspace; a real deployment points its workspace at its own module built the same way
(`build_definitions(datasets=[...], sources=[...])`).
"""

from __future__ import annotations

from pipeline_output.demo.code_location import defs

__all__ = ["defs"]
