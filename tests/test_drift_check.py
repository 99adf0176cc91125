"""The drift rule's clipped-ratio half, checked against the committed real-model CAPO runs, as
docs/results/smollm2-drift/README.md reports it. Their logs (5-step means) predate ``capo/truncated_adv_share``:
every CAPO run here ranked truncated completions by their score (``truncated_pairs='ranked'``), whose weak push the
start-model accounting measures, so the rule is fed a push of 0 and only its clipped-ratio half is tested."""

import json
import re
import statistics
from pathlib import Path

from capo_trl.training.monitor import replay_drift

ROOT = Path(__file__).resolve().parents[1]
# finished studies only: a running one's records would change the counts as they land
FOLDERS = ("smollm2-study", "smollm2-lr")


def drift_check() -> dict:
    """Per CAPO run: the first logged window whose completions all ran to the limit (the study page's reading)
    and the step the rule warned at; the counts the docs give."""
    runs = []
    for folder in FOLDERS:
        for path in sorted((ROOT / "docs" / "results" / folder).glob("capo*/seed*.json")):
            train = json.loads(path.read_text())["train"]
            # not logged then: right answers that kept writing (0), the push (0 of GRPO's)
            warned = replay_drift(train)
            stuck = next((x["step"] for x in train if x["completions/clipped_ratio"] >= 1.0), None)
            runs.append((stuck, warned))
    collapsed = [(s, w) for s, w in runs if s is not None]
    leads = [s - w for s, w in collapsed if w is not None and w < s]
    return {"runs": len(runs), "collapsed": len(collapsed), "warned_before": len(leads),
            "warned_20_before": sum(lead >= 20 for lead in leads), "median_lead": statistics.median(leads),
            "others": len(runs) - len(collapsed), "others_warned": sum(w is not None for s, w in runs if s is None)}


def test_the_docs_give_the_rules_record_on_the_committed_runs():
    c = drift_check()
    text = " ".join((ROOT / "docs" / "results" / "smollm2-drift" / "README.md").read_text().split())
    expected = (f"Of the {c['runs']} CAPO runs, {c['collapsed']} logged a window in which every completion ran to "
                f"the limit; the rule warned before {c['warned_before']} of them, 20 steps or more before for "
                f"{c['warned_20_before']} (median {c['median_lead']:g} steps), and it warned in {c['others_warned']} of "
                f"the other {c['others']}")
    assert expected in text, (expected, re.findall(r"Of the \d+ CAPO runs[^.]*", text))


def replay_check() -> list[tuple[int, int | None, int | None]]:
    """(seed, warned at, every completion at the limit at) for each committed replay of the first study's CAPO runs:
    the same runs retrained with the drift signals logged (their logs equal the committed ones). The push is not in
    them in its logged form, so it counts as 0 of GRPO's, as above."""
    out = []
    for path in sorted((ROOT / "docs" / "results" / "smollm2-study" / "replays").glob("*.json")):
        replay = json.loads(path.read_text())
        warned = replay_drift(replay["train"])
        stuck = next((x["step"] for x in replay["train"] if x["completions/clipped_ratio"] >= 1.0), None)
        out.append((replay["seed"], warned, stuck))
    return out


def test_the_replays_are_the_committed_runs_and_the_docs_give_their_warnings():
    for path in sorted((ROOT / "docs" / "results" / "smollm2-study" / "replays").glob("*.json")):
        replay = json.loads(path.read_text())
        record = json.loads((ROOT / "docs" / "results" / "smollm2-study" / replay["replays"]).read_text())
        assert len(replay["train"]) == len(record["train"])
        for a, b in zip(replay["train"], record["train"]):  # every number the record logged, equal
            assert {k: a[k] for k in b if k in a} == {k: v for k, v in b.items() if k in a}
            assert set(replay["equal_to_the_record"]) == set(b) - {"step"}
    text = " ".join((ROOT / "docs" / "results" / "smollm2-drift" / "README.md").read_text().split())
    for seed, warned, stuck in replay_check():
        said = (f"seed {seed}: warned at step {warned}, {stuck - warned} steps before every completion ran to the "
                f"limit (step {stuck})" if stuck is not None and warned is not None else
                f"seed {seed}: warned at step {warned}, and its completions never all ran to the limit")
        assert said in text, (said, re.findall(r"seed \d+: warned[^;.]*", text))
