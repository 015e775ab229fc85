"""What redaction costs the operator's ingest: every `CheckResult.message` of every report is
passed through `netval.model.redaction.redact` when the report is parsed.

Run from the repository root:

    python bench/redaction_cost.py

Prints, for the ingest bench's report (40 results of a real RoCE node, bench/ingest.py) and
for the same report with a presigned storage path in one message: the median time to decode
it (`decode_message`, redaction included), the median time of redacting its 40 messages
alone, their ratio, and what that is at 10,000 nodes reporting every 10 s (1,000 reports/s).
Medians of 9 rounds of 300 decodes, all side by side in one run.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ingest  # type: ignore[import-not-found]  # bench/ingest.py: its report builder
from netval.model.redaction import redact
from netval.operator.ingest.decode import decode_message

ROUNDS: Final = 9
PER_ROUND: Final = 300
PRESIGNED: Final = (
    "HEAD /bucket/object?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F20260101"
    "&X-Amz-Signature=9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 "
    "answered 403 Forbidden from 10.0.0.9:80"
)
REPORTS_PER_SECOND: Final = 1000  # 10,000 nodes every 10 s


def median_us(call: Callable[[], object]) -> float:
    rounds = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(PER_ROUND):
            call()
        rounds.append((time.perf_counter() - start) / PER_ROUND * 1e6)
    return statistics.median(rounds)


def main() -> None:
    plain = ingest.build_report(1, 10000, 1.0)
    results = list(plain.results)
    results[-1] = results[-1].model_copy(update={"message": PRESIGNED})
    presigned = plain.model_copy(update={"results": results})
    print(f"{ROUNDS} rounds x {PER_ROUND} decodes, medians; report of {len(results)} results")
    print("| report | decode (redaction included) | redacting its messages | share | "
          "at 1,000 reports/s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|")
    for label, report in (("bench report", plain), ("with a presigned path", presigned)):
        payload = report.to_json().encode()
        topic = f"netval/v1/{report.validation}/{report.node}/report"
        messages = [r.message for r in report.results]
        decode = median_us(lambda: decode_message(topic, payload))  # noqa: B023
        masking = median_us(lambda: [redact(m) for m in messages])  # noqa: B023
        print(
            f"| {label} | {decode:.0f} µs | {masking:.1f} µs | {masking / decode:.0%} | "
            f"{masking * REPORTS_PER_SECOND / 1e4:.1f} % of a core |"
        )


if __name__ == "__main__":
    main()
