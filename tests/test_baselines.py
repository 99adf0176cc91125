"""The comparison methods: hand-computed vectors, edge cases, a few training steps each, and compare."""

import math
import warnings

import pytest
import torch
from capo_trl.testing.tiny import build_tokenizer, digit_reward, tiny_dataset
from trl import GRPOTrainer

from capo_trl import CAPOConfig, CAPOTrainer
from capo_trl.methods import BUILTIN, DCPO, METHODS, RLCR, AdvantageInputs
from capo_trl.methods.base import Verbalized, token_start, verbalized_inputs
from capo_trl.methods.c2gspg import c2gspg_advantages, c2gspg_loss
from capo_trl.methods.cde import cde_omega, cde_rewards
from capo_trl.methods.codapo import CoDaPOReplay, codapo_replay_groups, codapo_weights
from capo_trl.methods.simko import simko_token_logps
from capo_trl.methods.verbalized import (
    dcpo_calibration_rewards,
    dcpo_token_advantages,
    parse_dcpo_confidence,
    parse_rlcr,
    rlcr_rewards,
    verbalized_calibration,
)

NAN = float("nan")
BASE = dict(output_dir="/tmp/capo-baselines-test", use_cpu=True, bf16=False, report_to="none")


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual.float(), torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0,
                               equal_nan=True)


def batch(rewards, scores=None, G=4, step=0, trl=None, **kw):
    rewards = torch.tensor(rewards, dtype=torch.float32)
    scores = torch.zeros_like(rewards) if scores is None else torch.tensor(scores, dtype=torch.float32)
    cfg = CAPOConfig(**BASE, **kw.pop("cfg", {}))
    trl = torch.zeros_like(rewards) if trl is None else torch.tensor(trl, dtype=torch.float32)
    return AdvantageInputs(rewards=rewards, scores=scores, num_generations=G, trl_advantages=trl, step=step,
                           scale_rewards="group", **kw), cfg


def estimate(name, inputs_and_config):
    """A built-in method's advantages for one batch, the method built from the batch's config."""
    inputs, cfg = inputs_and_config
    return METHODS[name](cfg).advantages(inputs)


# ---------------------------------------------------------------------------------------- Dr. GRPO
def test_dr_grpo_is_reward_minus_group_mean():
    adv, _ = estimate("dr_grpo", batch([1, 1, 0, 0, 1, NAN, 0, 0, 1, 1, 1, 1], G=4))
    close(adv, [0.5, 0.5, -0.5, -0.5, 2 / 3, 0, -1 / 3, -1 / 3, 0, 0, 0, 0])  # NaN row 0; all-correct group 0


# ---------------------------------------------------------------------------------------- CoDaPO
def test_codapo_weights_and_advantages_by_hand():
    correct = torch.tensor([1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1.0])
    scores = torch.tensor([-0.2, -0.4, -0.6, -0.8, -1, -1, -1, -1, -0.1, -0.1, -0.1, -0.1])
    # group 0: d = 0.5, d_w = 1, c = e^-0.5; group 1: d = 0.25, d_w = 0.75, c = e^-1; group 2: all correct, d_w = 0
    close(codapo_weights(correct, scores, 4), [math.exp(-0.5) + 0.1, 0.75 * math.exp(-1) + 0.1, 0.1])
    trl = [1, 1, -1, -1, 0.5, 0.5, 0.5, -1.5, 0, 0, 0, 0]
    adv, metrics = estimate("codapo", batch(correct.tolist(), scores.tolist(), trl=trl))
    w0, w1 = math.exp(-0.5) + 0.1, 0.75 * math.exp(-1) + 0.1
    close(adv, [w0, w0, -w0, -w0, 0.5 * w1, 0.5 * w1, 0.5 * w1, -1.5 * w1, 0, 0, 0, 0])
    assert metrics["codapo/weight_mean"] == pytest.approx((w0 + w1 + 0.1) / 3)


