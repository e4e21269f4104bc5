"""The project's version: the package's `__version__`, and what every snapshot it writes records
(`pipeline-output.version`)."""

VERSION = "0.1.0"
