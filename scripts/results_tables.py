"""Render every table of numbers in docs/results/README.md and docs/results/testbed/README.md from the
committed result files.

    python scripts/results_tables.py            rewrite the tables in place
    python scripts/results_tables.py --check    exit 1 (and print the differences) if any is stale

A table is the block between ``<!-- table: NAME (rendered by scripts/results_tables.py) -->`` and
``<!-- end table -->``; ``RENDER[NAME]`` builds it from files under docs/results/. A table of numbers
outside such a block is an error (``unrendered_tables``), so a number without a file cannot be written.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
READMES = (RESULTS / "README.md", RESULTS / "testbed" / "README.md")
BLOCK = re.compile(r"(<!-- table: (?P<name>[\w-]+) \(rendered by scripts/results_tables\.py\) -->\n)(?P<body>.*?)"
                   r"(<!-- end table -->)", re.S)
ENDPOINTS = ("accuracy", "auroc", "auroc_question", "ece")  # the column order of the method tables


def rows(path: str) -> list[dict]:
    with open(RESULTS / path, newline="") as f:
        return list(csv.DictReader(f))


def summary(path: str) -> dict:
    return json.loads((RESULTS / path).read_text())


def table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body]) + "\n"


def mean_sd(values: list[float], digits: int = 3) -> str:
    """``mean ± sd`` over seeds (sample sd), or the value alone for one seed."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def from_summary(path: str, key: str, bold: tuple = ()) -> list[str]:
    """One method's row of a ``capo-trl compare`` summary.json: mean ± sd over its seeds."""
    stats = summary(path)["summary"][key]
    cells = []
    for name in ENDPOINTS:
        mean, sd = stats[name]
        cell = f"{mean:.3f}" if sd == 0 else f"{mean:.3f} ± {sd:.3f}"
        cells.append(f"**{cell}**" if name in bold else cell)
    return cells


def from_final(paths: list[str], method: str, bold: tuple = ()) -> list[str]:
    """One method's row pooled over several ``final.csv`` files (one seed or more each)."""
    found = [r for p in paths for r in rows(p) if r["method"] == method]
    cells = [mean_sd([float(r[name]) for r in found]) for name in ENDPOINTS]
    return [f"**{c}**" if name in bold else c for c, name in zip(cells, ENDPOINTS)]


METHOD_HEADER = ["method", "accuracy", "pooled AUROC", "per-question AUROC", "ECE"]


def render_main() -> str:
    body = [["start (no RL)", *from_summary("main/summary.json", "start (no RL)")],
            ["grpo", *from_summary("main/summary.json", "grpo")],
            ["capo (relative tau 1.0, bounded scale, no mask)", *from_summary("main/summary.json", "capo")],
            ["capo (relative tau 0.5, matched scale, no mask)",
             *from_summary("variants/summary.json", "capo:advantage_scale=matched:tau=0.5")],
            ["capo-paper (tau 0.6 nats, 1/tau scale, mask 2.5 / 1.05)", *from_summary("variants/summary.json",
                                                                                      "capo-paper")]]
    return table(["method", "accuracy (mean@8)", *METHOD_HEADER[2:]], body)


def render_noise() -> str:
    labels = {"start (no RL)": "start (no RL)", "grpo": "grpo", "grpo-mask": "grpo-mask", "capo": "capo (no mask)",
              "capo-mask": "capo-mask"}
    body = [[label, *from_summary("noise/summary.json", key, bold=("accuracy",) if key == "capo" else ())]
            for key, label in labels.items()]
    return table(METHOD_HEADER, body)


def render_noise3() -> str:
    paths = [f"noise3/s{k}/final.csv" for k in range(3)]
    body = [["start (no RL)", "-", *from_final(paths[:1], "start (no RL)")]]
    for key, label in (("grpo", "grpo"), ("grpo-mask", "grpo-mask"), ("capo", "capo (no mask)"),
                       ("capo-mask", "capo-mask")):
        seeds = len([r for p in paths for r in rows(p) if r["method"] == key])
        body.append([label, str(seeds), *from_final(paths, key, bold=("accuracy",) if key == "capo" else ())])
    return table(["method", "seeds", *METHOD_HEADER[1:]], body)


def render_long() -> str:
    runs = {"GRPO": ("long/long-grpo/final.csv", "long/long-grpo-s2/final.csv", "grpo"),
            "CAPO": ("long/long-capo/final.csv", "long/long-capo-s2/final.csv", "capo:advantage_scale=matched:tau=0.5")}
    body = []
    for metric, label in (("accuracy", "accuracy"), ("auroc_question", "per-question AUROC"), ("auroc", "pooled AUROC")):
        for arm, (first, third, method) in runs.items():
            by_seed = {int(r["seed"]): float(r[metric]) for p in (first, third) for r in rows(p) if r["method"] == method}
            values = [by_seed[s] for s in sorted(by_seed)]
            # Seed 2 of CAPO is the collapsed run: bold, as the text discusses it.
            cells = [f"**{v:.3f}**" if arm == "CAPO" and s == 2 and metric != "accuracy" else f"{v:.3f}"
                     for s, v in zip(sorted(by_seed), values)]
            body.append([f"{arm} {label}", *cells, mean_sd(values)])
    return table(["run", "seed 0", "seed 1", "seed 2", "mean ± sd"], body)


ARMS = {"grpo": "A grpo", "capo-mask:advantage_scale=matched:tau=0.5": "B capo-mask (matched, tau 0.5)",
        "capo-paper": "C capo-paper", "capo:advantage_scale=matched:tau=0.5": "D capo, no mask"}