def test_codapo_nan_rewards_and_empty_group():
    w = codapo_weights(torch.tensor([1, NAN, 0, NAN, NAN, NAN]), torch.tensor([-1.0, NAN, -1, -1, -1, -1]), 3)
    # group 0: accuracy 1/2 over the scorable rows, mean score over finite ones; group 1: nothing -> offset
    close(w, [math.exp(-1) + 0.1, 0.1])


def test_codapo_replay_selection_and_refill():
    # quantile 0.75 of [5,4,3,2,1,0] is 3.75: groups 0 and 1, four groups each, cut to 6
    assert codapo_replay_groups(torch.tensor([5.0, 4, 3, 2, 1, 0]), 6) == [0, 0, 0, 0, 1, 1]
    # few selected: cycle through them until the batch is full (the released refill rule)
    assert codapo_replay_groups(torch.tensor([2.0, 1, 0, 0, 0, 0, 0, 0]), 8, repeat=1) == [0, 1] * 4
    assert codapo_replay_groups(torch.tensor([NAN, NAN]), 2) == []


def observe(replay, rewards, scores, rows):
    return replay.observe(AdvantageInputs(torch.tensor(rewards), torch.tensor(scores), 2, torch.zeros(len(rewards))),
                          rows)


def test_codapo_replay_queue_defers_instead_of_dropping():
    replay = CoDaPOReplay(num_generations=2, percentile=0.5, repeat=2)
    a = ["a0", "a0", "a1", "a1"]
    assert replay.next_batch(a) == a and not replay.replaying
    # group 0 (mixed, confident) outweighs group 1 (all wrong): replay group 0 twice
    assert observe(replay, [1.0, 0, 0, 0], [-0.1, -0.1, -0.1, -0.1], a) == {"codapo/replay_batch": 0.0,
                                                                            "codapo/selected_questions": 1.0}
    b, c = ["b0", "b0", "b1", "b1"], ["c0", "c0", "c1", "c1"]
    assert replay.next_batch(b) == ["a0", "a0", "a0", "a0"] and replay.replaying
    assert observe(replay, [1.0, 0, 1, 0], [0.0] * 4, ["a0"] * 4) == {  # replays are not replayed
        "codapo/replay_batch": 1.0, "codapo/selected_questions": 0.0}
    assert replay.next_batch(c) == b and not replay.replaying  # the deferred batch comes next, then c
    two_procs = CoDaPOReplay(num_generations=2, percentile=0.0, repeat=1)
    observe(two_procs, [1.0, 0, 1, 0], [0.0] * 4, a)
    assert two_procs.next_batch(["x", "x"], process_index=1) == ["a1", "a1"]  # each process takes its slice


# ---------------------------------------------------------------------------------------- CDE
def test_cde_staircase_schedule():
    omegas = [cde_omega(t, 0.5, 50, 4) for t in (0, 49, 50, 100, 150, 199, 200, 10_000)]
    assert omegas == pytest.approx([0.5, 0.5, 0.375, 0.25, 0.125, 0.125, 0.0, 0.0])


def test_cde_rewards_by_hand():
    # r = +-1; bonus = min(1/kappa, alpha * -s): min(0.25, 0.1) and min(0.25, 1.0)
    close(cde_rewards(torch.tensor([1.0, 0, NAN, 1]), torch.tensor([-0.2, -2.0, -1, NAN]), 0.5, 4.0, 0.5),
          [1.05, -0.875, NAN, 1.0])  # NaN reward stays NaN; no score, no bonus
    adv, metrics = estimate("cde", batch([1, 0, 1, 1], [-0.2, -2.0, -1, -1], G=4, step=200))
    assert metrics["cde/omega"] == 0.0  # annealed away: plain GRPO on +-1 rewards
    close(adv, torch.tensor([0.5, -1.5, 0.5, 0.5]) / (1.0 + 1e-4))  # group std of [1, -1, 1, 1] is 1


