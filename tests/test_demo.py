"""The embedded default: packaged model, arithmetic task, demo / compare / calibrate-mask end to end."""

import json
import re
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from test_pictures import png_size

from capo_trl.cli.main import main
from capo_trl.data.arithmetic import ArithmeticTask, arithmetic_dataset, embedded_model_path
from capo_trl.rewards import with_grader_noise
from capo_trl.harness.demo import CPU_VARIATION
from capo_trl.harness.presets import PRESETS, parse_methods
from capo_trl.rewards import MathReward


def test_packaged_model_loads_offline_and_solves_some_problems():
    path = embedded_model_path()
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    prompt = tokenizer("Compute 12+30.", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=40, do_sample=False)
    text = tokenizer.decode(out[0, prompt.input_ids.shape[1]:], skip_special_tokens=True)
    assert "\\boxed{" in text and "12+30=" in text  # the worked-solution format it was trained on


def test_task_is_deterministic_disjoint_and_graded_correct():
    first, again = arithmetic_dataset("train", 300, seed=5), arithmetic_dataset("train", 300, seed=5)
    assert first.to_list() == again.to_list()
    assert first.to_list() != arithmetic_dataset("train", 300, seed=6).to_list()
    test = arithmetic_dataset("test", 200)
    assert not set(first["prompt"]) & set(test["prompt"])  # hash splits never leak
    with MathReward(timeout=2, workers=1) as reward:
        assert reward(completions=test["solution"], answer=test["answer"]) == [1.0] * 200
    hard = arithmetic_dataset("train", 50, task=ArithmeticTask(min_operands=4, max_operands=4, max_value=99))
    assert set(hard["num_operands"]) == {4}
    with pytest.raises(ValueError, match="min_operands"):
        ArithmeticTask(min_operands=1)


def test_grader_noise_flips_the_requested_fraction_consistently():
    def exact(prompts, completions, **kw):
        return [1.0] * len(completions)

    noisy = with_grader_noise(exact, 0.25, seed=1)
    prompts, completions = [f"p{i}" for i in range(4000)], [f"c{i}" for i in range(4000)]
    grades = noisy(prompts=prompts, completions=completions)
    assert 0.22 < 1 - sum(grades) / len(grades) < 0.28
    assert grades == noisy(prompts=prompts, completions=completions)  # the same completion, the same grade


def test_methods_parse_with_amendments_and_reject_typos():
    (label, overrides), = parse_methods("capo:tau=0.3:noise_mask=false")
    assert overrides == {**PRESETS["capo"], "tau": 0.3, "noise_mask": False} and label.startswith("capo")
    with pytest.raises(ValueError, match="unknown method"):
        parse_methods("capoo")


