"""docs/training.md's table of TRL's GRPOConfig fields stays complete: it names every field GRPOConfig declares
(or adds to TrainingArguments) and nothing else, each once, with what CAPOTrainer does with it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from transformers import TrainingArguments
from trl import GRPOConfig

DOC = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
SECTION = "## TRL's `GRPOConfig` fields under `CAPOTrainer`"
VERDICTS = ("works", "refused", "meaning changes", "see `docs/config.md`")


def grpo_fields() -> set[str]:
    """What GRPOConfig declares itself, and every field it has that TrainingArguments lacks."""
    plain = {f.name for f in dataclasses.fields(TrainingArguments)}
    added = {f.name for f in dataclasses.fields(GRPOConfig)} - plain
    return added | set(GRPOConfig.__annotations__)


def table() -> list[tuple[list[str], str]]:
    """(field names of the first cell, verdict) per row of the section's table."""
    section = DOC.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows.append((re.findall(r"`(\w+)`", cells[0]), cells[1]))
    return rows


def test_the_table_names_every_grpo_config_field_once():
    rows = table()
    named = [name for names, _ in rows for name in names]
    fields = grpo_fields()
    assert sorted(set(fields) - set(named)) == [], "GRPOConfig fields the table does not name"
    assert sorted(set(named) - fields) == [], "names in the table that are no GRPOConfig field"
    assert len(named) == len(set(named)), "a field named twice"
    assert f"({len(fields)} in TRL" in DOC.split(SECTION, 1)[1], "the count in the section's text"


def test_every_row_says_what_capo_does():
    bad = [(names, verdict) for names, verdict in table() if verdict not in VERDICTS]
    assert not bad, bad