# ---------------------------------------------------------------------------------------- C2GSPG
def test_c2gspg_advantage_and_loss_by_hand():
    scores = torch.tensor([math.log(0.5), math.log(0.8)])
    adv = c2gspg_advantages(torch.tensor([1.0, 0]), scores, 2)
    close(adv, [0.5 / (0.5 + 1e-6), -0.5 / (0.2 + 1e-6)])
    seq = scores.clone().requires_grad_(True)
    loss, metrics = c2gspg_loss(seq, adv, torch.tensor([1.0, 0]), beta=0.01)
    per0 = math.log(0.5) * adv[0].item() + 0.01 * math.log(0.5)
    per1 = math.log(0.8) * adv[1].item() + 0.01 * math.log(0.2)
    assert loss.item() == pytest.approx(-(per0 + per1) / 2, abs=1e-6)
    loss.backward()  # d/ds log(1 - e^s) = -e^s / (1 - e^s) = -4 at C = 0.8
    close(seq.grad, [-(adv[0].item() + 0.01) / 2, -(adv[1].item() + 0.01 * -4) / 2])
    assert metrics["c2gspg/calibration_term"] == pytest.approx((math.log(0.5) + math.log(0.2)) / 2)


def test_c2gspg_edge_cases_stay_finite():
    adv = c2gspg_advantages(torch.tensor([1.0, 1, 0, NAN]), torch.tensor([0.0, -1, -1, -1]), 4)
    assert torch.isfinite(adv).all() and adv[3] == 0  # C = 1 would divide by 1e-6 only; NaN reward -> 0
    seq = torch.tensor([0.0, -1.0, NAN, -1.0], requires_grad=True)  # C = 1, ok, no tokens, NaN reward
    loss, _ = c2gspg_loss(seq, torch.ones(4), torch.tensor([1.0, 0, 1, NAN]))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(seq.grad).all() and seq.grad[2] == 0 and seq.grad[3] == 0


# ---------------------------------------------------------------------------------------- RLCR
def test_rlcr_reward_released_weights_by_hand():
    reward = rlcr_rewards(torch.tensor([1.0, 0, 1, 0, NAN]), torch.tensor([0.9, 0.9, NAN, 0.2, 0.5]),
                          torch.tensor([True, True, False, True, True]))
    close(reward, [0.5 + 0.5 + 0.5 * 0.99, 0.5 + 0.5 * 0.19, 0.0, 0.5 + 0.5 * 0.96, NAN])
    paper = rlcr_rewards(torch.tensor([1.0, 0]), torch.tensor([0.9, 0.9]), torch.tensor([True, True]), 0, 1, 1)
    close(paper - 1, [1 - 0.01, -0.81])  # c - (q - c)^2


def test_rlcr_parsing():
    good = "<think>2+2</think> <answer>4</answer>\n<analysis>easy</analysis><confidence> 0.9 </confidence>"
    assert parse_rlcr(good) == Verbalized(0.9, good.index("<confidence>"), True)
    assert parse_rlcr(good.replace("<analysis>easy</analysis>", "")).format_ok is False  # a tag missing
    assert parse_rlcr(good.replace("0.9", "1.5")) == Verbalized(None, None, False)  # q outside [0, 1]
    assert parse_rlcr("<answer>4</answer>") == Verbalized(None, None, False)  # no confidence tag
    twice = good + " <confidence>0.2</confidence>"
    assert parse_rlcr(twice).confidence == 0.2  # the last tag wins


def test_rlcr_reward_function_grades_the_answer_tag():
    from capo_trl.rewards import RLCRReward
    from capo_trl.rewards import MathReward

    texts = ["<think>t</think><answer>4</answer><analysis>a</analysis><confidence>0.8</confidence>",
             "<think>t</think><answer>5</answer><analysis>a</analysis><confidence>0.8</confidence>",
             "<answer>4</answer>"]
    with MathReward(workers=1) as grader:
        reward = RLCRReward(grader)(texts, answer=["4"] * 3)
    assert reward == pytest.approx([0.5 + 0.5 + 0.5 * (1 - 0.04), 0.5 + 0.5 * (1 - 0.64), 0.0])


