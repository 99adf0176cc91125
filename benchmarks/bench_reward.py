"""Benchmark: capo_trl's MathReward vs TRL's ``trl.rewards.accuracy_reward`` (prints, not a test).

    HF_HUB_OFFLINE=1 python benchmarks/bench_reward.py [--shared ../shared/benchmarks] [--per-file 500]

Synthetic completions are built from the benchmark gold answers, each with the label a careful
grader should give: correct (boxed gold), equivalent rewrites (another notation), anchored but
unboxed, wrong, and pathological inputs that hang math-verify. TRL's reward runs in a guarded
subprocess, one item at a time with a wall-clock limit, so its hangs cannot stop this script:
an item over the limit is counted as a hang, the subprocess is killed and restarted.
Throughput is measured on the non-pathological items (ours: batch calls of ``--batch`` items, as
in a GRPO step; TRL: its in-process compute time only, which flatters TRL).
"""

import argparse
import json
import os
import random
import re
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = ["math500", "aime24", "amc23", "minerva", "olympiadbench"]
PATHOLOGICAL = [
    r"So the answer is \boxed{9^{9^{9^{9}}}}",
    r"\boxed{(10^{7})!}",
    "\\boxed{" + "\\frac{1}{" * 2500 + "2" + "}" * 2500 + "}",
    "\\[" * 10000,
    r"\boxed{\dfrac{5^{\left(5^{\left(5^{\left(5^5\right)}\right)} - 4\right)} - 5}{16}}",
]

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


def _rewrites(gold):
    """(completion, label) pairs that a correct grader scores 1.0 although the text differs."""
    g = gold.strip()
    out = []
    if re.fullmatch(r"-?\d+", g):
        n = int(g)
        out += [(rf"\boxed{{\frac{{{2 * n}}}{{2}}}}", 1.0), (rf"\boxed{{{n}.0}}", 1.0)]
    m = re.fullmatch(r"(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}", g)
    if m:
        out += [(rf"\boxed{{{m[1]}{m[2]}/{m[3]}}}", 1.0), (rf"\boxed{{{m[1]}\dfrac{{{m[2]}}}{{{m[3]}}}}}", 1.0)]
        if len(m[2]) == 1 and len(m[3]) == 1:
            out.append((rf"\boxed{{{m[1]}\frac{m[2]}{m[3]}}}", 1.0))  # \frac12: valid TeX
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*[eE]\s*([+-]?\d+)", g)
    if m:
        out.append((rf"\boxed{{{m[1]} \times 10^{{{int(m[2])}}}}}", 1.0))
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*\\times\s*10\^\{?(-?\d+)\}?", g)
    if m:
        out.append((rf"\boxed{{{m[1]}e{m[2]}}}", 1.0))
    m = re.fullmatch(r"(\d*)\\sqrt\{(\d+)\}", g)
    if m:
        out.append((rf"\boxed{{{m[1]}\sqrt {m[2]}}}" if len(m[2]) == 1 else rf"\boxed{{{m[1]} \sqrt{{{m[2]}}}}}", 1.0))
    return out


def _wrong(gold):
    g = gold.strip()
    if re.fullmatch(r"-?\d+", g):
        return rf"\boxed{{{int(g) + 1}}}"
    if re.fullmatch(r"-?\d+\.\d+", g):
        return rf"\boxed{{{float(g) * 1.5:g}}}"
    return rf"\boxed{{{g} + 1}}" if len(g) < 40 else r"\boxed{0}"


