"""The ``capo-trl`` command: one argparse subcommand per task.

Adding a subcommand: write ``add_<name>_parser(subparsers)``, which creates the subparser and
sets ``func`` (a ``run_<name>(args) -> int``), and append the adder to :data:`SUBCOMMANDS`.
Keep heavy work (model loading, module imports beyond the package) inside ``run_*``.
"""

from __future__ import annotations

import argparse
import sys

# ------------------------------------------------------------------------------------ eval


def add_eval_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "eval", help="sample N answers per problem; report accuracy, scaling and calibration",
        description="Sample --n completions per problem, grade them with the math reward, and write "
                    "report.json (metrics), samples.csv (one row per completion) and, with --plots, "
                    "precision-coverage and reliability PNGs to --out.",
    )
    p.add_argument("--model", required=True, help="model directory (or hub id, with network)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model's)")
    p.add_argument("--benchmark", required=True,
                   help="registered name (math500, aime24, aime25, amc23, minerva, olympiadbench, deepscaler, "
                        "arithmetic) or a local .json/.jsonl/.csv/.parquet file")
    p.add_argument("--split", default=None, help="dataset split (default: the benchmark's)")
    p.add_argument("--column", action="append", default=[], metavar="ROLE=NAME",
                   help="column mapping for the problem/answer/id roles, e.g. --column problem=question")
    p.add_argument("--template", default=None, choices=["qwen_math", "plain", "raw"],
                   help="prompt template (default: qwen_math; raw for arithmetic)")
    p.add_argument("--limit", type=int, default=None, help="evaluate the first N problems only")
    p.add_argument("--n", type=int, default=16, help="samples per problem (default 16)")
    p.add_argument("--ks", type=int, nargs="+", default=None, help="k values of pass@k / maj@k (default 1,2,4..n)")
    p.add_argument("--max-new-tokens", type=int, default=1024)
    p.add_argument("--temperature", type=float, default=1.0, help="sampling and log-prob temperature (0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 disables top-k")
    p.add_argument("--batch-size", type=int, default=64, help="sequences per generate() call")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="transformers", choices=["transformers", "vllm"])
    p.add_argument("--device", default=None, help="e.g. cuda, cuda:1, cpu (default: cuda if available)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--plots", action="store_true", help="also write PNG plots")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.set_defaults(func=run_eval)


def _columns(pairs: list[str]) -> dict[str, str] | None:
    out = {}
    for pair in pairs:
        role, sep, name = pair.partition("=")
        if not sep or not role or not name:
            raise SystemExit(f"capo-trl eval: --column expects ROLE=NAME, got {pair!r}")
        out[role] = name
    return out or None


def run_eval(args) -> int:
    from .data import BenchmarkError, load_benchmark
    from .evaluation import evaluate

    try:
        problems = load_benchmark(args.benchmark, split=args.split, limit=args.limit, columns=_columns(args.column),
                                  template=args.template)
    except BenchmarkError as err:
        print(f"capo-trl eval: {err}", file=sys.stderr)
        return 2
    result = evaluate(
        args.model, args.tokenizer, problems, n=args.n, ks=args.ks, temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
        backend=args.backend, seed=args.seed, progress=not args.no_progress, device=args.device,
    )
    paths = result.save(args.out, plots=args.plots)
    print(f"{args.benchmark}: {len(problems)} problems x {args.n} samples, temperature {args.temperature}")
    print(result.table())
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


# ------------------------------------------------------------------------------------ dispatcher

SUBCOMMANDS = [add_eval_parser]


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="capo-trl", description="Calibration-Aware Policy Optimization for TRL.")
    parser.add_argument("--version", action="version", version=f"capo-trl {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