# ---------------------------------------------------------------------------------------- DCPO
def test_dcpo_calibration_reward_abs_and_sq():
    correct, conf = torch.tensor([1.0, 1, 0, 0]), torch.tensor([0.9, 0.4, 0.6, NAN])
    # R_IG = 0.5 * 0.5 + 0.5 * R = [0.75, 0.75, 0.25, 0.25]; missing confidence counts as -1
    close(dcpo_calibration_rewards(correct, conf, 4, 0.5, "abs"), [-0.15, -0.35, -0.35, -1.25])
    close(dcpo_calibration_rewards(correct, conf, 4, 0.5, "sq"), [-0.0225, -0.1225, -0.1225, -1.5625])
    close(dcpo_calibration_rewards(torch.ones(2), torch.tensor([1.0, 0.5]), 2, 0.5), [0.0, -0.5])  # all correct


def test_dcpo_per_token_advantages():
    span = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 1]], dtype=torch.bool)
    close(dcpo_token_advantages(torch.tensor([1.0, -1]), torch.tensor([0.5, -0.25]), span),
          [[1, 1, 0.5, 0.5], [-1, -1, -1, -0.25]])
    adv, metrics = estimate("dcpo", batch([1, 0], G=2, confidence=torch.tensor([0.9, NAN]),
                                            format_ok=torch.tensor([True, False]), confidence_mask=span))
    a_r = 0.5 / (math.sqrt(0.5) + 1e-4)
    r_c = torch.tensor([-0.15, -1.25])  # R_IG = [0.75, 0.25]
    a_c = ((r_c - r_c.mean()) / (r_c.std() + 1e-4)).tolist()
    close(adv, [[a_r, a_r, a_c[0], a_c[0]], [-a_r, -a_r, -a_r, a_c[1]]])
    assert metrics["dcpo/format_rate"] == 0.5 and metrics["dcpo/confidence_mean"] == pytest.approx(0.9)


def test_dcpo_parsing():
    text = "3+4=7. \\boxed{7}\nCONFIDENCE: 0.75"
    assert parse_dcpo_confidence(text) == Verbalized(0.75, text.index("CONFIDENCE"), True)
    assert parse_dcpo_confidence("\\boxed{7}") == Verbalized(None, None, False)
    assert parse_dcpo_confidence("CONFIDENCE: 85").confidence is None  # not a probability
    assert parse_dcpo_confidence("CONFIDENCE: 0.2\nCONFIDENCE: .6").confidence == 0.6  # the last one


def test_token_start_maps_characters_to_tokens():
    vocab = {0: "ab", 1: "cCON", 2: "FIDENCE: 0.5", 3: "c", 4: "CONFIDENCE: 0.5"}

    def decode(ids):
        return "".join(vocab[i] for i in ids)

    assert token_start([0, 3, 4], 3, decode) == 2
    assert token_start([0, 1, 2], 3, decode) == 1  # the token holding the block's first character belongs to it
    assert token_start([0, 1, 2], 99, decode) is None


def test_verbalized_inputs_with_a_real_tokenizer_and_padding():
    tok = build_tokenizer()

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=True)

    def parse(text):  # the tiny vocabulary has no ':' : a colon-free stand-in for the DCPO line
        return Verbalized(0.5, text.index("CONF"), True) if "CONF" in text else Verbalized(None, None, False)

    texts = ["7 CONFIDENCE 0.5", "no block here", ""]
    rows = [tok.encode(t, add_special_tokens=False) for t in texts]
    assert decode(rows[0]) == texts[0]
    width = max(len(r) for r in rows) + 2
    ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    conf, ok, span = verbalized_inputs(parse, ids, mask, decode)
    close(conf, [0.5, NAN, NAN])
    assert ok.tolist() == [True, False, False]
    start = token_start(rows[0], texts[0].index("C"), decode)
    assert decode(rows[0][start:]) == "CONFIDENCE 0.5"
    assert span[0].tolist() == [False] * start + [True] * (len(rows[0]) - start) + [False] * 2
    assert span[1].nonzero().flatten().tolist() == [len(rows[1]) - 1]  # no block: the last token (released code)
    assert not span[2].any()  # empty completion: nothing


