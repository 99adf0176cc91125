"""Simulate how many calibration questions certify a target precision; write the table and its docs copy.

    python scripts/certify_questions.py            # minutes on a CPU

Writes src/capo_trl/assets/certify_questions.json (read by `capo-trl eval` when it certifies nothing)
and the table between the `certify-table` markers in docs/evaluation.md (capo_trl.evaluation.certify).
"""

import json
import re
from pathlib import Path

from capo_trl.evaluation.certify import CASES, TABLE_FILE, questions_needed, render_markdown

ROOT = Path(__file__).resolve().parent.parent
TARGETS = (0.8, 0.9, 0.95, 0.99)
SETTINGS = {"samples": 8, "confidence": 0.95, "seeds": 10, "concentration": 2.0}


def main() -> None:
    rows = []
    for target in TARGETS:
        for case, precision in CASES.items():
            r = round(precision(target), 6)
            rows.append({"target": target, "case": case, "answered_precision": r,
                         "questions": questions_needed(target, r, **SETTINGS)})
            print(rows[-1], flush=True)
    table = {"settings": SETTINGS, "rows": rows}
    TABLE_FILE.write_text(json.dumps(table, indent=1) + "\n")
    doc = ROOT / "docs" / "evaluation.md"
    text = doc.read_text()
    new, found = re.subn(r"(<!-- certify-table -->\n)(?:.*?\n)?(<!-- /certify-table -->)",
                         lambda m: m.group(1) + render_markdown(table) + "\n" + m.group(2), text, flags=re.S)
    assert found == 1, "docs/evaluation.md needs one pair of certify-table markers"
    doc.write_text(new)
    print(f"wrote {TABLE_FILE.relative_to(ROOT)} and the table in docs/evaluation.md")


if __name__ == "__main__":
    main()
