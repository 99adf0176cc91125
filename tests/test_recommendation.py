"""One recommended CAPO configuration for a real model, written the same everywhere a user reads it.

``capo_trl.training.defaults.RECOMMENDED`` is the source; the README's drop-in, the Qwen recipes, docs/config.md,
the notebook, the ``capo-recommended`` preset, CAPOConfig's defaults and what ``calibrate-mask
--write_config`` writes must all resolve to it (the embedded default may differ, and does).
"""

import ast
import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from capo_trl import CAPOConfig
from capo_trl.training.defaults import EMBEDDED_METHOD, RECOMMENDED

ROOT = Path(__file__).resolve().parents[1]
QWEN = sorted((ROOT / "examples" / "recipes").glob("capo-qwen*.yaml"))
CPU = dict(use_cpu=True, bf16=False, activation_checkpointing=False, report_to="none")


def resolved(tmp_path, **fields) -> dict:
    """The recommendation's fields of a CAPOConfig built from ``fields`` (defaults resolved: noise_mask None -> on)."""
    args = CAPOConfig(output_dir=str(tmp_path / "out"), **CPU, **fields)
    return {k: getattr(args, k) for k in RECOMMENDED}


def call_keywords(source: str, name: str = "CAPOConfig") -> dict:
    """The literal keyword arguments of the first ``name(...)`` call in a piece of Python."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == name:
            return {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    raise AssertionError(f"no {name}(...) call in {source[:200]!r}")


def test_capoconfig_defaults_and_the_preset_are_the_recommendation(tmp_path):
    from capo_trl.harness.presets import PRESETS

    assert resolved(tmp_path) == RECOMMENDED
    assert PRESETS["capo-recommended"] == RECOMMENDED
    assert resolved(tmp_path, **PRESETS["capo-recommended"]) == RECOMMENDED
    assert PRESETS["capo"] == EMBEDDED_METHOD != RECOMMENDED  # the embedded default differs, on purpose


# The arm the confirmatory study confirmed, as the frozen commit's `capo-nomask` preset resolved: the embedded
# default of then (which measured mask thresholds, ref_thresholds="auto") with the mask off.
CONFIRMED_ARM = dict(advantage_estimator="capo", tau=0.5, tau_mode="relative", advantage_scale="matched",
                     ref_thresholds="auto", noise_mask=False)


def test_the_embedded_default_trains_the_confirmed_arm(tiny_model_dir, tmp_path):
    """The default differs from the confirmed arm only in a field that is inert without the mask; both train alike."""
    from test_trainer import make, params
    from transformers import set_seed

    from capo_trl.harness.presets import PRESETS
    from capo_trl.harness.study import load_study

    study = load_study(ROOT / "docs" / "results" / "guess-half-mask-study")
    assert study.arms["capo-nomask"].preset == "capo-nomask" and PRESETS["capo-nomask"] == PRESETS["capo"]
    assert {k: v for k, v in CONFIRMED_ARM.items() if k != "ref_thresholds"} == EMBEDDED_METHOD
    runs = []
    for name, fields in (("default", EMBEDDED_METHOD), ("confirmed", CONFIRMED_ARM)):
        set_seed(7)  # each trainer starts from the same RNG state, whatever ran before it in this process
        runs.append(make(tiny_model_dir, tmp_path / name, **fields, max_steps=2))
        runs[-1].train()
    assert runs[0]._mask is None and runs[1]._mask is None
    after = [params(t) for t in runs]
    start = params(make(tiny_model_dir, tmp_path / "untrained"))
    assert any(not torch.equal(start[n], after[0][n]) for n in start)  # the two steps did train
    assert all(torch.equal(after[0][n], after[1][n]) for n in after[0])
    assert [h.get("loss") for h in runs[0].state.log_history] == [h.get("loss") for h in runs[1].state.log_history]


def test_the_readme_drop_in_is_the_recommendation(tmp_path):
    text = (ROOT / "README.md").read_text()
    line = next(line for line in text.splitlines() if line.startswith("+args = CAPOConfig("))
    kwargs = call_keywords(line[1:])
    kwargs.pop("output_dir")
    assert resolved(tmp_path, **kwargs) == RECOMMENDED


@pytest.mark.parametrize("recipe", QWEN, ids=[p.stem for p in QWEN])
def test_the_qwen_recipes_are_the_recommendation(recipe, tmp_path):
    fields = yaml.safe_load(recipe.read_text())
    expected = dict(RECOMMENDED)
    if "7b" in recipe.stem:
        expected["tau"] = 0.5  # the paper's value for 7B; everything else the same
    assert resolved(tmp_path, **{k: fields[k] for k in RECOMMENDED if k in fields}) == expected
    assert "Recommended configuration" in recipe.read_text()


def test_docs_config_md_shows_the_recommendation():
    text = (ROOT / "docs" / "config.md").read_text()
    section = text[text.index("## Recommended configuration for a real model"):]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)[1]
    assert yaml.safe_load(block) == RECOMMENDED


def test_the_notebook_shows_the_recommendation():
    cells = json.loads((ROOT / "examples" / "quickstart.ipynb").read_text())["cells"]
    blocks = [m[1] for c in cells if c["cell_type"] == "markdown"
              for m in re.finditer(r"```python\n(.*?)```", "".join(c["source"]), re.S)]
    shown = [call_keywords(re.sub(r"^\s+", "", b, flags=re.M)) for b in blocks if "CAPOConfig(" in b]
    assert shown == [RECOMMENDED]


def test_calibrate_mask_writes_the_recommendation_with_the_measured_values(monkeypatch, tmp_path):
    """Measured values equal to the paper's leave the 1.5B recipe unchanged; other values change only them."""
    from capo_trl.cli.main import main
    from capo_trl.harness import calibrate_mask as mask

    measured = {"ref_high": 2.5, "ref_low": 1.05, "tau": 0.6, "score_spread": 0.6, "reference_auroc": 0.7,
                "reference_accuracy": 0.4, "ppl_correct_quartiles": [1.1, 1.3, 2.5],
                "ppl_wrong_quartiles": [1.05, 1.5, 2.0], "n_problems": 8, "n_samples": 32, "mixed_groups": 3}
    monkeypatch.setattr(mask, "calibrate_mask", lambda *a, **k: dict(measured))
    recipe = ROOT / "examples" / "recipes" / "capo-qwen2.5-math-1.5b.yaml"
    copy = tmp_path / "recipe.yaml"
    copy.write_text(recipe.read_text())
    assert main(["calibrate-mask", "--write_config", str(copy)]) == 0
    assert copy.read_text() == recipe.read_text()

    fresh = tmp_path / "fresh.yaml"
    measured.update(tau=0.21, ref_high=1.7, ref_low=1.02)
    assert main(["calibrate-mask", "--write_config", str(fresh)]) == 0
    written = yaml.safe_load(fresh.read_text())
    tau = 0.21 if RECOMMENDED["tau_mode"] == "absolute" else RECOMMENDED["tau"]  # a relative tau is not measured
    assert resolved(tmp_path, **written) == {**RECOMMENDED, "tau": tau, "ref_high": 1.7, "ref_low": 1.02}
    assert "advantage_estimator" not in written and "noise_mask" not in written  # the recipe's own choice


