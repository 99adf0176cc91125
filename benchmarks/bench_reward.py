"""Benchmark: capo_trl's MathReward vs TRL's ``trl.rewards.accuracy_reward`` (prints, not a test).

    HF_HUB_OFFLINE=1 python benchmarks/bench_reward.py [--shared DIR] [--per-file 500]

Without ``--shared`` it runs on the sample shipped with the tests (``tests/data/benchmarks_sample.jsonl``,
30 rows per benchmark); ``--shared DIR`` reads the full files (``math500.jsonl``, ``aime24.jsonl``,
``amc23.jsonl``, ``minerva.jsonl``, ``olympiadbench.jsonl``, ``math_train.jsonl``) from ``DIR``.

Two workloads from the benchmark gold answers (``capo_trl.testing.reward_workloads``), each item with the
label a careful grader should give:

- mixed: every kind once per gold (correct, equivalent rewrite, anchored but unboxed, wrong,
  corrected first guess), plus pathological inputs that hang math-verify;
- GRPO-shaped: groups of 8 completions per MATH500 / MATH-train problem, about half the verbatim
  gold, a tenth another notation, the rest two wrong answers repeating within the group, a few
  hundred characters of reasoning before the box; graded in steps of 64, two epochs.

TRL's reward runs in a guarded subprocess, one item at a time with a wall-clock limit, so its
hangs cannot stop this script: an item over the limit is counted as a hang, the subprocess is
killed and restarted. Ours and TRL alternate chunk by chunk so both see the same machine load;
throughput is on the non-pathological items (ours: whole calls, IPC included; TRL: its in-process
compute time only, which flatters TRL). Every label of ours is also checked against our full
path (``fast_path=False``: every completion through math-verify in a worker).
"""

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from capo_trl.testing.reward_workloads import grpo_workload, missing_files, mixed_workload, write_sample

HERE = Path(__file__).resolve().parent
SAMPLE = HERE.parent / "tests" / "data" / "benchmarks_sample.jsonl"  # 30 rows per test benchmark

TRL_WORKER = r"""
import json, logging, sys, time
logging.disable(logging.CRITICAL)
from trl.rewards import accuracy_reward
print("ready", flush=True)
for line in sys.stdin:
    item = json.loads(line)
    t = time.perf_counter()
    r = accuracy_reward([[{"role": "assistant", "content": item["c"]}]], [item["g"]])[0]
    print(json.dumps({"r": r, "dt": time.perf_counter() - t}), flush=True)
"""