def build(shared: Path, per_file: int, seed: int = 0):
    rng = random.Random(seed)
    items = []  # (completion, gold, label, kind)
    for name in FILES:
        rows = [json.loads(line) for line in (shared / f"{name}.jsonl").open()][:per_file]
        for r in rows:
            g = r["answer"]
            items.append((f"Let me compute.\nThe answer is $\\boxed{{{g}}}$.", g, 1.0, "correct"))
            items.append((f"So the final answer is ${g}$", g, 1.0, "unboxed, anchored"))
            items.append((f"We find {_wrong(g)}.", g, 0.0, "wrong"))
            items.append((f"First guess \\boxed{{{g}}}. Wait, that is off. Final: {_wrong(g)}", g, 0.0, "wrong"))
            for c, label in _rewrites(g):
                items.append((f"Hence {c}", g, label, "equivalent rewrite"))
    rng.shuffle(items)
    patho = [(c, "3", 0.0, "pathological") for c in PATHOLOGICAL]
    return items, patho


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", type=Path, default=HERE.parents[1] / "shared" / "benchmarks")
    ap.add_argument("--per-file", type=int, default=10**9)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--timeout", type=int, default=5)
    ap.add_argument("--workers", type=int, default=None, help="our worker processes (default: CPUs)")
    ap.add_argument("--trl-limit", type=float, default=20.0, help="seconds before a TRL item counts as hung")
    ap.add_argument("--skip-trl", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from capo_trl.rewards import MathReward

    items, patho = build(args.shared, args.per_file)
    kinds = sorted({k for *_, k in items + patho})
    print(f"{len(items)} normal + {len(patho)} pathological completions; cpus={os.cpu_count()}")

    # ---- ours and TRL, interleaved chunk by chunk so both see the same machine load ------------
    ours = MathReward(timeout=args.timeout, workers=args.workers)
    ours.grade([r"\boxed{1}"], ["1"])  # start the pool (not timed)
    trl = GuardedTRL(args.trl_limit)
    our_scores, batch_lat, trl_scores, trl_dt = [], [], [], []
    for i in range(0, len(items), args.batch):
        chunk = items[i : i + args.batch]
        tb = time.perf_counter()
        our_scores += ours(completions=[c for c, *_ in chunk], answer=[g for _, g, *_ in chunk])
        batch_lat.append(time.perf_counter() - tb)
        if not args.skip_trl:
            for c, g, *_ in chunk:
                r, dt, _, hung = trl.grade(c, g)
                trl_scores.append(r)
                if not hung:
                    trl_dt.append(dt)
    our_time = sum(batch_lat)
    # per-item latency, one item per call (includes the round trip to the worker)
    item_lat = []
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
    if not args.skip_trl:
        for c, g, *_ in patho:
            r, _, wall, hung = trl.grade(c, g)
            trl_patho.append("HANG" if hung else r)
            trl_patho_wall.append(wall)
    trl.close()

    # ---- report --------------------------------------------------------------------------------
    def agree(scores, rows):
        return sum(s == lab for s, (_, _, lab, _) in zip(scores, rows))

    print(f"\n{'kind':22s} {'n':>5s} {'ours ok':>8s} {'TRL ok':>8s}")
    for k in kinds:
        idx = [i for i, it in enumerate(items) if it[3] == k]
        if k == "pathological":
            n, o, t = len(patho), agree(our_patho, patho), agree(trl_patho, patho)
        else:
            n, o = len(idx), sum(our_scores[i] == items[i][2] for i in idx)
            t = sum(trl_scores[i] == items[i][2] for i in idx) if trl_scores else 0
        print(f"{k:22s} {n:5d} {o:8d} {t:8d}")
    total = len(items) + len(patho)
    o_all = agree(our_scores, items) + agree(our_patho, patho)
    t_all = (agree(trl_scores, items) + agree(trl_patho, patho)) if trl_scores else 0
    print(f"{'all':22s} {total:5d} {o_all:8d} {t_all:8d}   (TRL None/unparseable gold: {trl_scores.count(None)})")

    our_tp = len(items) / our_time
    print(f"\nours: {our_tp:7.1f} items/s on {len(items)} normal items (batches of {args.batch}, "
          f"{ours.workers} workers, incl. IPC); batch latency p50 {pct(batch_lat, .5)*1e3:.0f} ms "
          f"p99 {pct(batch_lat, .99)*1e3:.0f} ms; single-item latency p50 {pct(item_lat, .5)*1e3:.1f} ms "
          f"p99 {pct(item_lat, .99)*1e3:.1f} ms")  # fmt: skip
    if trl_dt:
        trl_tp = len(trl_dt) / sum(trl_dt)
        print(f"TRL : {trl_tp:7.1f} items/s (one process, compute time only); item latency p50 "
              f"{statistics.median(trl_dt)*1e3:.1f} ms p99 {pct(trl_dt, .99)*1e3:.1f} ms; "
              f"hangs (> {args.trl_limit:.0f} s): {trl.hangs}")  # fmt: skip
        print(f"throughput ratio ours/TRL: {our_tp / trl_tp:.2f}")
    print(f"\npathological, one per call (timeout={args.timeout}s):")
    for c, s, lat, ts, tw in zip([p[0] for p in patho], our_patho, our_patho_lat,
                                 trl_patho or [None] * 5, trl_patho_wall or [float("nan")] * 5):  # fmt: skip
        print(f"  {c[:40]!r:44s} ours {s} in {lat:5.2f} s | TRL {ts} in {tw:5.2f} s")
    print(f"mixed batch (200 normal + 5 pathological): {mixed_time:.2f} s, normal results unchanged: {mixed_ok}")
    print(f"our counters: {stats}")


if __name__ == "__main__":
    main()