# ------------------------------------------------------------------------------------ one recommendation per setting
# The pages that recommend settings render one block (RECOMMENDED, scripts/results_recommend.py's RECOMMENDATION);
# a sentence elsewhere that recommends a value of one of these fields must name the same value.
RECOMMENDING_PAGES = ["docs/config.md", "docs/faq.md", "docs/concepts.md"]
CHOSEN = ("noise_mask", "tau_mode", "tau", "advantage_scale")
ASSIGNMENT = re.compile(r"\b(noise_mask|tau_mode|tau|advantage_scale)\b`?\s*(?:=|:)\s*`?\"?([\w.+-]+)")


def _value(text: str):
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return float(text)
    except ValueError:
        return text


def recommendations(text: str) -> list[tuple[str, object, str]]:
    """(field, value, sentence) for each value of a chosen field that a sentence containing "recommend" names."""
    found, prose = [], []
    for line in text.splitlines():  # a table's cells are read one by one, the rest sentence by sentence
        prose += [line] if not line.startswith("|") else [f"\n{cell}\n" for cell in line.split(" | ")]
    for sentence in re.split(r"(?<=[.!?])\s+|\n\s*\n", "\n".join(prose)):
        if "recommend" not in sentence.lower():
            continue
        found += [(field, _value(value), " ".join(sentence.split())) for field, value in ASSIGNMENT.findall(sentence)]
    return found


