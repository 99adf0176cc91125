"""Every method's first 3 fixed-seed steps (losses, advantages, kept rows, metrics) equal the recorded ones."""

import json

import pytest
from golden import GOLDEN, RUNS, close, record


@pytest.mark.parametrize("name", sorted(RUNS))
def test_steps_match_the_recording(name, tiny_model_dir, tmp_path):
    expected = json.loads(GOLDEN.read_text())[name]
    got = record(name, tiny_model_dir, str(tmp_path))
    for i, (a, b) in enumerate(zip(got["batches"], expected["batches"])):
        assert close(a, b), f"{name}: generation batch {i} differs"
    for a, b in zip(got["steps"], expected["steps"]):
        assert close(a, b), f"{name}: step {b.get('step')} differs: " + str(
            {k: (a.get(k), b[k]) for k in b if not close(a.get(k), b[k])})
    assert close(got, expected), name
