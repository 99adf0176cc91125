"""`capo-trl calibrate-mask`: measure tau and the noise-mask thresholds for a reference model, and write
them into a YAML recipe line by line (comments, order and layout kept)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
import yaml

from ..advantages import quartile_thresholds, within_group_std
from ..evaluation.calibration import auroc
from ..training.defaults import RECOMMENDED
from ..training.consistency import overlap_warning
from ..errors import UsageError
from .presets import is_number


def calibrate_mask(model, tokenizer, problems, n: int = 8, max_new_tokens: int = 1024,
                   correct_threshold: float = 0.5, **evaluate_kwargs) -> dict:
    """Measure CAPO's settings for a reference model on its own samples of training prompts.

    The reference samples at temperature 1, so ``exp(-s)`` of each sample *is* its reference
    perplexity: ``ref_high`` / ``ref_low`` follow the paper's quartile rule; ``tau`` is the pooled
    within-group spread of ``s`` (the natural unit of the surrogate); the reference's own AUROC
    says whether it is calibrated enough for the mask to mean anything.
    """
    from ..evaluation.evaluate import evaluate

    result = evaluate(model, tokenizer, problems, n=n, max_new_tokens=max_new_tokens, temperature=1.0,
                      **evaluate_kwargs)
    samples = sorted(result.samples, key=lambda r: (str(r["id"]), r["draw"]))
    grades = torch.tensor([np.nan if r["grade"] is None else r["grade"] for r in samples], dtype=torch.float32)
    scores = torch.tensor([r["score"] for r in samples], dtype=torch.float32)
    ppl = torch.exp(-scores)
    ref_high, ref_low = quartile_thresholds(grades, ppl, correct_threshold)
    spread = within_group_std(grades, scores, n).item()
    correct = (grades >= correct_threshold).numpy()
    groups = grades.reshape(-1, n)
    mixed = int(((groups >= correct_threshold).any(1) & (groups < correct_threshold).any(1)).sum())
    return {
        "ref_high": ref_high, "ref_low": ref_low, "tau": spread, "score_spread": spread,
        "reference_auroc": auroc(scores.numpy(), correct), "reference_accuracy": float(np.nanmean(grades.numpy())),
        "ppl_correct_quartiles": _quartiles(ppl[grades >= correct_threshold]),
        "ppl_wrong_quartiles": _quartiles(ppl[grades < correct_threshold]),
        "n_problems": len(problems), "n_samples": len(samples), "mixed_groups": mixed,
    }


def unmeasured(report: dict) -> list[str]:
    """Why :func:`calibrate_mask`'s ``tau``, ``ref_high`` or ``ref_low`` cannot be used (empty: all can).

    A value that is NaN (a class absent from the sample, no mixed group) or zero spread must never
    reach a config: CAPOConfig refuses it, or worse, it silently disables the mask.
    """
    reasons = []
    accuracy = report.get("reference_accuracy")
    acc = f" (reference accuracy {accuracy:.3f})" if is_number(accuracy) else ""
    if not is_number(report.get("ref_high")):
        reasons.append(f"ref_high not measured: no correct answers in the sample{acc}; raise --limit or --n, or check "
                       "that the --benchmark answers are graded right.")
    if not is_number(report.get("ref_low")):
        reasons.append(f"ref_low not measured: no wrong answers in the sample{acc}; raise --limit or --n, or use "
                       "harder prompts.")
    tau = report.get("tau")
    if not is_number(tau):
        reasons.append(f"tau not measured: no group has both right and wrong answers ({report.get('mixed_groups', 0)} "
                       f"of {report.get('n_problems', '?')} prompts); raise --limit or --n.")
    elif tau <= 0:
        reasons.append("tau not measured: the scores do not vary within groups (spread 0); raise --limit or --n, or "
                       "check that the model samples (temperature 1).")
    return reasons


def caveats(report: dict) -> list[str]:
    """What a user should know before training with :func:`calibrate_mask`'s thresholds (they are usable)."""
    high, low = report.get("ref_high"), report.get("ref_low")
    if is_number(high) and is_number(low) and low > high:
        return [overlap_warning(high, low, "the quartile rule on this sample")]
    return []


