"""CAPO's answer score (``score_span='answer'``): where the math reward reads an answer, its tokens, the
advantage over them, and the trainer glue; and the signals of a drift into completions that never end."""

import logging
import math

import pytest
import torch
from capo_trl.testing.tiny import tiny_dataset

from capo_trl import CAPOConfig, CAPOTrainer
from capo_trl.advantages import capo_advantages, grpo_advantages
from capo_trl.errors import UsageError
from capo_trl.grader.normalize import answer_span
from capo_trl.methods import AdvantageInputs, resolve_method
from capo_trl.rewards import MathReward, math_accuracy_reward
from capo_trl.training.answers import answer_token_mask, checked_spans, span_source
from capo_trl.training.monitor import DriftWatch, replay_drift, truncated_share

COMMON = dict(per_device_train_batch_size=8, num_generations=4, max_completion_length=8, max_steps=2,
              learning_rate=1e-2, bf16=False, use_cpu=True, report_to="none", logging_steps=1, save_strategy="no",
              seed=7, noise_mask=False)


@pytest.mark.parametrize("text, answer", [
    ("63 + 92 = 155, so the result is \\boxed{155}.", "155"),
    ("23 + 45 = 68. The answer is \\boxed{ 68 }.", "68"),
    ("\\boxed{7} wait, no: \\boxed{8}", "8"),  # the last run of boxes, as the grader reads it
    ("$\\boxed{2}$ and $\\boxed{3}$", "2}$ and $\\boxed{3"),  # one answer written in two boxes: the whole run
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    (" -3.5. ", "-3.5"),  # a completion that is only a number
    ("I think 54", None), ("\\boxed{}", None), ("", None),
])
def test_answer_span_is_what_the_grader_reads(text, answer):
    span = answer_span(text)
    assert (None if span is None else text[span[0]:span[1]]) == answer


def test_math_reward_spans_fall_back_on_math_verify_extraction():
    """An answer without a box is found where math-verify's extraction reads it; no answer gives None."""
    texts = ["So the final answer is 42.", "The answer is \\boxed{12}.", "no answer at all", "x"]
    spans = math_accuracy_reward.answer_spans(texts)
    assert [None if s is None else t[s[0]:s[1]] for t, s in zip(texts, spans)] == ["42", "12", None, None]
    assert MathReward(workers=1).answer_spans(completions=[[{"role": "assistant", "content": texts[1]}]]) == [(21, 23)]


def test_answer_tokens_cover_every_token_the_answer_touches():
    """Tokens are found by decoding prefixes, so one that straddles the answer's first or last character counts."""
    vocab = ["The", " answer", " is", " \\boxed{4", "2", "}.", " more"]
    decode = lambda ids: "".join(vocab[i] for i in ids)  # noqa: E731
    ids = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5, 6]])
    text = decode(ids[0].tolist())
    mask = answer_token_mask(ids, [7, 6], [answer_span(text), None], decode)
    assert mask[0].tolist() == [False, False, False, True, True, False, False]  # "4" shares a token with \boxed{
    assert not mask[1].any()


@pytest.mark.parametrize("spans, match", [
    ([(0, 3)], "returned 1 spans for 2"), ([(0, 3), (2, 2)], r"gave \(2, 2\)"), ([(0, 3), (0, 99)], "gave"),
    ([(0, 3), "0-2"], "gave"), (None, "returned None"),
])
def test_bad_spans_name_the_reward_and_the_fix(spans, match):
    with pytest.raises(UsageError, match=match):
        checked_spans(spans, ["abcd", "efgh"], "mine")
    assert checked_spans([(0, 3), None], ["abcd", "efgh"], "mine") == [(0, 3), None]


def test_a_reward_without_spans_is_refused_before_the_model_loads(tmp_path):
    assert span_source([len, math_accuracy_reward], ["len", "math_accuracy_reward"])[1] == "math_accuracy_reward"
    args = CAPOConfig(output_dir=str(tmp_path), **COMMON, score_span="answer")
    with pytest.raises(UsageError, match="score_span='answer'.*answer_spans"):
        CAPOTrainer(model="no/such-model", reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                    args=args, train_dataset=tiny_dataset())


def _capo(**fields):
    config = CAPOConfig(output_dir="unused", use_cpu=True, report_to="none", noise_mask=False, tau=0.6,
                        tau_mode="absolute", advantage_scale="paper", **fields)  # the paper's advantage, written out
    return resolve_method("capo")(config)