# ---------------------------------------------------------------------------------------- SimKO
def test_simko_values_unchanged_gradient_smoothed():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7, requires_grad=True)
    ids = torch.randint(0, 7, (2, 5))
    ids[1] = logits.detach()[1].argmax(-1)  # row 1 samples the argmax everywhere
    mask = torch.ones(2, 5)
    out, ent, stats = simko_token_logps(logits, ids, mask, torch.tensor([True, False]), torch.tensor([False, True]),
                                        top_k=3, alpha=0.2, quantile=0.6, neg_scale=1.5)
    logp_all = torch.log_softmax(logits, -1)
    plain = logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out, plain)  # values (hence TRL's ratio and clip) unchanged
    fork = ent.detach() > torch.quantile(ent.detach(), 0.6, dim=1, keepdim=True)
    assert fork.sum(1).tolist() == [2, 2] and stats["simko/fork_frac"] == 0.4
    top3 = logp_all.gather(-1, logits.detach().topk(3, -1).indices).mean(-1)
    w = 0.2 * fork.float() * torch.tensor([1.0, 0]).unsqueeze(1)
    scale = torch.where(fork & torch.tensor([False, True]).unsqueeze(1), 1.5, 1.0)
    expected = scale * ((1 - w) * plain + w * top3)  # the gradient SimKO asks for
    g_out, = torch.autograd.grad(out.sum(), logits, retain_graph=True)
    g_exp, = torch.autograd.grad(expected.sum(), logits)
    torch.testing.assert_close(g_out, g_exp)


# ---------------------------------------------------------------------------------------- evaluation helper
def test_verbalized_calibration_from_evaluate_records():
    samples = [{"completion": "\\boxed{1}\nCONFIDENCE: 0.9", "grade": 1.0},
               {"completion": "\\boxed{2}\nCONFIDENCE: 0.8", "grade": 0.0},
               {"completion": "\\boxed{3}\nCONFIDENCE: 0.3", "grade": 0.0},
               {"completion": "\\boxed{4}", "grade": 1.0},
               {"completion": "CONFIDENCE: 0.5", "grade": None}]  # ungraded: left out
    m = verbalized_calibration(samples)
    assert m["verbal_n"] == 3 and m["verbal_stated_frac"] == 0.75
    assert m["verbal_brier"] == pytest.approx((0.01 + 0.64 + 0.09) / 3)
    assert m["verbal_ece"] == pytest.approx((0.1 + 0.8 + 0.3) / 3)
    assert m["verbal_auroc"] == 1.0 and m["verbal_mean_confidence"] == pytest.approx(2 / 3)
    rlcr = verbalized_calibration([{"completion": "<confidence>0.4</confidence>", "grade": 1.0}], parse=parse_rlcr)
    assert rlcr["verbal_n"] == 1  # stated confidence counts even when the rest of the format fails
    assert math.isnan(verbalized_calibration([{"completion": "x", "grade": 1.0}])["verbal_ece"])


# ---------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("field, value", [
    ("codapo_percentile", 1.5), ("codapo_repeat", 0), ("codapo_replay", "yes"), ("cde_kappa", 0.0),
    ("cde_stairs", 0), ("cde_omega", -1.0), ("c2gspg_beta", NAN), ("rlcr_brier_weight", -0.5), ("dcpo_lambda", 2.0),
    ("dcpo_error", "huber"), ("simko_top_k", 0), ("simko_alpha", 1.5), ("simko_neg_scale", 0.0),
])
def test_invalid_method_fields_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        CAPOConfig(**{field: value}, **BASE)