@pytest.mark.slow
def test_demo_compare_and_calibrate_mask_run_end_to_end(tmp_path, capsys):
    torch.manual_seed(0)
    budget = ["--steps", "2", "--test_problems", "8", "--test_samples", "2"]
    plot = tmp_path / "pictures" / "demo.png"  # in a folder the demo creates
    assert main(["demo", *budget, "--val_problems", "4", "--seed", "1", "--plot", str(plot)]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    budget.append("--no_progress")
    # by default on guess-half, both arms trained side by side (each in its own process, with the seed asked for),
    # a progress bar each (on stderr, drawn from the arms' step files), then one table: the start model and each arm
    assert "side by side on guess-half" in printed and "seed 1" in printed
    assert "[grpo seed 1] trained and tested" in printed and "[capo seed 1] trained and tested" in printed
    for arm in ("grpo", "capo"):  # each bar ends saying its arm is done; the line saying so waits for the bars
        assert re.search(rf"{arm}\s+trained and tested in \d+ s: 100%\S* 2/2", captured.err), captured.err[-2000:]
    assert printed.index("[capo seed 1] trained and tested") < printed.index("side by side on the embedded task")
    table = printed[printed.index("auroc_question"):].splitlines()
    assert [line.split()[0] for line in table[1:4]] == ["start", "grpo", "capo"]
    assert [len(line.split()) for line in table[1:4]] == [7, 5, 5]  # a name, then the 4 numbers
    curves = printed[printed.index("validation pooled AUROC over steps"):].splitlines()
    assert curves[1].split() == ["step", "0", "1", "2"]  # validations at steps 0, 1, 2 (every steps // 4, at least 1)
    assert [line.split()[0] for line in curves[2:4]] == ["grpo", "capo"] and len(curves[2].split()) == 4
    # what the committed study on this task found, every endpoint, and that a 2-step run was not its budget
    assert "| per-question AUROC | -0.016 [-0.057, +0.025] | 5 of 12 |" in printed
    words = " ".join(printed.split())
    assert "chosen in an exploratory pilot" not in words and "was not tested for showing it" in words
    # that its numbers vary with the CPU kind, right under them; its wall time; this run beside the study's seeds
    assert " ".join(CPU_VARIATION.split()) in " ".join(table[4:12])
    assert re.search(r"seed 1; test split 8 problems x 2 samples; \d+ s of wall time here \(\d+ CPU cores", words)
    beside = printed[printed.index("This run against the committed study's 12 seeds"):].splitlines()
    assert [line.split()[0] for line in beside[2:6]] == ["pooled", "start", "grpo", "capo"]
    assert "the study's capo-nomask)" in beside[5]
    # the demo's PNG, and where it is said last: three panels (the test endpoints), 12.6 x 4.6 inches at 120 dpi
    assert printed.rstrip().endswith(f"wrote {plot}")
    assert png_size(plot) == (round(3 * 4.2 * 120), round(4.6 * 120))

    out = tmp_path / "cmp"
    assert main(["compare", "--methods", "grpo,capo", "--seeds", "1", "--out", str(out), "--val_every", "1",
                 "--val_problems", "4", "--val_samples", "2", *budget]) == 0
    for name in ("report.md", "metrics.csv", "final.csv", "summary.json", "val_curves.png", "precision_coverage.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "val_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((out / "summary.json").read_text())
    assert set(data["summary"]) == {"start (no RL)", "grpo", "capo"}
    assert data["plotted_points"] == 2 * 3 * 3  # 2 methods x 3 panels x validations at steps 0, 1, 2
    from capo_trl.harness.compare import replot

    assert replot(out, val_samples=2) == data["plotted_points"]  # redrawn from metrics.csv alone

    config = tmp_path / "mask.yaml"
    assert main(["calibrate-mask", "--limit", "8", "--n", "4", "--write_config", str(config)]) == 0
    written = config.read_text()
    assert "ref_high" in written and "ref_low" in written and "tau" in written


def test_the_shipped_study_file_is_what_the_committed_records_give():
    """`capo-trl demo` reads the committed studies' numbers and words from a file the package ships (a wheel has no
    docs/results/): that file is what scripts/results_demo.py renders from the records today."""
    import results_demo

    assert results_demo.DATA.read_text() == results_demo.text(), "stale: run python scripts/results_demo.py"


def test_the_committed_study_is_read_from_its_run_files():
    """The seeds the demo draws are the committed study's (the look that ended it), arm by arm as the demo names
    them; their means are the ones the docs print (results_evidence, checked against the same files)."""
    from capo_trl.harness.demo import against_study, committed_study, demo_budget
    from results_evidence import STUDY_RESULTS

    folder = Path(__file__).resolve().parents[1] / "docs" / "results" / "guess-half-mask-study"
    budget = demo_budget()
    study = committed_study(budget, parse_methods("grpo,capo"))
    found = STUDY_RESULTS["guess-half"]
    assert study["seeds"] == found["seeds"] == 12 and study["steps"] == 600 and study["test_problems"] == 512
    assert {label: arm["arm"] for label, arm in study["arms"].items()} == {"grpo": "grpo", "capo": "capo-nomask"}
    for label, arm, mean in (("grpo", "grpo", found["grpo"]), ("capo", "capo-nomask", found["nomask"])):
        files = [json.loads((folder / arm / f"seed{s}.json").read_text()) for s in range(12)]
        for key in ("auroc", "auroc_question", "accuracy"):
            assert study["arms"][label][key]["values"] == [f[key] for f in files], (label, key)
        assert round(study["arms"][label]["auroc"]["mean"], 3) == mean
    assert round(study["start"]["auroc"], 3) == found["start"]

    other = committed_study(budget, parse_methods("grpo,capo:tau=0.3"))  # a method no arm of the study trained
    assert set(other["arms"]) == {"grpo"}
    run = {"accuracy": 0.4, "auroc": 0.8, "auroc_question": 0.7, "ece": 0.5}
    text = against_study(run, [{"method": "capo:tau=0.3", "after": run}], other, budget)
    assert "no arm of the study trained this method" in text and "higher is better" in text
    assert committed_study(demo_budget("arithmetic"), parse_methods("grpo,capo")) is None  # no study of that task
    from dataclasses import replace

    assert committed_study(replace(budget, model="elsewhere"), parse_methods("grpo,capo")) is None  # another model
    assert against_study(run, [], None, budget) == ""


def test_a_finished_run_line_waits_until_the_bars_have_closed(tmp_path, monkeypatch):
    """What is printed while the arms' bars are drawn (the driver's "[capo seed 0] trained and tested in ...") is
    written after every bar has closed, never through one; the arm's own bar says it is done meanwhile."""
    from tqdm import tqdm

    from capo_trl.harness import demo as demo_module

    class Console:
        def __init__(self):
            self.writes = []

        def write(self, text):
            self.writes.append((text, len(getattr(tqdm, "_instances", ()))))  # with the bars open at that moment
            return len(text)

        def flush(self):
            pass

    console = Console()
    monkeypatch.setattr("sys.stdout", console)
    with demo_module._arm_bars(["grpo", "capo"], 3, str(tmp_path), enabled=True, every=0.01) as done:
        assert done("capo", "trained and tested in 7 s") == "trained and tested in 7 s"
        print("[capo seed 0] trained and tested in 7 s")
        (tmp_path / "capo.step").write_text("3")  # its last steps, read after it said it was done
        time.sleep(0.3)
        assert console.writes == [] and len(tqdm._instances) == 2
        bars = {bar.desc.split()[0]: bar for bar in tqdm._instances}
        assert bars["capo"].n == 3 and bars["capo"].desc.startswith("capo trained and tested in 7 s")
        assert bars["grpo"].desc.startswith("grpo training")
    assert "".join(text for text, _ in console.writes) == "[capo seed 0] trained and tested in 7 s\n"
    assert all(open_bars == 0 for _, open_bars in console.writes)


# ------------------------------------------------------------------------------------ one-line errors
@pytest.fixture
def nothing_runs(monkeypatch):
    """Fails the test if a command gets as far as evaluating, training or sampling."""
    from capo_trl.harness import calibrate_mask as mask
    from capo_trl.harness import runs

    def fail(*args, **kwargs):
        raise AssertionError("work started before the bad input was caught")

    for module, name in ((runs, "evaluate_test"), (runs, "train_method"), (mask, "calibrate_mask")):
        monkeypatch.setattr(module, name, fail)


def _one_line_error(capsys, command, *needles):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"capo-trl {command}: "), err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


@pytest.mark.parametrize("extra, needles", [
    (["--methods", "grpo,capox"], ["--methods", "'capox'", "did you mean 'capo'"]),
    (["--methods", "grpo,capo:tauu=1"], ["--methods", "'tauu'", "did you mean 'tau'"]),
    (["--learning_rate", "-1"], ["learning_rate"]),
    (["--steps", "0"], ["--steps"]),
    (["--test_samples", "0"], ["--test_samples"]),
    (["--model", "/no/such/model"], ["/no/such/model", "no such directory"]),
    (["--seed", "-1"], ["--seed", "-1"]),
])
def test_demo_refuses_bad_input_before_any_work(nothing_runs, capsys, extra, needles):
    assert main(["demo", "--no_progress", *extra]) == 2
    _one_line_error(capsys, "demo", *needles)


def test_the_demo_trains_where_grpo_loses_calibration_unless_told_otherwise(monkeypatch):
    """`capo-trl demo` with no arguments: guess-half at its piloted budget, seed 0; compare keeps arithmetic."""
    from capo_trl.harness import demo as demo_module

    seen = {}
    monkeypatch.setattr(demo_module, "demo", lambda budget, **kw: seen.update(budget=budget, **kw))
    assert main(["demo"]) == 0
    assert demo_module.DEMO_TASK == "guess-half" == seen["budget"].task and seen["seed"] == 0
    assert (seen["budget"].steps, seen["budget"].learning_rate) == (300, 4e-4)
    assert main(["demo", "--seed", "3", "--task", "arithmetic"]) == 0
    assert seen["seed"] == 3 and seen["budget"].task == "arithmetic" and seen["budget"].steps == 200
    from capo_trl.cli.main import build_parser

    assert build_parser().parse_args(["compare", "--out", "x"]).task == "arithmetic"


@pytest.mark.parametrize("extra, needles", [
    (["--limit", "0"], ["--limit"]), (["--n", "0"], ["--n"]), (["--max_new_tokens", "0"], ["--max_new_tokens"]),
    (["--n", "1", "--write_config", "x.yaml"], ["--n 1", "tau cannot be measured"]),
    (["--model", "/no/such/model"], ["/no/such/model", "no such directory"]),
    (["--benchmark", "missing.jsonl"], ["missing.jsonl"]),
    (["--column", "problem=question"], ["--dataset_columns", "arithmetic-train"]),  # the old spelling still parses
])
def test_calibrate_mask_refuses_bad_input_before_sampling(nothing_runs, capsys, tmp_path, monkeypatch, extra,
                                                          needles):
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate-mask", *extra]) == 2
    _one_line_error(capsys, "calibrate-mask", *needles)
    assert not (tmp_path / "x.yaml").exists()


def test_calibrate_mask_refuses_a_config_that_is_not_a_mapping(nothing_runs, capsys, tmp_path):
    for text, needle in (("- a\n- b\n", "a YAML list"), ("tau: [\n", "not valid YAML"), ("just text\n", "a YAML str")):
        config = tmp_path / "recipe.yaml"
        config.write_text(text)
        assert main(["calibrate-mask", "--write_config", str(config)]) == 2
        _one_line_error(capsys, "calibrate-mask", str(config), needle)
        assert config.read_text() == text
    assert main(["calibrate-mask", "--write_config", str(tmp_path / "no-dir" / "r.yaml")]) == 2
    _one_line_error(capsys, "calibrate-mask", "no-dir")


MEASURED = {"ref_high": 1.8, "ref_low": 1.02, "tau": 0.25, "score_spread": 0.25, "reference_auroc": 0.7,
            "reference_accuracy": 0.4, "ppl_correct_quartiles": [1.1, 1.3, 1.8],
            "ppl_wrong_quartiles": [1.02, 1.5, 2.0], "n_problems": 8, "n_samples": 32, "mixed_groups": 3}


def _measured(monkeypatch, **changes):
    from capo_trl.harness import calibrate_mask as mask

    monkeypatch.setattr(mask, "calibrate_mask", lambda *a, **k: {**MEASURED, **changes})


@pytest.mark.parametrize("changes, needle", [
    (dict(ref_high=float("nan"), ppl_correct_quartiles=None, reference_accuracy=0.0), "no correct answers"),
    (dict(ref_low=float("nan"), ppl_wrong_quartiles=None, reference_accuracy=1.0), "no wrong answers"),
    (dict(tau=float("nan"), score_spread=float("nan"), mixed_groups=0), "no group"),
    (dict(tau=0.0, score_spread=0.0), "tau"),
])
def test_calibrate_mask_never_writes_an_unmeasured_value(monkeypatch, capsys, tmp_path, changes, needle):
    _measured(monkeypatch, **changes)
    config = tmp_path / "recipe.yaml"
    config.write_text("tau: 0.6  # paper\n")
    assert main(["calibrate-mask", "--write_config", str(config)]) == 1
    err = capsys.readouterr().err
    assert needle in err and "--limit" in err and "nothing written" in err
    assert config.read_text() == "tau: 0.6  # paper\n"


def test_calibrate_mask_updates_only_the_lines_of_its_keys(monkeypatch, capsys, tmp_path):
    import yaml

    recipe = Path(__file__).resolve().parents[1] / "examples" / "recipes" / "capo-qwen2.5-math-1.5b.yaml"
    original = recipe.read_text().splitlines(keepends=True)
    config = tmp_path / "recipe.yaml"
    config.write_text("".join(original))
    _measured(monkeypatch)
    assert main(["calibrate-mask", "--write_config", str(config)]) == 0
    updated = config.read_text().splitlines(keepends=True)
    assert len(updated) == len(original)  # every key was already there: no line added or lost
    changed = [(a, b) for a, b in zip(original, updated) if a != b]
    from capo_trl.training.defaults import RECOMMENDED

    tau = {"tau": 0.25} if RECOMMENDED["tau_mode"] == "absolute" else {}  # a relative tau is not measured
    assert [b.split(":")[0] for _, b in changed] == [*tau, "ref_high", "ref_low"]
    assert all(b.split("#")[1:] == a.split("#")[1:] for a, b in changed)  # trailing comments kept
    parsed = yaml.safe_load(config.read_text())
    assert (parsed["ref_high"], parsed["ref_low"]) == (1.8, 1.02) and all(parsed[k] == v for k, v in tau.items())
    assert parsed["tau_mode"] == RECOMMENDED["tau_mode"] and parsed["ref_thresholds"] == "fixed"

    short = tmp_path / "short.yaml"
    short.write_text("# my recipe\nlearning_rate: 1.0e-6\ntau_mode: whatever   # was whatever\n")
    assert main(["calibrate-mask", "--write_config", str(short)]) == 0
    text = short.read_text()
    assert text.startswith(f"# my recipe\nlearning_rate: 1.0e-6\ntau_mode: {RECOMMENDED['tau_mode']}   # was whatever\n")
    written = {k: v for k, v in RECOMMENDED.items() if k not in ("advantage_estimator", "noise_mask")}
    assert yaml.safe_load(text) == {"learning_rate": 1e-6, **written, "ref_high": 1.8, "ref_low": 1.02, **tau}
    created = tmp_path / "new.yaml"
    assert main(["calibrate-mask", "--write_config", str(created)]) == 0
    assert yaml.safe_load(created.read_text())["tau"] == tau.get("tau", RECOMMENDED["tau"])


def test_calibrate_mask_says_when_the_recipe_keeps_the_mask_off(monkeypatch, capsys, tmp_path):
    """The embedded default's recipe trains without the mask: thresholds written there do nothing until it is on."""
    _measured(monkeypatch)
    recipe = Path(__file__).resolve().parents[1] / "examples" / "recipes" / "capo-arith-tiny-cpu.yaml"
    config = tmp_path / "recipe.yaml"
    config.write_text(recipe.read_text())
    assert main(["calibrate-mask", "--write_config", str(config)]) == 0
    assert "sets noise_mask: false, so the thresholds written apply only once it is true" in capsys.readouterr().err
    on = tmp_path / "on.yaml"
    on.write_text("noise_mask: true\n")
    assert main(["calibrate-mask", "--write_config", str(on)]) == 0
    assert "noise_mask: false" not in capsys.readouterr().err


def test_calibrate_mask_takes_a_device_checked_before_sampling(capsys):
    from capo_trl.cli.main import main

    assert main(["calibrate-mask", "--device", "cuda:7", "--limit", "2", "--n", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("capo-trl calibrate-mask: --device cuda:7") and "\n" not in err


def test_the_demo_budget_is_the_pilots_and_its_help_says_so(capsys):
    """`demo --help` names each task's demo budget, and a bare `demo --task guess-half` trains it."""
    from capo_trl.harness.demo import DEMO_BUDGETS, demo_budget

    import re

    page = (Path(__file__).resolve().parents[1] / "docs" / "results" / "demo-budget" / "README.md").read_text()
    steps, rate = re.search(r"\*\*Verdict: B\d+ \((\d+) steps at learning rate ([\d.e-]+)\) is the demo's budget", page).groups()
    assert DEMO_BUDGETS == {"guess-half": dict(steps=int(steps), learning_rate=float(rate))}
    budget = demo_budget("guess-half", steps=None, learning_rate=None)
    assert (budget.steps, budget.learning_rate, budget.val_every) == (300, 4e-4, 75)
    assert (demo_budget("arithmetic").steps, demo_budget("arithmetic").learning_rate) == (200, 2e-4)
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "300 on guess-half, else 200" in text and "4e-4 on guess-half, else 2e-4" in text
