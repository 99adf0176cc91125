"""scripts/look_result.py writes a study's result constant at its look: in evidence.py's own style, once."""

import ast

import pytest
from script_loader import load_script


def test_the_pick_studys_constant_is_what_the_script_writes():
    """Blank the committed PICK_RESULT, write it back from its value: the file comes back unchanged."""
    import results_evidence as evidence

    script = load_script("look_result")
    text = script.EVIDENCE.read_text()
    written = script.assignment("PICK_RESULT", evidence.PICK_RESULT)
    assert written in text and max(map(len, written.splitlines())) <= script.WIDTH
    blank = text.replace(written, "PICK_RESULT: dict | None = None")
    assert script.write(blank, "PICK_RESULT", evidence.PICK_RESULT) == text
    assert script.write(text, "PICK_RESULT", evidence.PICK_RESULT) == text  # the same value again: nothing to do


def test_a_written_look_is_not_overwritten_and_a_study_before_its_look_writes_nothing(tmp_path, monkeypatch, capsys):
    import results_evidence as evidence

    script = load_script("look_result")
    text = script.EVIDENCE.read_text()
    with pytest.raises(ValueError, match="already holds another result"):
        script.write(text, "PICK_RESULT", {**evidence.PICK_RESULT, "seeds": 14})
    with pytest.raises(ValueError, match="NO_SUCH_RESULT is not a constant"):
        script.write(text, "NO_SUCH_RESULT", {"look": True})
    copy = tmp_path / "evidence.py"  # a study's constant before its look, whatever the real file holds by then
    copy.write_text('"""evidence"""\n\nREPLICATION_RESULT: dict | None = None\nAFTER = 1\n')
    text = copy.read_text()
    monkeypatch.setattr(script, "EVIDENCE", copy)
    monkeypatch.setattr(evidence, "measure_real", lambda study: {"look": False, "planned": 13})
    assert script.main(["smollm2-pick-guess-half", "REPLICATION_RESULT"]) == 1
    assert "has not had its look" in capsys.readouterr().err and copy.read_text() == text
    found = {**evidence.PICK_RESULT, "primary": (0.01, -0.02, 0.04), "holds": False}
    monkeypatch.setattr(evidence, "measure_real", lambda study: found)
    assert script.main(["smollm2-pick-guess-half", "REPLICATION_RESULT"]) == 0
    module = ast.parse(copy.read_text())
    (node,) = [n for n in module.body if isinstance(n, ast.AnnAssign) and n.target.id == "REPLICATION_RESULT"]
    assert ast.literal_eval(node.value) == found and copy.read_text().endswith("\nAFTER = 1\n")
    assert script.main(["smollm2-pick-guess-half", "REPLICATION_RESULT"]) == 0  # written once: the same again is fine