def render_powered() -> str:
    per_seed = rows("powered/per_seed.csv")
    body = []
    for method, label in ARMS.items():
        mine = [r for r in per_seed if r["method"] == method]
        cells = [mean_sd([float(r[k]) for r in mine]) for k in ("auroc_question", "accuracy", "auroc", "ece")]
        body.append([label, str(len(mine)), *cells, f"{statistics.mean(float(r['mean_tokens']) for r in mine):.1f}"])
    return table(["method", "seeds", "auroc_question", "accuracy", "auroc", "ece", "mean tokens"], body)


def _comparisons(pairs, with_verdict: bool) -> str:
    comparisons = summary("powered/summary.json")["comparisons"]
    short = {method: label.split()[0] for method, label in ARMS.items()}
    body = []
    for b, a in pairs:
        for endpoint in ("auroc_question", "accuracy", "auroc", "ece"):
            d = comparisons[f"{b} - {a}: {endpoint}"]
            row = [f"{short[b]} - {short[a]}", endpoint, str(d["n"]), f"{d['mean']:+.4f}",
                   f"[{d['t_low']:+.4f}, {d['t_high']:+.4f}]", f"[{d['boot_low']:+.4f}, {d['boot_high']:+.4f}]",
                   f"{d['wilcoxon_p']:.3f}"]
            if with_verdict:  # the pre-registered rule (protocol.md), on the primary endpoint only
                row.append(("helps" if d["t_low"] > 0 else "hurts" if d["t_high"] < 0 else "inconclusive")
                           if endpoint == "auroc_question" else "")
            body.append(row)
    header = ["comparison", "endpoint", "n", "mean", "95% t-interval", "bootstrap 95%", "Wilcoxon p"]
    return table(header + ["verdict"] * with_verdict, body)


A, B, C, D = ARMS


def render_paired() -> str:
    return _comparisons([(B, A), (C, A)], with_verdict=True)


def render_exploratory() -> str:
    return _comparisons([(D, A), (D, B)], with_verdict=False)


def render_collapse() -> str:
    per_seed = rows("powered/per_seed.csv")
    body = []
    for method in (D, B, A, C):
        mine = sorted((r for r in per_seed if r["method"] == method and int(r["seed"]) <= 4), key=lambda r: int(r["seed"]))
        runs = ", ".join(f"s{r['seed']}: {float(r['mean_tokens']):.1f} / {float(r['auroc']):.3f} / "
                         f"{float(r['auroc_question']):.3f}" for r in mine)
        collapsed = sum(r["collapsed"] == "True" for r in mine)
        body.append([ARMS[method], str(len(mine)), str(collapsed), runs])
    return table(["arm", "seeds 0-4", "collapsed", "per seed (tokens / pooled AUROC / per-question AUROC)"], body)


def render_confidence() -> str:
    """The table scripts/confidence_table.py wrote next to its files (confidence/table.md), as it is."""
    text = (RESULTS / "confidence" / "table.md").read_text()
    return "".join(line + "\n" for line in text.splitlines() if line.startswith("|"))


def _testbed_scripts():
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    import testbed_compare
    import testbed_pilot

    return testbed_pilot, testbed_compare


def render_pilot(steps: int) -> str:
    """A pilot's tables and verdict (testbed/pilot-<steps>/), re-rendered from its start and seed files."""
    pilot, _ = _testbed_scripts()
    where = RESULTS / "testbed" / f"pilot-{steps}"
    start = json.loads((where / "start.json").read_text())
    finals = {int(p.stem[4:]): json.loads(p.read_text()) for p in sorted(where.glob("seed*.json"))}
    return pilot.render(start, finals, pilot.verdict(start, finals))


def render_testbed_compare() -> str:
    """The five-arm comparison's tables (testbed/compare/), re-rendered from its run files."""
    _, compare = _testbed_scripts()
    return compare.render(compare.summarise(RESULTS / "testbed" / "compare"))


RENDER = {"main": render_main, "noise": render_noise, "noise3": render_noise3, "long": render_long,
          "powered": render_powered, "paired": render_paired, "exploratory": render_exploratory,
          "collapse": render_collapse, "confidence": render_confidence,
          "pilot-300": lambda: render_pilot(300), "pilot-600": lambda: render_pilot(600),
          "pilot-1000": lambda: render_pilot(1000), "testbed-compare": render_testbed_compare}


def render(text: str) -> str:
    """``text`` with every marked table re-rendered (an unknown name is an error)."""
    def one(match):
        name = match["name"]
        if name not in RENDER:
            raise KeyError(f"no renderer for table {name!r}; add one to RENDER in scripts/results_tables.py.")
        return match.group(1) + RENDER[name]() + match.group(4)
    return BLOCK.sub(one, text)


def unrendered_tables(text: str) -> list[str]:
    """Table lines holding a digit outside the marked blocks: numbers no file backs."""
    outside = BLOCK.sub("", text)
    return [line for line in outside.splitlines() if line.startswith("|") and not set(line) <= set("|-: ")
            and re.search(r"\d", line)]


def main(argv: list[str]) -> int:
    failed = False
    for readme in READMES:
        text = readme.read_text()
        new = render(text)
        stray = unrendered_tables(text)
        name = readme.relative_to(ROOT)
        if "--check" in argv:
            if new != text:
                import difflib

                sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True), str(name),
                                                           "rendered"))
        else:
            readme.write_text(new)
        for line in stray:
            print(f"{name}: table row with numbers but no rendering block: {line}")
        failed = failed or bool(stray) or ("--check" in argv and new != text)
    return int(failed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