def test_method_constraints_and_help():
    from dataclasses import fields

    with pytest.raises(ValueError, match="importance_sampling_level"):
        CAPOConfig(advantage_estimator="simko", importance_sampling_level="sequence", **BASE)
    with pytest.raises(ValueError, match="beta"):
        CAPOConfig(advantage_estimator="c2gspg", beta=0.1, **BASE)
    mine = [f for m in BUILTIN if m.Args is not None and m.name != "capo" for f in fields(m.Args)]
    assert len(mine) == 22 and all(f.metadata.get("help") for f in mine)
    assert {f.name for f in mine} <= {f.name for f in fields(CAPOConfig)}  # every one is a CAPOConfig field
    for name in ("dr_grpo", "codapo", "cde", "c2gspg", "simko", "rlcr", "dcpo", "scapo"):
        assert CAPOConfig(advantage_estimator=name, **BASE).noise_mask is False


# ---------------------------------------------------------------------------------------- training
COMMON = dict(per_device_train_batch_size=8, num_generations=4, max_completion_length=8, max_steps=3,
              learning_rate=1e-2, bf16=False, use_cpu=True, report_to="none", gradient_checkpointing=False, logging_steps=1,
              save_strategy="no", seed=7, temperature=1.0, noise_mask=False)
CAPO_METRICS = ["capo/auroc", "capo/auroc_group", "capo/mixed_group_frac", "capo/kept_frac", "capo/adv_abs_mean"]


def make(model, tmp_path, method, **overrides):
    args = CAPOConfig(output_dir=str(tmp_path), advantage_estimator=method, **{**COMMON, **overrides})
    return CAPOTrainer(model=model, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())


def logged(trainer, name):
    return [h[name] for h in trainer.state.log_history if name in h]


def train_and_check(trainer, must_change=True):
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)]
    assert (len(changed) == len(before)) if must_change else True
    for name in CAPO_METRICS:
        values = logged(trainer, name)
        assert len(values) == trainer.state.max_steps and all(v is None or math.isfinite(v) for v in values), name
    return changed


@pytest.mark.parametrize("method, metric", [
    ("dr_grpo", None), ("codapo", "codapo/weight_mean"), ("cde", "cde/omega"), ("c2gspg", "c2gspg/calibration_term"),
    ("simko", "simko/fork_frac"), ("dcpo", "dcpo/format_rate"),
])
def test_each_method_trains_and_logs_calibration(tiny_model_dir, tmp_path, method, metric):
    trainer = make(tiny_model_dir, tmp_path, method)
    train_and_check(trainer)
    assert metric is None or logged(trainer, metric)


def test_rlcr_without_the_format_gets_no_signal_and_with_it_trains(tiny_model_dir, tmp_path, monkeypatch):
    trainer = make(tiny_model_dir, tmp_path / "plain", "rlcr")
    assert train_and_check(trainer, must_change=False) == []  # a random model never writes the tags: reward 0
    assert set(logged(trainer, "rlcr/format_rate")) == {0.0}
    # pretend every completion states confidence 0.5 in the right format: now the Brier term separates them
    monkeypatch.setattr(RLCR, "parse_confidence", staticmethod(lambda text: Verbalized(0.5, 0, True)))
    trained = make(tiny_model_dir, tmp_path / "stated", "rlcr")
    train_and_check(trained)
    assert set(logged(trained, "rlcr/format_rate")) == {1.0}


