"""evaluate(): real MATH-500 problems end to end on the tiny model, scores equal to a forward pass,
and every metric recomputed independently from the per-sample records."""

import csv
import importlib.util
import json
import math
from collections import Counter
from itertools import groupby

import matplotlib.image
import numpy as np
import pytest
import torch
from eval_helpers import DigitGrader, math500_file, one_torch_thread, shortest_math500
from sklearn.metrics import roc_auc_score
from capo_trl.testing.tiny import tiny_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from capo_trl.data.benchmarks import load_benchmark, qwen_math_prompt
from capo_trl.evaluation.evaluate import default_ks, evaluate
from capo_trl.evaluation.metrics import compute_metrics
from capo_trl.evaluation.sampling import _prompt_ids, _sample_transformers
from capo_trl.rewards import MathReward

pytestmark = pytest.mark.usefixtures("one_torch_thread")
_ = one_torch_thread  # a fixture, imported to be used by this module
PNG = b"\x89PNG\r\n\x1a\n"
METRICS = {"n_problems", "n_samples", "n_problems_ungraded", "mean@4", "mean@4_ci_low", "mean@4_ci_high",
           "pass@1", "pass@2", "pass@4", "maj@1", "maj@2", "maj@4", "pc@4", "rpc@4", "bon@4", "auroc",
           "auroc_question", "auroc_question_n", "auroc_draw", "auroc_draw_n", "ece", "brier", "aurc", "e_aurc",
           "mean_score", "mean_confidence", "mean_tokens", "finished_frac", "answered_frac"}
SAMPLE_KEYS = {"id", "draw", "completion", "extracted", "grade", "score", "num_tokens", "finished"}


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


def test_math500_end_to_end_with_math_reward(tiny_model_dir, tmp_path):
    rows = shortest_math500(5)
    problems = [{"prompt": qwen_math_prompt(r["problem"]), "answer": r["answers"], "id": r["id"]} for r in rows]
    with MathReward(workers=2) as grader:
        result = evaluate(tiny_model_dir, None, problems, n=4, max_new_tokens=12, grader=grader, progress=False)
    assert set(result.metrics) == METRICS
    assert len(result.samples) == 20 and all(set(s) == SAMPLE_KEYS for s in result.samples)
    assert [s["id"] for s in result.samples] == [r["id"] for r in rows for _ in range(4)]
    assert [s["draw"] for s in result.samples] == [0, 1, 2, 3] * 5
    grades = [s["grade"] for s in result.samples]
    assert all(g in (0.0, 1.0) for g in grades)
    assert result.metrics["mean@4"] == pytest.approx(np.mean(grades))
    assert all(s["score"] < 0 and 1 <= s["num_tokens"] <= 12 for s in result.samples)
    assert result.metrics["n_problems"] == 5 and result.metrics["n_samples"] == 20

    paths = result.save(tmp_path / "out", plots=True)
    report = json.loads(paths["report"].read_text())
    assert set(report["metrics"]) == METRICS and report["config"]["n"] == 4
    assert set(report["curves"]) == {"precision_coverage", "reliability"} and len(report["per_problem"]) == 5
    with paths["samples"].open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == 20 and float(table[0]["score"]) == pytest.approx(result.samples[0]["score"])
    for name in ("precision_coverage", "reliability"):
        assert paths[name].read_bytes()[:8] == PNG
        assert matplotlib.image.imread(paths[name]).ndim == 3
    assert "mean@4" in result.table() and "auroc" in result.table()


def test_math500_file_through_the_registry():
    ds = load_benchmark(str(math500_file()))
    assert len(ds) in (10, 500) and ds.column_names == ["prompt", "answer", "id"]