def disagreements(text: str, expected: dict) -> list[str]:
    return [f"{field}={value!r} in: {sentence[:200]}" for field, value, sentence in recommendations(text)
            if value != expected[field]]


def _block(text: str, name: str = "recommended") -> str | None:
    m = re.search(rf"<!-- text: {name} \(rendered by scripts/results_tables\.py\) -->\n(.*?)<!-- end text -->", text,
                  re.S)
    return m[1] if m else None


def test_the_checker_catches_a_page_that_recommends_another_value():
    other = "absolute" if RECOMMENDED["tau_mode"] == "relative" else "relative"  # whatever the recommendation is
    assert disagreements(f'We recommend `tau_mode="{other}"` for any model.', RECOMMENDED) == [
        f"tau_mode='{other}' in: We recommend `tau_mode=\"{other}\"` for any model."]
    assert disagreements(f"The recommended mask: noise_mask: {str(not RECOMMENDED['noise_mask']).lower()}.", RECOMMENDED)
    assert disagreements("We recommend tau=0.3.", RECOMMENDED)
    said = f"We recommend `tau={RECOMMENDED['tau']}`, `noise_mask={RECOMMENDED['noise_mask']}`."
    assert not disagreements(f'{said} Ablations use `tau_mode="{other}"`.', RECOMMENDED)


@pytest.mark.parametrize("page", RECOMMENDING_PAGES)
def test_every_page_renders_the_one_recommendation_and_recommends_nothing_else(page):
    from test_docs import script

    text = (ROOT / page).read_text()
    block = _block(text)
    assert block is not None, f"{page}: no `recommended` block (scripts/results_tables.py renders it)"
    assert block == script("results_tables").render_recommended(), f"{page}: stale; run python scripts/results_tables.py"
    for field in CHOSEN:  # the block names every chosen field's value
        assert f"`{field}=" in block, field
    assert not disagreements(text, RECOMMENDED), disagreements(text, RECOMMENDED)


def test_the_readmes_first_screen_names_the_recommendation_and_recommends_nothing_else():
    """The README says what to use on its first screen (scripts/results_tables.py's `first-screen` block) and sends
    each value's evidence and limits to docs/config.md, whose `recommended` block the test above checks."""
    text = (ROOT / "README.md").read_text()
    block = _block(text, "first-screen")
    from results_first_screen import what_to_use

    assert block is not None and block.startswith("**What to use:** ")  # then the pick study's rule may say first
    use = " ".join(block.split("\n- ")[0].split())  # that no CAPO configuration kept calibration
    assert what_to_use(RECOMMENDED) in use and "`CAPOConfig()` as it comes" in use
    for field in ("tau", "advantage_scale"):
        assert f"`{field}={RECOMMENDED[field]!r}`".replace("'", '"') in use, field
    assert "docs/config.md#recommended-configuration-for-a-real-model" in text
    assert not disagreements(text, RECOMMENDED), disagreements(text, RECOMMENDED)


