"""Throughput of the advantage math: capo_advantages vs grpo_advantages on 1M samples (CPU).

    python benchmarks/bench_advantages.py [--samples 1000000] [--repeats 5]
"""

import argparse
import statistics
import time

import torch

from capo_trl.advantages import capo_advantages, grpo_advantages


def median_seconds(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, samples {args.samples:,}")
    print(f"{'G':>4} {'capo samples/s':>16} {'grpo samples/s':>16} {'capo/grpo time':>15}")
    for g in (8, 64):
        n = args.samples // g * g
        rewards = (torch.rand(n) < 0.4).float()
        scores = -torch.rand(n)
        t_capo = median_seconds(lambda: capo_advantages(rewards, scores, g, tau=0.6), args.repeats)
        t_grpo = median_seconds(lambda: grpo_advantages(rewards, g), args.repeats)
        print(f"{g:>4} {n / t_capo:>16,.0f} {n / t_grpo:>16,.0f} {t_capo / t_grpo:>14.2f}x")


if __name__ == "__main__":
    main()
