"""scripts/rerun_record.py: which differences between a committed record and its rerun count."""

from rerun_record import differences

RECORD = {"arm": "capo", "seed": 1, "accuracy": 0.5, "auroc": 0.7, "guessable/accuracy": 0.2, "train_s": [600],
          "commit": "abc", "train": [{"step": 5, "reward": 0.25, "step_time": 7.5}]}


def test_wall_times_and_provenance_do_not_count_but_every_number_of_the_run_does():
    rerun = {**RECORD, "train_s": [300], "commit": "def", "train": [{"step": 5, "reward": 0.25, "step_time": 3.0}]}
    assert differences(RECORD, rerun) == []
    assert differences(RECORD, {**rerun, "auroc": 0.7000001}) == ["auroc: 0.7 != 0.7000001"]
    assert differences(RECORD, {**rerun, "guessable/accuracy": 0.3}) == ["guessable/accuracy: 0.2 != 0.3"]
    assert differences(RECORD, {**rerun, "train": [{"step": 5, "reward": 0.5, "step_time": 3.0}]}) == \
        ["train step 5 reward: 0.25 != 0.5"]
    assert differences(RECORD, {**rerun, "train": []}) == ["train: 1 logged steps != 0"]