def recipe_values(report: dict) -> dict:
    """What ``--write_config`` sets: the recommended configuration's CAPO fields, with this model's measured
    thresholds in place of the paper's values, and its measured ``tau`` (the within-group spread, in nats) where the
    recommendation's tau is absolute (a relative tau is already in units of the spread).

    ``advantage_estimator`` and ``noise_mask`` are left as the recipe has them (unset, the mask is on for CAPO
    and off for GRPO), so a GRPO twin of the recipe stays plain GRPO.
    """
    values = {k: v for k, v in RECOMMENDED.items() if k not in ("advantage_estimator", "noise_mask")}
    values.update(ref_high=float(f"{report['ref_high']:.6g}"), ref_low=float(f"{report['ref_low']:.6g}"))
    if values["tau_mode"] == "absolute":
        values["tau"] = float(f"{report['tau']:.6g}")
    return values


def read_recipe(path, flag: str = "--write_config") -> str:
    """The text of a YAML recipe that :func:`update_recipe` can edit ('' for a new file); else a UsageError."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a directory; give a YAML file.")
    if not path.exists():
        if not path.parent.is_dir():
            raise UsageError(f"{flag} {path}: the directory {path.parent} does not exist; create it or give another "
                             "path.")
        return ""
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except OSError as err:
        raise UsageError(f"{flag} {path}: cannot read it ({err.strerror}).") from err
    except UnicodeDecodeError as err:
        raise UsageError(f"{flag} {path} is not UTF-8 text ({err.reason}); give a YAML recipe.") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{flag} {path} is not valid YAML{where} ({getattr(err, 'problem', None) or err}); fix "
                         "it or give another file.") from err
    if data is not None and not isinstance(data, dict):
        raise UsageError(f"{flag} {path} holds a YAML {type(data).__name__}, not a mapping of config fields "
                         "(key: value lines); give a recipe such as examples/recipes/capo-arith-tiny-cpu.yaml.")
    return text


_TOP_LEVEL_KEY = re.compile(r"^(?P<key>[A-Za-z_][\w.-]*)(?P<sep>[ \t]*:(?:[ \t]+|$))(?P<value>.*?)"
                            r"(?P<comment>[ \t]+#.*)?$")


def _yaml_scalar(value) -> str:
    return yaml.safe_dump(value).splitlines()[0]  # 1e-07 -> 1.0e-07: PyYAML reads a float only with a dot


def update_recipe(text: str, values: dict, path="recipe") -> str:
    """``text`` with each ``key: value`` line of ``values`` rewritten in place, missing keys appended.

    Only top-level ``key: value`` lines change; comments (trailing ones included), order and
    layout stay. The result is parsed again: if it is not a mapping holding exactly the new
    values (a key written as a block, a flow mapping, several documents), a UsageError says so
    and nothing is to be written.
    """
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = text.splitlines(keepends=True)
    found = set()
    for i, line in enumerate(lines):
        body = line.rstrip("\r\n")
        match = _TOP_LEVEL_KEY.match(body)
        if match and match["key"] in values:
            sep = match["sep"] if match["sep"][-1:] in (" ", "\t") else match["sep"] + " "
            lines[i] = f"{match['key']}{sep}{_yaml_scalar(values[match['key']])}{match['comment'] or ''}" \
                       f"{line[len(body):]}"
            found.add(match["key"])
    missing = [key for key in values if key not in found]
    if missing:
        if lines and not lines[-1].endswith(("\n", "\r")):
            lines[-1] += newline
        lines.append(f"# measured by capo-trl calibrate-mask{newline}")
        lines += [f"{key}: {_yaml_scalar(values[key])}{newline}" for key in missing]
    result = "".join(lines)
    try:
        parsed = yaml.safe_load(result)
    except yaml.YAMLError:
        parsed = None
    if not isinstance(parsed, dict) or any(parsed.get(k) != v for k, v in values.items()):
        wanted = ", ".join(f"{k}: {_yaml_scalar(v)}" for k, v in values.items())
        raise UsageError(f"{path}: could not set {', '.join(values)} line by line (the file writes one of them in a "
                         f"form this edit does not handle); nothing written. Set them by hand: {wanted}.")
    return result


def _quartiles(x: torch.Tensor) -> list[float] | None:
    if x.numel() == 0:
        return None
    return [torch.quantile(x.double(), q).item() for q in (0.25, 0.5, 0.75)]


__all__ = ["calibrate_mask", "caveats", "read_recipe", "recipe_values", "unmeasured", "update_recipe"]
