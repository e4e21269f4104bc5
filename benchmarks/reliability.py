"""One command for every reliability figure in docs/reliability.md.

    python benchmarks/reliability.py            # CI profile + the slow scenarios
    python benchmarks/reliability.py --deep     # model-based tests with the deep hypothesis profile
    python benchmarks/reliability.py --ci-only  # exactly what the normal test command runs

Runs pytest over the reliability test files with PIPELINE_OUTPUT_RELIABILITY_REPORT set, then prints
the figures each scenario recorded as a markdown table (and the pytest outcome).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

FILES = [
    "pipeline_output_tests/reliability/test_reliability_model.py",
    "pipeline_output_tests/reliability/test_reliability_faults.py",
    "pipeline_output_tests/reliability/test_reliability_concurrency.py",
    "pipeline_output_tests/reliability/test_hostile_input.py",
    "pipeline_output_tests/reliability/test_secrets.py",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deep", action="store_true", help="hypothesis deep profile")
    parser.add_argument("--ci-only", action="store_true", help="skip @slow scenarios")
    parser.add_argument("--examples", type=int, help="override the profile's example count")
    args = parser.parse_args()
    root = Path(__file__).resolve().parent.parent
    report = Path(tempfile.mkstemp(prefix="po-reliability-", suffix=".jsonl")[1])
    env = dict(os.environ, PIPELINE_OUTPUT_RELIABILITY_REPORT=str(report))
    env["PIPELINE_OUTPUT_HYPOTHESIS_PROFILE"] = "deep" if args.deep else "ci"
    if args.examples:
        env["PIPELINE_OUTPUT_HYPOTHESIS_EXAMPLES"] = str(args.examples)
    marks = "not slow" if args.ci_only else ""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marks, *FILES]
    code = subprocess.call(cmd, cwd=root, env=env)
    print("\n| scenario | profile | figures |\n|---|---|---|")
    for line in report.read_text().splitlines():
        row = json.loads(line)
        name, prof = row.pop("scenario"), row.pop("profile")
        row.pop("at", None)
        row.pop("command", None)
        figures = ", ".join(f"{k}={v}" for k, v in row.items())
        print(f"| {name} | {prof} | {figures} |")
    print(f"\npytest exit code: {code}; raw figures: {report}")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
