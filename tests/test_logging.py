"""CAPO's metrics reach the trackers (TensorBoard here), and the mask's warnings are written once, by one process."""

import json
import logging
from types import SimpleNamespace

from capo_trl.training.mask import NoiseMask


def test_mask_warnings_once_per_run_on_the_main_process(monkeypatch, caplog):
    mask = NoiseMask(SimpleNamespace())
    with caplog.at_level(logging.WARNING, logger="capo_trl.training.mask"):
        for _ in range(3):
            mask._warn_once("correct", "CAPO noise mask would drop every correct completion")
    assert [r.getMessage() for r in caplog.records] == ["[RANK 0] CAPO noise mask would drop every correct completion"]
    assert mask.state_dict()["warned"] == ["correct"]  # a resumed run does not say it again

    class Replica:  # what PartialState() answers on process 1 of 2
        _shared_state = {"initialised": True}
        is_main_process = False
        process_index = 1

    import accelerate.logging

    monkeypatch.setattr(accelerate.logging, "PartialState", Replica)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="capo_trl.training.mask"):
        NoiseMask(SimpleNamespace())._warn_once("correct", "CAPO noise mask would drop every correct completion")
    assert caplog.records == []


def test_tensorboard_event_file_holds_capo_metrics(tiny_model_dir, tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from test_train_cli import job

    from capo_trl.cli import train as capo_train

    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps({"problem": f"what is {i}?", "answer": str(i)}) + "\n" for i in range(8)))
    logs = tmp_path / "tb"
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(logs))
    argv = job(tiny_model_dir, str(data), tmp_path / "out", "--max_steps", "2", "--save_strategy", "no")
    argv[argv.index("--report_to") + 1] = "tensorboard"
    capo_train.main(argv)
    events = list(logs.rglob("events.out.tfevents.*"))
    assert events, f"no event file under {logs}"
    tags = set()
    for path in events:
        acc = EventAccumulator(str(path))
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    assert {"train/capo/auroc", "train/capo/kept_frac", "train/reward"} <= tags, sorted(tags)
