"""``python -m tests.module_seconds JUNIT.xml``: rewrite ``tests/module_seconds.json`` (the
seconds each test module took, which :mod:`tests.conftest` orders the modules by) from the
``--junitxml`` report of a full run, e.g. ``pytest -n 2 --dist loadfile --junitxml=run.xml``."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

#: modules faster than this are left out (their order does not matter)
MIN_SECONDS = 5.0


def module_seconds(report: Path) -> dict[str, int]:
    """Module path -> whole seconds its tests took (setup, call and teardown), longest first."""
    seconds: Counter[str] = Counter()
    for case in ET.parse(report).iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        seconds[module] += float(case.get("time", "0"))
    return {m: round(s) for m, s in seconds.most_common() if s >= MIN_SECONDS}


def main() -> None:
    target = Path(__file__).with_name("module_seconds.json")
    target.write_text(json.dumps(module_seconds(Path(sys.argv[1])), indent=0) + "\n")


if __name__ == "__main__":
    main()
