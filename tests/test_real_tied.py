"""scripts/real_tied.py's summary: the study's collapse rule over this pilot's and the study's records."""

import json

from script_loader import load_script


def test_summary_applies_the_study_collapse_rule(tmp_path, monkeypatch):
    tied = load_script("real_tied")
    monkeypatch.setattr(tied, "OUT", tmp_path / "tied")
    monkeypatch.setattr(tied, "STUDY", tmp_path / "study")
    write = lambda path, **rec: (path.parent.mkdir(parents=True, exist_ok=True), path.write_text(json.dumps(rec)))  # noqa: E731
    write(tmp_path / "tied" / "seed100.json", mean_tokens=29.9, finished_frac=0.5)  # just inside both limits
    write(tmp_path / "tied" / "seed101.json", mean_tokens=30.0, finished_frac=0.9)  # at the length limit
    write(tmp_path / "study" / "capo-nomask" / "seed100.json", mean_tokens=20.0, finished_frac=0.49)  # too few ended
    write(tmp_path / "study" / "grpo" / "seed100.json", mean_tokens=23.6, finished_frac=0.975)
    result = tied.summary()
    assert result["done"] == [100, 101] and result["tied_collapsed"] == 1
    assert result["collapsed"][100] == {"capo-nomask-tied": False, "capo-nomask": True, "grpo": False}
    assert result["collapsed"][101] == {"capo-nomask-tied": True, "capo-nomask": None, "grpo": None}
    assert result["collapsed"][102] == {"capo-nomask-tied": None, "capo-nomask": None, "grpo": None}
    assert tied.FLAGS[-2:] == ["--truncated_pairs", "tied"] and "--mask_truncated_completions" in tied.FLAGS
