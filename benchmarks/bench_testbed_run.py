"""A whole test-bed run, old tree against this one: CPU time (user + sys, the run's worker processes
included) and wall time of the same run in each, and whether their results agree.

Each (preset, tree) runs as its own niced process with one torch thread, exactly as the test-bed
driver launches a run. By default the runs of one preset go round by round in the order old, new,
old, new, ... (``--rounds``), so drift in the machine's load hits both trees alike;
``--concurrent`` starts every run at once instead (shorter, but the runs then compete with each
other for the cores). Prints, per preset, each run's CPU and wall seconds, the new/old ratios of
the totals, and the test-split endpoints of each run: the same seed samples the same completions,
so accuracy and mean length must be equal and the others equal up to float rounding (an update
that sums in another order, e.g. with ``skip_zero_advantage_rows``, moves ``s`` by ~1e-8). The old tree is any checkout with the test bed, e.g.
``git worktree add ../old 958407a`` (older trees launch ``scripts/testbed_compare.py``).

    python benchmarks/bench_testbed_run.py --old-tree ../old [--presets capo-nomask grpo] [--steps 600] \\
      [--rounds 1] [--concurrent] [--new-tree .] [--out /tmp/bench-testbed]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

NEW_TREE = Path(__file__).resolve().parents[1]
ENDPOINTS = ("accuracy", "auroc", "auroc_question", "ece", "e_aurc", "mean_tokens")
DISCRETE = ("accuracy", "mean_tokens")  # counts of samples: equal unless the sampled completions differ


RECORD = """import json, sys
from pathlib import Path
from capo_trl.harness.presets import parse_methods
from capo_trl.harness.testbed import train_record
task, preset, seed, steps, val_every, test_problems, out = sys.argv[1:]
(label, overrides), = parse_methods(preset)
record = train_record(task, int(steps), int(val_every), int(test_problems), out, label, overrides, int(seed))
path = Path(out) / label / f"seed{seed}.json"
path.parent.mkdir(parents=True, exist_ok=True)
path.write_text(json.dumps(record))
"""


def command(tree: Path, preset: str, args, out: Path) -> list[str]:
    """One test-bed run in ``tree``, as its own driver runs one: ``testbed.train_record`` in a plain interpreter, or
    in older trees their ``one`` command (``python -m capo_trl.harness.testbed one`` or ``scripts/testbed_compare.py``)."""
    run = [args.task, preset, str(args.seed), str(args.steps), str(args.val_every), str(args.test_problems), str(out)]
    testbed = tree / "src/capo_trl/harness/testbed.py"
    if testbed.is_file() and "def train_record(" in testbed.read_text():
        return ["nice", sys.executable, "-c", RECORD, *run]
    driver = ["-m", "capo_trl.harness.testbed"] if testbed.is_file() else [str(tree / "scripts/testbed_compare.py")]
    return ["nice", sys.executable, *driver, "one", "--task", args.task, "--method", preset, "--seed", str(args.seed),
            "--steps", str(args.steps), "--val_every", str(args.val_every), "--test_problems",
            str(args.test_problems), "--out", str(out)]


def start(tree: Path, preset: str, args, out: Path) -> tuple[subprocess.Popen, float]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    log = open(out.with_suffix(".log"), "w")
    return subprocess.Popen(command(tree, preset, args, out), cwd=tree, env=env, stdout=log, stderr=log), time.time()


def finish(proc: subprocess.Popen, began: float, out: Path, preset: str, ended=None) -> dict:
    """One finished run: its CPU (the process and every child it reaped) and wall seconds, its endpoints.

    ``ended``: ``(time, status, usage)`` of a run already reaped; else this waits for it."""
    if ended is None:
        _, status, usage = os.wait4(proc.pid, 0)
        ended = time.time(), status, usage
    end, status, usage = ended
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = end - began
    if proc.returncode:
        raise SystemExit(f"{out}: the run failed (rc {proc.returncode}); see {out.with_suffix('.log')}")
    rec = json.loads((out / preset / "seed0.json").read_text()) if (out / preset / "seed0.json").is_file() else \
        json.loads(next(out.glob("*/seed*.json")).read_text())
    return {"cpu": usage.ru_utime + usage.ru_stime, "wall": wall, **{k: rec[k] for k in ENDPOINTS}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old-tree", required=True, type=Path)
    parser.add_argument("--new-tree", type=Path, default=NEW_TREE, help="default: this checkout")
    parser.add_argument("--presets", nargs="+", default=["capo-nomask", "grpo"])
    parser.add_argument("--task", default="guess-half")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--val_every", type=int, default=100)
    parser.add_argument("--test_problems", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--concurrent", action="store_true", help="start every run at once")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-testbed"))
    args = parser.parse_args()
    trees = {"old": args.old_tree.resolve(), "new": args.new_tree.resolve()}
    plan = [(preset, r, name) for preset in args.presets for r in range(args.rounds) for name in ("old", "new")]
    results: dict[tuple[str, str], list[dict]] = {}
    running = []
    for preset, r, name in plan:
        out = args.out / f"{preset}-{name}-{r}"
        if out.exists():
            raise SystemExit(f"{out} exists; pass another --out (a finished run would be reused, not timed).")
        out.mkdir(parents=True)
        running.append((preset, name, out, *start(trees[name], preset, args, out)))
        if not args.concurrent:
            preset_, name_, out_, proc, began = running.pop()
            results.setdefault((preset_, name_), []).append(finish(proc, began, out_, preset_))
            print(json.dumps({"preset": preset_, "tree": name_, **results[(preset_, name_)][-1]}), flush=True)
    by_pid = {proc.pid: run for run in running for proc in [run[3]]}
    while by_pid:  # concurrent runs: each one's wall time ends when it does
        pid, status, usage = os.wait4(-1, 0)
        if pid not in by_pid:
            continue
        preset, name, out, proc, began = by_pid.pop(pid)
        results.setdefault((preset, name), []).append(finish(proc, began, out, preset, (time.time(), status, usage)))
        print(json.dumps({"preset": preset, "tree": name, **results[(preset, name)][-1]}), flush=True)
    mode = "concurrently" if args.concurrent else f"alternated old/new, {args.rounds} round(s)"
    print(f"\n{args.task}, {args.steps} steps, seed {args.seed}, test {args.test_problems} problems; runs {mode}")
    for preset in args.presets:
        old, new = results[(preset, "old")], results[(preset, "new")]
        cpu = sum(x["cpu"] for x in new) / sum(x["cpu"] for x in old)
        wall = sum(x["wall"] for x in new) / sum(x["wall"] for x in old)
        same = all(a[k] == b[k] for a, b in zip(old, new) for k in DISCRETE)
        gap = max(abs(a[k] - b[k]) for a, b in zip(old, new) for k in ENDPOINTS)
        print(f"{preset}: CPU old {[round(x['cpu']) for x in old]} s, new {[round(x['cpu']) for x in new]} s, "
              f"new/old {cpu:.3f}; wall new/old {wall:.3f}; accuracy and mean_tokens identical: {same}; "
              f"largest endpoint difference {gap:.2e}")


if __name__ == "__main__":
    main()