def test_answer_scores_rank_and_rows_without_an_answer_tie():
    """CAPO ranks the answer scores; a row with no answer (NaN) is credited by its reward alone, as a tied row."""
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    scores = torch.tensor([-0.1, -0.9, -0.4, -2.0])
    answers = torch.tensor([-0.3, -0.2, -0.5, float("nan")])
    batch = AdvantageInputs(rewards=rewards, scores=scores, num_generations=4, trl_advantages=torch.zeros(4),
                            answer_scores=answers)
    got, _ = _capo(score_span="answer").advantages(batch)
    filled = torch.tensor([-0.3, -0.2, -0.5, -2.0])
    expected = capo_advantages(rewards, filled, 4, 0.6, tied=torch.tensor([False, False, False, True]))
    torch.testing.assert_close(got, expected)
    paper, _ = _capo().advantages(batch)  # the paper's score over the whole completion is score_span's default
    torch.testing.assert_close(paper, capo_advantages(rewards, scores, 4, 0.6))
    with pytest.raises(ValueError, match="answer_scores"):
        _capo(score_span="answer").advantages(AdvantageInputs(rewards=rewards, scores=scores, num_generations=4,
                                                              trl_advantages=torch.zeros(4)))


def _trained(tmp_path, spans, **fields):
    """Two steps on the tiny model with a reward whose spans come from ``spans``: the batches CAPO saw, and per
    batch the completion ids, token log-probs and score mask the trainer scored."""
    def reward(completions, answer, **kwargs):
        return [float(a in c) for c, a in zip(completions, answer)]

    reward.answer_spans = lambda completions, answer, **kw: [spans(c, a) for c, a in zip(completions, answer)]
    args = CAPOConfig(output_dir=str(tmp_path), **{**COMMON, **fields})
    trainer = CAPOTrainer(model=str(tmp_path.parent / "model"), reward_funcs=reward, args=args,
                          train_dataset=tiny_dataset())
    seen, scored, advantages, token_logps = [], [], trainer.method.advantages, trainer._rollout_token_logps
    trainer.method.advantages = lambda batch: (seen.append(batch), advantages(batch))[1]
    trainer._rollout_token_logps = lambda out, *a: (lambda r: (scored.append((out["completion_ids"], *r)), r)[1])(
        token_logps(out, *a))
    trainer.train()
    return trainer, seen, scored


@pytest.fixture
def model_here(tiny_model_dir, tmp_path):
    (tmp_path / "model").symlink_to(tiny_model_dir)
    (tmp_path / "run").mkdir()
    return tmp_path / "run"


def test_trainer_scores_the_answer_tokens(model_here):
    """A span of the whole text covers the tokens from the first to the last that the text shows (decoding skips
    EOS and the other special tokens, so a trailing EOS is out, one inside the span in); no span anywhere gives
    NaN; the paper's score asks for no span."""
    trainer, seen, scored = _trained(model_here, lambda c, a: (0, len(c)) if c else None, score_span="answer")
    special = torch.tensor(trainer.processing_class.all_special_ids)
    for batch, (ids, per_token, score_mask) in zip(seen, scored):
        shown = ((score_mask > 0) & ~torch.isin(ids, special)).float()
        position = torch.arange(ids.size(1)).float()
        first = torch.where(shown > 0, position, float("inf")).amin(1, keepdim=True)
        last = torch.where(shown > 0, position, -1.0).amax(1, keepdim=True)
        inside = ((position >= first) & (position <= last)).float()
        expected = (per_token * inside).sum(1) / inside.sum(1)
        torch.testing.assert_close(batch.answer_scores, expected, rtol=0, atol=1e-6, equal_nan=True)
    assert any(bool((batch.answer_scores != batch.scores).any()) for batch in seen)  # EOS left out somewhere
    _, none, _ = _trained(model_here, lambda c, a: None, score_span="answer")
    assert all(bool(torch.isnan(batch.answer_scores).all()) for batch in none)
    _, off, _ = _trained(model_here, lambda c, a: None)
    assert all(batch.answer_scores is None for batch in off)


def test_one_character_span_scores_one_token(model_here):
    """The tiny tokenizer is one token per character: a one-character answer's score is that token's log-prob."""
    _, seen, scored = _trained(model_here, lambda c, a: (c.find(a), c.find(a) + 1) if a in c else None,
                               score_span="answer")
    found = torch.cat([b.answer_scores for b in seen])
    hits = torch.cat([b.rewards for b in seen]) > 0.5
    assert torch.equal(torch.isfinite(found), hits) and bool(hits.any())
    token_logps = torch.cat([per_token[mask > 0] for _, per_token, mask in scored])
    assert all(bool(torch.isclose(token_logps, v, atol=1e-6).any()) for v in found[hits])


