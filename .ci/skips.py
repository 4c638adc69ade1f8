"""Fail CI where a test skipped for any reason but a missing GPU.

The CPU suite skips the GPU-only tests (no CUDA here); any other skip means
something the suite needs is missing on this machine (the long-context data
under ../shared/data, a package, a tool) and the tests behind it did not run:
the lossless tests among them. Reads pytest's JUnit XML.

    python .ci/skips.py JUNIT_XML
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET

GPU_ONLY = re.compile(r"CUDA|GPU", re.IGNORECASE)


def unexpected(path: str) -> list[tuple[str, str]]:
    """(test, reason) of each skip whose reason is not a missing GPU."""
    found = []
    for case in ET.parse(path).getroot().iter("testcase"):
        for skip in case.findall("skipped"):
            if skip.get("type") == "pytest.xfail":
                continue  # an expected failure, not a skip
            reason = skip.get("message") or ""
            if reason == "collection skipped":
                # A module-level skip: its reason ends the element's text,
                # ('/path/test_x.py', 28, 'Skipped: needs CUDA GPUs') or
                # path:28: needs CUDA GPUs; the path itself may say "gpu".
                text = skip.text or ""
                reason = text.split("Skipped: ", 1)[1].rstrip("')\"") \
                    if "Skipped: " in text else text.rsplit(": ", 1)[-1]
            if not GPU_ONLY.search(reason):
                found.append((f"{case.get('classname')}::{case.get('name')}", reason))
    return found


def main(argv: list[str]) -> int:
    bad = unexpected(argv[1])
    for test, reason in bad:
        print(f"skipped, not for a missing GPU: {test}: {reason}")
    if bad:
        print(f"FAILED: {len(bad)} tests skipped for a reason other than a missing GPU "
              "(install what they name, or bring ../shared/data)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
