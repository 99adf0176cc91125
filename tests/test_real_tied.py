"""The truncated_pairs: tied pilot (docs/results/smollm2-tied/study.yaml): its arm is the study's capo-nomask plus the
one flag, and its block applies the study's collapse rule to its own records and to the study's reused ones."""

import dataclasses
import json

from script_loader import load_script


def test_its_block_applies_the_study_collapse_rule(tmp_path, monkeypatch):
    real = load_script("results_real")
    tied = real.study("smollm2-tied")
    assert tied.arms["capo-nomask-tied"].flags() == ["--mask_truncated_completions", "true", "--truncated_pairs", "tied"]
    assert tied.reuse.keys() == {"capo-nomask", "grpo"} and tied.own_arms() == ["capo-nomask-tied"]
    assert (tied.plan.collapse_tokens, tied.plan.min_finished) == (30.0, 0.5)
    (tmp_path / "pyproject.toml").write_text("")  # the reused records are found from the repository's root
    folder = tmp_path / "docs" / "results" / "smollm2-tied"
    study = dataclasses.replace(tied, folder=folder)

    def write(path, **rec):
        path.parent.mkdir(parents=True, exist_ok=True)
        base = {"accuracy": 0.3, "auroc": 0.8, "auroc_question": 0.7, "ece": 0.4, "e_aurc": 0.1,
                "train": [{"step": 5, "completions/clipped_ratio": 0.5}]}
        path.write_text(json.dumps({**base, **rec}))
    write(folder / "seed100.json", mean_tokens=29.9, finished_frac=0.5)  # just inside both limits
    write(folder / "seed101.json", mean_tokens=30.0, finished_frac=0.9)  # at the length limit
    studied = tmp_path / "docs" / "results" / "smollm2-study"
    write(studied / "capo-nomask" / "seed100.json", mean_tokens=20.0, finished_frac=0.49)  # too few ended
    write(studied / "grpo" / "seed100.json", mean_tokens=23.6, finished_frac=0.975)
    monkeypatch.setattr(real, "study", lambda name: study)
    block = real.render_real_tied()
    assert "| 100 | no | collapsed | no | 0.300 |" in block
    assert "| 101 | collapsed | not run yet | not run yet | 0.300 |" in block
    assert "| 102 | not run yet | not run yet | not run yet | - |" in block