def test_truncated_share_is_scale_free():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    truncated = torch.tensor([False, False, False, True, False, False, True, True])
    grpo = grpo_advantages(rewards, 4)
    share = truncated_share(grpo, truncated, rewards)
    expected = (grpo[truncated].sum() / grpo.abs().sum()).item()
    assert share == pytest.approx(expected) and share < 0
    assert truncated_share(3 * grpo, truncated, rewards) == pytest.approx(share)  # a larger step, the same push
    assert truncated_share(torch.where(truncated, 0.0, grpo), truncated, rewards) == 0.0
    assert truncated_share(torch.zeros(8), truncated, rewards) == 0.0  # nothing has an advantage


W = 10


@pytest.mark.parametrize("clipped, answered, share, fires_at", [
    ([0.05] * 15 + [0.2] * 10, [0.0] * 25, -0.01, 19),  # the clipped ratio doubles above 0.1: warned once
    ([0.05] * 15 + [0.2] * 10, [0.0] * 25, -0.1, None),  # ... while pushing back as GRPO does (share = GRPO's)
    ([0.05] * 25, [0.0] * 15 + [0.03] * 10, -0.01, 21),  # right answers that kept writing (7 of 10 steps): warned
    ([0.05] * 25, [0.0] * 15 + [0.015] * 10, -0.01, None),  # too few of them
    ([0.08] * 10 + [0.12] * 15, [0.0] * 25, -0.01, None),  # not twice the start
    ([0.0] * 10 + [0.09] * 15, [0.0] * 25, -0.01, None),  # below the floor of 0.1
])
def test_drift_rule(clipped, answered, share, fires_at):
    watch = DriftWatch(window=W)
    fired = [step for step, (c, a) in enumerate(zip(clipped, answered))
             if watch.observe(step, c, a, share, -0.1, "x") is not None]
    assert fired == ([] if fires_at is None else [fires_at])


def test_push_sums_the_window_before_dividing():
    """One step where GRPO's share is tiny does not make the push explode: the window's sums are divided."""
    watch = DriftWatch(window=2)
    watch.observe(0, 0.1, 0.0, -0.05, -0.1, "x")
    watch.observe(1, 0.1, 0.0, 0.02, -0.0001, "x")
    assert watch.push() == pytest.approx(-0.03 / -0.1001)
    watch.observe(2, 0.1, 0.0, 0.0, 0.0, "x")
    watch.observe(3, 0.1, 0.0, 0.0, 0.0, "x")
    assert math.isnan(watch.push())  # GRPO pushed none: no yardstick


def test_replay_counts_each_log_for_the_steps_it_averages():
    """Logged 5-step means replay as 5 steps each: the rule (its 10-step window, from the 20th step) holds within
    the first log whose steps make it hold and counts at that log; a push as strong as GRPO's, or logs without the
    clipped ratio, never warn."""
    def logs(share):
        return [{"step": 5 * (i + 1), "completions/clipped_ratio": c, "capo/truncated_adv_share": share,
                 "capo/truncated_adv_share_grpo": -0.2} for i, c in enumerate([0.02] * 4 + [0.3] * 4)]
    assert replay_drift(logs(-0.02)) == 25  # at step 23 the last 10 average 0.10; push 0.1 of GRPO's
    assert replay_drift(logs(-0.2)) is None  # GRPO's own push
    assert replay_drift([{"step": 5, "loss": 1.0}] * 9) is None
    # a log without the push counts as none: the rule is left with its first half
    assert replay_drift([{k: v for k, v in x.items() if "share" not in k} for x in logs(-0.2)]) == 25


def test_trainer_logs_the_drift_signals(tiny_model_dir, tmp_path, caplog):
    """Under GRPO the method's share is GRPO's own; the warning names the settings to change. The reward pays
    completions that end (shorter than the limit), so the truncated ones are wrong and GRPO pushes."""
    args = CAPOConfig(output_dir=str(tmp_path), **{**COMMON, "max_steps": 3}, advantage_estimator="grpo")
    trainer = CAPOTrainer(model=tiny_model_dir, reward_funcs=lambda completions, **kw: [
        float(len(c) < 8) for c in completions], args=args, train_dataset=tiny_dataset())
    trainer._drift = DriftWatch(window=1, min_clipped=0.0, rise=0.0, max_push=2.0)  # fires at the 2nd step
    with caplog.at_level(logging.WARNING, logger="capo_trl.training.trainer"):
        trainer.train()
    logs = [h for h in trainer.state.log_history if "capo/truncated_adv_share" in h]
    assert len(logs) == 3 and all("capo/answered_truncated_frac" in h for h in logs)
    assert all(h["capo/truncated_adv_share"] == h["capo/truncated_adv_share_grpo"] for h in logs)
    assert any(h["capo/truncated_adv_share_grpo"] < 0 for h in logs[:2])
    hits = [r.getMessage() for r in caplog.records if "capo/truncated_adv_share" in r.getMessage()]
    assert len(hits) == 1 and "score_span='answer'" in hits[0] and "truncated_pairs='tied'" in hits[0]