class GuardedTRL:
    """TRL's reward in a subprocess; an item over ``limit`` seconds kills and restarts it."""

    def __init__(self, limit: float):
        self.limit, self.proc, self.hangs = limit, None, 0

    def _start(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", TRL_WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, bufsize=1,
        )  # fmt: skip
        assert self.proc.stdout.readline().strip() == "ready"

    def _readline(self, limit):
        ready, _, _ = select.select([self.proc.stdout], [], [], limit)
        return self.proc.stdout.readline() if ready else None

    def grade(self, completion, gold):
        """(reward or None, compute seconds, wall seconds, hung)."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        t0 = time.perf_counter()
        self.proc.stdin.write(json.dumps({"c": completion, "g": gold}) + "\n")
        self.proc.stdin.flush()
        line = self._readline(self.limit)
        wall = time.perf_counter() - t0
        if not line:
            self.hangs += 1
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            return None, wall, wall, True
        out = json.loads(line)
        return out["r"], out["dt"], wall, False

    def close(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run_side_by_side(items, ours, trl, batch):
    """Ours in calls of ``batch`` items and TRL item by item, alternating; (our scores, call seconds,
    TRL scores, TRL compute seconds per item)."""
    our_scores, lat, trl_scores, trl_dt = [], [], [], []
    for i in range(0, len(items), batch):
        chunk = items[i : i + batch]
        tb = time.perf_counter()
        our_scores += ours(completions=[c for c, *_ in chunk], answer=[g for _, g, *_ in chunk])
        lat.append(time.perf_counter() - tb)
        if trl is not None:
            for c, g, *_ in chunk:
                r, dt, _, hung = trl.grade(c, g)
                trl_scores.append(r)
                if not hung:
                    trl_dt.append(dt)
    return our_scores, lat, trl_scores, trl_dt


def agreement_table(items, ours, trl_scores):
    kinds = sorted({k for *_, k in items})
    print(f"{'kind':22s} {'n':>5s} {'ours ok':>8s} {'TRL ok':>8s}")
    for k in kinds:
        idx = [i for i, it in enumerate(items) if it[3] == k]
        o = sum(ours[i] == items[i][2] for i in idx)
        t = sum(trl_scores[i] == items[i][2] for i in idx) if trl_scores else 0
        print(f"{k:22s} {len(idx):5d} {o:8d} {t:8d}")


def identical_to_full_path(name, items, ours_scores, args):
    """Every label of ours against the full path (no shortcut, no dedup, no cache)."""
    from capo_trl.rewards import MathReward

    with MathReward(timeout=args.timeout, workers=args.workers, fast_path=False) as full:
        tb = time.perf_counter()
        ref = []
        for i in range(0, len(items), args.batch):
            chunk = items[i : i + args.batch]
            ref += full.grade([c for c, *_ in chunk], [g for _, g, *_ in chunk])
        dt = time.perf_counter() - tb
    diff = [(items[i][0][-80:], items[i][1], ours_scores[i], ref[i]) for i in range(len(items)) if ours_scores[i] != ref[i]]
    print(f"{name}: labels identical to the full path on {len(items) - len(diff)}/{len(items)} items "
          f"(full path {len(items) / dt:.1f} items/s)")
    for d in diff[:10]:
        print("   DIFFERS", d)
    return len(diff)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", type=Path, default=None,
                    help="folder of the benchmark .jsonl files (default: the sample shipped with the tests)")
    ap.add_argument("--per-file", type=int, default=None, help="mixed workload: golds per benchmark file")
    ap.add_argument("--problems", type=int, default=512, help="GRPO workload: problems per epoch")
    ap.add_argument("--epochs", type=int, default=2, help="GRPO workload: passes over the problems")
    ap.add_argument("--batch", type=int, default=64, help="items per call (a GRPO step: 8 prompts x 8)")
    ap.add_argument("--timeout", type=int, default=5)
    ap.add_argument("--workers", type=int, default=None, help="our worker processes (default: CPUs)")
    ap.add_argument("--trl-limit", type=float, default=20.0, help="seconds before a TRL item counts as hung")
    ap.add_argument("--skip-trl", action="store_true")
    ap.add_argument("--skip-mixed", action="store_true")
    ap.add_argument("--skip-full", action="store_true", help="skip the label check against the full path")
    args = ap.parse_args()
    if args.shared is None:
        scratch = tempfile.TemporaryDirectory(prefix="bench_reward_")  # removed when the script ends
        args.shared = write_sample(Path(scratch.name), SAMPLE)
        print(f"data: the sample in tests/data (no --shared given), split into {args.shared}")
    elif missing := missing_files(args.shared):
        ap.error(f"--shared {args.shared} lacks {', '.join(missing)}: pass the folder that holds the benchmark files")
    else:
        print(f"data: {args.shared}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from capo_trl.rewards import MathReward

    print(f"cpus={os.cpu_count()}, batch {args.batch}, timeout {args.timeout} s")
    trl = None if args.skip_trl else GuardedTRL(args.trl_limit)
    ratios, differ = {}, 0

    # ---- GRPO-shaped ---------------------------------------------------------------------------
    grpo = grpo_workload(args.shared, args.problems, epochs=args.epochs)
    per_epoch = len(grpo) // args.epochs
    print(f"\n== GRPO-shaped: {args.problems} problems x 8 completions x {args.epochs} epochs = {len(grpo)} items")
    with MathReward(timeout=args.timeout, workers=args.workers) as ours:
        ours.grade([r"\boxed{x+1}"], ["1+x"])  # start the pool (not timed: a worker must grade it)
        scores, lat, trl_scores, trl_dt = run_side_by_side(grpo, ours, trl, args.batch)
        stats = ours.stats
    steps = per_epoch // args.batch
    agreement_table(grpo, scores, trl_scores)
    tp = len(grpo) / sum(lat)
    ep = [per_epoch / sum(lat[e * steps : (e + 1) * steps]) for e in range(args.epochs)]
    print(f"ours: {tp:7.1f} items/s ({', '.join(f'epoch {e + 1}: {v:.1f}' for e, v in enumerate(ep))}); "
          f"step latency p50 {pct(lat, .5) * 1e3:.0f} ms p99 {pct(lat, .99) * 1e3:.0f} ms")
    print(f"      settled by shortcut {stats['fast_path']}, cache {stats['cached']}, shared within a call "
          f"{stats['deduplicated']}; {stats['worker_tasks']} worker round trips for {stats['graded']} items")
    if trl_dt:
        trl_tp = len(trl_dt) / sum(trl_dt)
        ratios["GRPO-shaped"] = tp / trl_tp
        ratios["GRPO-shaped, first epoch only"] = ep[0] / trl_tp
        print(f"TRL : {trl_tp:7.1f} items/s (compute time only); hangs: {trl.hangs}")
        print(f"throughput ratio ours/TRL (GRPO-shaped): {tp / trl_tp:.2f}  (first epoch alone: {ep[0] / trl_tp:.2f})")
    if not args.skip_full:
        differ += identical_to_full_path("GRPO-shaped", grpo, scores, args)

    if args.skip_mixed:
        return summary(ratios, differ, trl)

    # ---- mixed ---------------------------------------------------------------------------------
    items, patho = mixed_workload(args.shared, args.per_file)
    print(f"\n== mixed: {len(items)} normal + {len(patho)} pathological completions")
    ours = MathReward(timeout=args.timeout, workers=args.workers)
    ours.grade([r"\boxed{x+1}"], ["1+x"])
    our_scores, batch_lat, trl_scores, trl_dt = run_side_by_side(items, ours, trl, args.batch)
    our_time = sum(batch_lat)
    item_lat = []  # per-item latency, one item per call (includes the round trip to the worker)
    for c, g, *_ in items[:300]:
        tb = time.perf_counter()
        ours.grade([c], [g])
        item_lat.append(time.perf_counter() - tb)
    our_patho, our_patho_lat = [], []
    for c, g, *_ in patho:
        tb = time.perf_counter()
        our_patho += ours.grade([c], [g])
        our_patho_lat.append(time.perf_counter() - tb)
    tb = time.perf_counter()
    mixed = items[:200] + patho
    mixed_out = ours.grade([c for c, *_ in mixed], [g for _, g, *_ in mixed])
    mixed_time = time.perf_counter() - tb
    mixed_ok = mixed_out[:200] == our_scores[:200]
    stats = ours.stats
    ours.close()
    trl_patho, trl_patho_wall = [], []
    if trl is not None:
        for c, g, *_ in patho:
            r, _, wall, hung = trl.grade(c, g)
            trl_patho.append("HANG" if hung else r)
            trl_patho_wall.append(wall)
    agreement_table(items, our_scores, trl_scores)
    o = sum(s == lab for s, (_, _, lab, _) in zip(our_patho, patho))
    t = sum(s == lab for s, (_, _, lab, _) in zip(trl_patho, patho))
    print(f"{'pathological':22s} {len(patho):5d} {o:8d} {t:8d}")
    our_tp = len(items) / our_time
    print(f"ours: {our_tp:7.1f} items/s on {len(items)} normal items (calls of {args.batch}, {ours.workers} "
          f"workers, incl. IPC); call latency p50 {pct(batch_lat, .5)*1e3:.0f} ms p99 {pct(batch_lat, .99)*1e3:.0f} ms; "
          f"single-item latency p50 {pct(item_lat, .5)*1e3:.1f} ms p99 {pct(item_lat, .99)*1e3:.1f} ms")  # fmt: skip
    if trl_dt:
        trl_tp = len(trl_dt) / sum(trl_dt)
        ratios["mixed"] = our_tp / trl_tp
        print(f"TRL : {trl_tp:7.1f} items/s (one process, compute time only); item latency p50 "
              f"{statistics.median(trl_dt)*1e3:.1f} ms p99 {pct(trl_dt, .99)*1e3:.1f} ms; hangs (> {args.trl_limit:.0f} s): "
              f"{trl.hangs}")  # fmt: skip
        print(f"throughput ratio ours/TRL (mixed): {our_tp / trl_tp:.2f}")
    print(f"\npathological, one per call (timeout={args.timeout}s):")
    for c, s, lat, ts, tw in zip([p[0] for p in patho], our_patho, our_patho_lat,
                                 trl_patho or [None] * 5, trl_patho_wall or [float("nan")] * 5):  # fmt: skip
        print(f"  {c[:40]!r:44s} ours {s} in {lat:5.2f} s | TRL {ts} in {tw:5.2f} s")
    print(f"mixed call (200 normal + 5 pathological): {mixed_time:.2f} s, normal results unchanged: {mixed_ok}")
    print(f"our counters: {stats}")
    if not args.skip_full:
        differ += identical_to_full_path("mixed", items, our_scores, args)
    summary(ratios, differ, trl)


def summary(ratios, differ, trl):
    if trl is not None:
        trl.close()
    print("\n== summary")
    for name, r in ratios.items():
        print(f"throughput ours/TRL, {name}: {r:.2f}x")
    print(f"labels differing from the full path: {differ}")


if __name__ == "__main__":
    main()
