"""The screening pilot's drift block (docs/results/smollm2-screen/README.md): per finished run, when the trainer's
drift rule holds (replayed from its logged means) against when every completion first ran to the limit."""

import dataclasses
import json

from script_loader import load_script


def log(step, clipped, share, grpo=-0.2, answered=0.0):
    return {"step": step, "completions/clipped_ratio": clipped, "capo/truncated_adv_share": share,
            "capo/truncated_adv_share_grpo": grpo, "capo/answered_truncated_frac": answered, "grad_norm": 0.1}


def drift_block(tmp_path, monkeypatch, runs: dict) -> str:
    """The screen's drift block over made-up records: ``runs`` maps (arm, seed) to its training log."""
    real = load_script("results_real")
    study = dataclasses.replace(real.study("smollm2-screen"), folder=tmp_path / "docs" / "results" / "smollm2-screen")
    (tmp_path / "pyproject.toml").write_text("")
    base = {"accuracy": 0.3, "auroc": 0.8, "auroc_question": 0.7, "mean_tokens": 24.0, "finished_frac": 0.9,
            "global_step": 100}
    for (arm, seed), train in runs.items():
        path = study.record_path(arm, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**base, "train": train}))
    monkeypatch.setattr(real, "study", lambda name: study)
    return real.render_drift()


def test_each_finished_run_gives_its_warning_and_its_drift(tmp_path, monkeypatch):
    clipped = [0.02, 0.02, 0.02, 0.02, 0.05, 0.2, 0.3, 0.5, 0.8, 0.9, 0.95, 1.0] + [1.0] * 8
    runs = {("capo-paper", 100): [log(5 * (i + 1), c, -0.01) for i, c in enumerate(clipped)],  # weak push: drifts
            ("capo-paper-answer", 100): [log(5 * (i + 1), min(c, 0.3), -0.2) for i, c in enumerate(clipped)]}
    block = drift_block(tmp_path, monkeypatch, runs)
    # steps 16-25 average 0.035 >= twice the first 10 steps' 0.02, but under the 0.1 floor; steps 21-30 average 0.125
    assert "| `capo-paper` | 100 | 30 | 60 | 30 | 1.00 | 0.05 | 0.05 |" in block
    assert "| `capo-paper-answer` | 100 | no | no | - | 0.30 | 1.00 | 1.00 |" in block
    assert "| `capo-paper-nomask` | 100 | not run yet |" in block
    assert ("Of the 2 runs finished, 1 drifted (the pilot's rule); the rule warned before 1 of them, 20 steps or "
            "more before for 1, and it warned in 0 of the other 1") in block


def test_a_study_where_no_run_drifted_says_so_and_counts_its_warnings(tmp_path, monkeypatch):
    """The pick study's page renders the same block: there no run drifted, and the sentence says how many warned."""
    quiet = [log(5 * (i + 1), 0.05, -0.2) for i in range(20)]
    rising = [log(5 * (i + 1), 0.02 if i < 4 else 0.3, -0.01) for i in range(20)]  # warns, never all truncated
    block = drift_block(tmp_path, monkeypatch, {("capo-paper", 100): quiet, ("capo-paper-answer", 100): rising})
    assert ("Of the 2 runs finished, none drifted (a window of only truncated completions, or collapsed at test); "
            "the rule warned in 1 of them.") in block