def test_the_config_reference_sends_each_chosen_field_to_the_recommendation():
    """docs/config.md's "when to change it" column: each chosen field's advice points at the one recommendation."""
    text = (ROOT / "docs" / "config.md").read_text()
    for field in CHOSEN:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{field}` |"))
        cell = row.split(" | ")[3]
        assert "recommend" in cell or "below" in cell, (field, cell)


@pytest.mark.parametrize("recipe", sorted((ROOT / "examples" / "recipes").glob("*.yaml")), ids=lambda p: p.stem)
def test_no_recipe_comment_recommends_another_value(recipe):
    comments = "\n".join(line.split("#", 1)[1] for line in recipe.read_text().splitlines() if "#" in line)
    expected = {**RECOMMENDED, "tau": 0.5} if "7b" in recipe.stem else RECOMMENDED
    assert not disagreements(comments, expected)


@pytest.mark.parametrize("primary, holds, config, kept", [
    ((0.04, 0.01, 0.07), True, "pick", True),       # above 0: the pick, as measured
    ((0.02, -0.01, 0.05), False, "pick", False),    # no difference shown: nothing kept; the pick did least harm
    ((-0.03, -0.05, -0.01), True, "pick", False),   # worse than GRPO, less so than the preset's -0.070
    ((-0.09, -0.12, -0.06), True, "preset", False),  # worse than the preset: the preset did least harm
])
def test_the_real_recommendation_follows_the_pick_studys_reporting_rule(primary, holds, config, kept):
    """Written before the pick study's look: its protocol's rule, against the second study's committed result."""
    import results_evidence as evidence
    import results_verdict as evidence_verdict

    preset = evidence.REAL_LR_RESULT
    pick = {**preset, "primary": primary, "holds": holds, "accuracy": {"capo-paper-lr3e-4": (-0.01, -0.03, 0.01)}}
    rec = evidence_verdict.real_recommendation(pick, preset)
    assert (rec["config"], rec["kept"]) == (config, kept)
    assert rec["primary"] == (primary if config == "pick" else preset["primary"])
    words = evidence_verdict.recommendation_words(rec, "CAPO with the paper's settings")
    assert words.startswith("On the real model, CAPO with the paper's settings kept" if kept else
                            "No CAPO configuration kept calibration better than GRPO on the real model.")
    named = "CAPO with the paper's settings" if config == "pick" else evidence_verdict.PRESET_LABEL
    assert named in words and ("-0.058 [-0.074, -0.041]" in words) == (config == "preset")
    with pytest.raises(ValueError, match="both studies' looks"):
        evidence_verdict.real_recommendation({**pick, "look": False}, preset)


ADVANTAGE = ("advantage_estimator", "tau", "tau_mode", "advantage_scale", "noise_mask")


def arm_method(folder: str, arm: str) -> dict:
    """The CAPO fields an arm of a committed study trained with: its recipe at the study's frozen commit, then its
    overrides (the mask's thresholds only where the mask is on)."""
    import subprocess

    from capo_trl.harness.study import load_study

    study = load_study(ROOT / "docs" / "results" / folder)
    spec = study.arms[arm]
    recipe = yaml.safe_load(subprocess.run(["git", "show", f"{study.frozen_commit}:{spec.recipe}"], cwd=ROOT,
                                           check=True, capture_output=True, text=True).stdout)
    merged = {**recipe, **spec.overrides}
    keys = ADVANTAGE + (("ref_high", "ref_low") if merged["noise_mask"] else ())
    return {k: merged[k] for k in keys}


def test_the_recommendation_is_the_pick_studys_until_its_look_then_what_its_rule_chose():
    """The pick study's protocol ("Reporting"): until its look the recommendation stays the settings it tests and the
    CAPO SmolLM2 recipe the preset's (the one with a confirmatory result at 3e-4); at the look both become what its
    rule chose (evidence_verdict.real_recommendation): the pick, or the preset's settings if those did less harm.
    RECOMMENDED (and with it CAPOConfig's defaults, the preset, the pages) and the recipe change by hand."""
    import results_evidence as evidence
    import results_verdict as evidence_verdict
    from capo_trl.harness.study import load_study

    pick = evidence.measure_real(load_study(ROOT / "docs" / "results" / "smollm2-pick-study"))
    tested = arm_method("smollm2-pick-study", "capo-paper-lr3e-4")
    chosen = tested
    if pick["look"]:
        rec = evidence_verdict.real_recommendation(pick, evidence.REAL_LR_RESULT)
        if rec["config"] == "preset":
            chosen = arm_method("smollm2-lr-study", "capo-nomask-lr3e-4")
    assert tested["tau_mode"] == "absolute" and tested["noise_mask"] is True  # the reading above is of real values
    assert {k: RECOMMENDED[k] for k in chosen} == chosen
    from capo_trl.cli import train as capo_train

    _, recipe, _ = capo_train.parse_args(["--config", str(ROOT / "examples/recipes/capo-smollm2-135m-lora-cpu.yaml")])
    trains = chosen if pick["look"] else arm_method("smollm2-lr-study", "capo-nomask-lr3e-4")
    assert {k: getattr(recipe, k) for k in trains} == trains  # as it resolves: an unset noise_mask is on under capo


def test_from_the_pick_studys_look_the_recommendation_block_gives_it_and_what_its_rule_recommends(monkeypatch):
    """Written before that look: the block every recommending page renders then gives the pick study's every endpoint
    and the rule's sentence, and from the replication's look its result beside them (the protocol's "Reporting")."""
    import results_evidence as evidence
    import results_verdict as evidence_verdict
    from test_docs import script

    module = script("results_recommend")
    monkeypatch.setattr(module, "pick_result", lambda: {"look": False})  # before the look, whenever this runs
    before = module.render_recommended()
    assert "kept calibration better than GRPO" not in before and "replication" not in before
    pick = {**evidence.REAL_LR_RESULT, "seeds": 13, "primary": (0.03, 0.01, 0.05),
            "accuracy": {"capo-paper-lr3e-4": (-0.01, -0.03, 0.01)}}
    monkeypatch.setattr(module, "pick_result", lambda: pick)
    flat = " ".join(module.render_recommended().split())
    added = " ".join(evidence_verdict.pick_paragraphs(pick, evidence.REAL_LR_RESULT, "capo-paper").split())
    assert added in flat.split("- `tau=")[0] and "+0.030 [+0.010, +0.050]" in added
    assert "On the real model, CAPO with the paper's settings kept calibration better than GRPO" in added
    replication = {**pick, "primary": (0.02, -0.01, 0.05), "holds": False}
    monkeypatch.setattr(module, "replication_result", lambda: replication)
    flat = " ".join(module.render_recommended().split())
    assert " ".join(evidence.replication_words(replication, "capo-paper").split()) in flat.split("- `tau=")[0]
    assert flat.index(added) < flat.index("On `addition-guess-half`")  # beside the pick study's, after it