def test_scores_equal_the_trainers_temperature_scaled_forward(tiny):
    """s must be exactly what TRL computes: log_softmax(logits / T) of each sampled token, EOS included."""
    model, tok = tiny
    model.eval()
    prompts = ["what is 1?", "a much longer prompt, what is 2?"]  # different lengths: left padding
    prompt_ids = _prompt_ids(tok, prompts)
    torch.manual_seed(0)
    drawn = _sample_transformers(model, tok, prompt_ids, 3, 0.7, 1.0, 0, 10, 4, False)
    assert len(drawn) == 6
    for j, (ids, logps) in enumerate(drawn):
        assert len(ids) == len(logps) and tok.eos_token_id not in ids[:-1]
        full = torch.tensor([prompt_ids[j // 3] + ids])
        with torch.no_grad():
            logits = model(full).logits[0, len(prompt_ids[j // 3]) - 1:-1]
        expected = torch.log_softmax(logits / 0.7, dim=-1).gather(1, torch.tensor(ids)[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor(logps), expected, atol=1e-4)


def test_stub_grader_metrics_match_the_records(tiny):
    model, tok = tiny
    model.train()
    rng_before = torch.get_rng_state()
    problems = [dict(r) for r in tiny_dataset(6)]  # no ids: row numbers are used
    grader = DigitGrader()
    result = evaluate(model, tok, problems, n=8, max_new_tokens=20, grader=grader, progress=False, bootstrap=0)
    assert model.training and torch.equal(torch.get_rng_state(), rng_before)  # caller state untouched
    again = evaluate(model, tok, problems, n=8, max_new_tokens=20, grader=grader, progress=False, bootstrap=0)
    assert again.samples == result.samples  # seeded: same problems, same batches, same samples

    m, samples = result.metrics, result.samples
    grades = np.array([s["grade"] for s in samples]).reshape(6, 8)
    scores = np.array([s["score"] for s in samples]).reshape(6, 8)
    assert 0 < grades.mean() < 1, "the check needs right and wrong samples"
    assert m["mean@8"] == pytest.approx(grades.mean())
    for k in default_ks(8):
        expected = np.mean([1 - math.comb(8 - c, k) / math.comb(8, k) for c in grades.sum(1).astype(int)])
        assert m[f"pass@{k}"] == pytest.approx(expected)
    by_problem = [list(g) for _, g in groupby(samples, key=lambda s: s["id"])]
    assert [p[0]["id"] for p in by_problem] == [str(i) for i in range(6)]

    def vote_credit(recs, weight):
        totals = Counter()
        for r in recs:
            if r["extracted"] is not None:
                totals[r["extracted"]] += weight(r)
        if not totals:
            return 0.0
        best = [a for a, v in totals.items() if math.isclose(v, max(totals.values()))]
        right = {r["extracted"] for r in recs if r["grade"] == 1.0}
        return sum(a in right for a in best) / len(best)

    for k in default_ks(8):
        assert m[f"maj@{k}"] == pytest.approx(np.mean([vote_credit(p[:k], lambda r: 1.0) for p in by_problem]))

    def pc_credit(recs):
        seen, unique = set(), []
        for r in recs:
            if r["completion"] not in seen:
                seen.add(r["completion"])
                unique.append(r)
        return vote_credit(unique, lambda r: math.exp(r["score"]))

    assert m["pc@8"] == pytest.approx(np.mean([pc_credit(p) for p in by_problem]))
    y, s = grades.reshape(-1), scores.reshape(-1)
    assert m["auroc"] == pytest.approx(roc_auc_score(y, s))
    usable = [roc_auc_score(g, sc) for g, sc in zip(grades, scores) if 0 < g.sum() < len(g)]
    assert m["auroc_question_n"] == len(usable)
    if usable:
        assert m["auroc_question"] == pytest.approx(np.mean(usable))
    p = np.exp(s)
    bins = np.minimum((p * 10).astype(int), 9)
    ece = sum(abs(y[bins == b].mean() - p[bins == b].mean()) * (bins == b).mean() for b in set(bins))
    assert m["ece"] == pytest.approx(ece) and m["brier"] == pytest.approx(np.mean((p - y) ** 2))
    assert m["answered_frac"] == pytest.approx(np.mean([r["extracted"] is not None for r in samples]))
    assert [r["n_correct"] for r in result.per_problem] == grades.sum(1).astype(int).tolist()


def test_compute_metrics_leaves_out_problems_with_unparseable_gold():
    recs = []
    for pid, grades, answers in (("ok", [1.0, 0.0, 1.0, 0.0], ["2", "3", "2", None]),
                                 ("bad-gold", [None] * 4, ["5"] * 4)):
        for d, (g, a) in enumerate(zip(grades, answers)):
            recs.append({"id": pid, "draw": d, "completion": f"{pid}{d}", "extracted": a, "grade": g,
                         "score": -0.1 * (d + 1), "num_tokens": 3, "finished": True})
    m, per_problem, curves = compute_metrics(recs, 4, [1, 2, 4], lambda a, b: a == b, bootstrap=0)
    assert m["n_problems_ungraded"] == 1 and [r["id"] for r in per_problem] == ["ok"]
    assert m["mean@4"] == 0.5 and m["maj@4"] == 1.0 and m["pc@4"] == 1.0 and m["maj@2"] == 0.5
    assert m["auroc"] == pytest.approx(0.75) and m["auroc_question_n"] == 1  # scores -0.1,-0.2,-0.3,-0.4
    assert curves["precision_coverage"]["precision"][0] == 1.0


def test_input_errors_and_vllm_without_vllm(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="unique"):
        evaluate(model, tok, [{"prompt": "a", "answer": "1", "id": 1}, {"prompt": "b", "answer": "2", "id": 1}])
    with pytest.raises(ValueError, match="'answer'"):
        evaluate(model, tok, [{"prompt": "a"}])
    with pytest.raises(ValueError, match="tokenizer"):
        evaluate(model, None, [{"prompt": "a", "answer": "1"}])
    with pytest.raises(ValueError, match="k must be"):
        evaluate(model, tok, [{"prompt": "a", "answer": "1"}], n=2, ks=[4])
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ImportError, match="needs vLLM"):
            evaluate("some/path", tok, [{"prompt": "a", "answer": "1"}], backend="vllm")


def test_guess_half_evaluation_is_the_same_with_the_in_process_shortcuts():
    """The test bed's evaluation: extract and equivalent in process (fast path) give the records and metrics
    of the reference path, where every grade, extraction and comparison runs in a worker."""
    from capo_trl.data.tasks import get_task
    from capo_trl.grader import MathGrader

    task = get_task("guess-half")
    model, tok = AutoModelForCausalLM.from_pretrained(task.model_path()), AutoTokenizer.from_pretrained(task.model_path())
    problems = task.dataset("test", 12)
    results = {}
    for fast in (True, False):
        with MathGrader(timeout=5, workers=1, fast_path=fast) as grader:
            results[fast] = evaluate(model, tok, problems, n=4, max_new_tokens=48, grader=grader, seed=0,
                                     progress=False, bootstrap=0)
            if fast:
                assert grader.stats["fast_path"] > 0
    fast, full = results[True], results[False]
    assert [(s["extracted"], s["grade"], s["score"]) for s in fast.samples] == \
        [(s["extracted"], s["grade"], s["score"]) for s in full.samples]
    assert len({s["extracted"] for s in fast.samples}) > 3  # several distinct answers: equivalence was asked
    assert fast.per_problem == full.per_problem
    assert json.dumps(fast.metrics, sort_keys=True) == json.dumps(full.metrics, sort_keys=True)  # NaN-equal too