def test_dcpo_sends_per_token_advantages_with_the_block_span(tiny_model_dir, tmp_path, monkeypatch):
    # every completion "states" 0.9 from its last two characters: the span covers exactly those tokens
    def stated(text):
        return Verbalized(0.9, max(0, len(text) - 2), True) if text else Verbalized(None, None, False)

    monkeypatch.setattr(DCPO, "parse_confidence", staticmethod(stated))
    trainer = make(tiny_model_dir, tmp_path, "dcpo", max_steps=2)
    seen, original = [], trainer._generate_and_score_completions

    def spy(inputs):
        out = original(inputs)
        seen.append(out)
        return out

    trainer._generate_and_score_completions = spy
    train_and_check(trainer)
    two_valued = 0
    for out in seen:
        adv, mask = out["advantages"], out["completion_mask"].bool()
        assert adv.shape == out["completion_ids"].shape
        for row, m in zip(adv, mask):
            n = int(m.sum())
            if n >= 3:  # reasoning tokens share one value, the block (its last tokens) another
                assert len(set(row[:n].tolist())) <= 2 and row[n - 2] == row[n - 1]
                two_valued += row[0] != row[n - 1]
    assert two_valued > 0


def test_simko_logps_equal_trl_values_inside_the_loss(tiny_model_dir, tmp_path):
    # every row forwarded (skipped rows hold constants: test_skipping.py checks SimKO's update with them)
    trainer = make(tiny_model_dir, tmp_path, "simko", max_steps=2, skip_zero_advantage_rows=False)
    seen, original = [], CAPOTrainer._get_per_token_logps_and_entropies

    def spy(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        out = original(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        if self._loss_inputs is not None:
            with torch.no_grad():
                ref = GRPOTrainer._get_per_token_logps_and_entropies(self, model, input_ids, attention_mask,
                                                                     logits_to_keep, compute_entropy=True)
            m = self._loss_inputs["completion_mask"].bool()
            seen.append((out[0][m].detach(), ref[0][m], out[1][m].detach(), ref[1][m]))
        return out

    trainer._get_per_token_logps_and_entropies = spy.__get__(trainer)
    train_and_check(trainer)
    assert len(seen) == 2
    for mine, theirs, ent, ent_ref in seen:
        torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(ent, ent_ref, atol=1e-4, rtol=1e-4)


def test_codapo_replay_replays_then_resumes_the_data(tiny_model_dir, tmp_path):
    def prompts_per_generation(trainer):
        seen, original = [], trainer._generate_and_score_completions

        def spy(inputs):
            seen.append([row["prompt"] for row in inputs])
            return original(inputs)

        trainer._generate_and_score_completions = spy
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train()
        return seen

    plain = prompts_per_generation(make(tiny_model_dir, tmp_path / "a", "codapo", max_steps=3))
    replay_trainer = make(tiny_model_dir, tmp_path / "b", "codapo", max_steps=3, codapo_replay=True)
    replayed = prompts_per_generation(replay_trainer)
    assert replayed[0] == plain[0]
    assert set(replayed[1]) <= set(plain[0])  # second update: the first batch's top questions again
    counts = {p: replayed[1].count(p) for p in replayed[1]}
    assert all(c % 4 == 0 for c in counts.values())  # whole groups, fresh rollouts
    assert replayed[2] == plain[1]  # the deferred batch is trained on next: no data dropped
    assert logged(replay_trainer, "codapo/replay_batch") == [0.0, 1.0, 0.0]


# ---------------------------------------------------------------------------------------- compare
@pytest.mark.slow
def test_compare_runs_every_method_on_a_tiny_budget(tiny_model_dir, tmp_path):
    from capo_trl.harness.compare import compare
    from capo_trl.harness.presets import PRESETS, Budget, parse_methods

    methods = ["gspo", "dr_grpo", "codapo", "cde", "c2gspg", "simko", "rlcr", "dcpo", "scapo"]
    assert set(methods) <= set(PRESETS)
    budget = Budget(steps=2, prompts_per_step=2, num_generations=2, learning_rate=1e-3, warmup_steps=0,
                    max_completion_length=6, train_problems=16, val_every=2, val_problems=2, val_samples=2,
                    test_problems=2, test_samples=2, model=tiny_model_dir, progress=False)
    summary = compare(parse_methods(",".join(methods)), seeds=1, out=tmp_path, budget=budget)
    assert set(methods) <= set(summary)
    assert (tmp_path / "report.md").exists()