def test_where_only_the_replication_kept_calibration_better_the_recommendation_is_scoped_to_addition():
    """Written before the replication's look: the recommendation still follows the pick study's rule (the
    replication's protocol), but if the replication's primary holds above 0 while the pick study's did not, the
    sentence that nothing kept calibration better names two-digit addition and points to the replication; a
    replication before its look, or one that does not hold above 0, leaves the sentence as it was."""
    import results_evidence as evidence
    import results_verdict as evidence_verdict

    preset = evidence.REAL_LR_RESULT
    pick = {**preset, "seeds": 13, "primary": (0.006, -0.008, 0.02), "holds": False,
            "accuracy": {"capo-paper-lr3e-4": (-0.006, -0.019, 0.007)}}
    rec = evidence_verdict.real_recommendation(pick, preset)
    plain = evidence_verdict.recommendation_words(rec, "CAPO with the paper's settings")
    assert plain.startswith("No CAPO configuration kept calibration better than GRPO on the real model.")
    for replication in ({"look": False}, {**pick, "primary": (0.03, -0.01, 0.07), "holds": False},
                        {**pick, "primary": (-0.03, -0.05, -0.01), "holds": True}):
        assert evidence_verdict.recommendation_words(rec, "CAPO with the paper's settings", replication) == plain
        assert not evidence_verdict.kept_better(replication)
    held = {**pick, "primary": (0.03, 0.01, 0.05), "holds": True}
    assert evidence_verdict.kept_better(held) and not evidence_verdict.kept_better(None)
    words = evidence_verdict.recommendation_words(rec, "CAPO with the paper's settings", held)
    assert words == ("On two-digit addition no CAPO configuration kept calibration better than GRPO on the real model. "
                     "What did least harm there: CAPO with the paper's settings (pooled AUROC +0.006 [-0.008, +0.020] "
                     "against GRPO, accuracy -0.006 [-0.019, +0.007]; measured on SmolLM2-135M-Instruct from a 4-bit "
                     "quantised file, two-digit addition, learning rate 3e-4). Where half the items hide an operand, "
                     "CAPO with the paper's settings kept calibration better than GRPO in the replication of that "
                     "study (below).")
    said = " ".join(evidence_verdict.pick_paragraphs(pick, preset, "capo-paper", held).split())
    assert said.endswith(" ".join(evidence.replication_words(held, "capo-paper").split()))
    assert " ".join(words.split()) in said
    assert evidence_verdict.pick_paragraphs(pick, preset, "capo-paper", {"look": False}) == (
        evidence_verdict.pick_paragraphs(pick, preset, "capo-paper"))
