"""Pictures where people look: the demo's PNG, train's calibration curves, the notebook's committed outputs."""

import struct
from pathlib import Path


from capo_trl.cli.main import main

ROOT = Path(__file__).resolve().parent.parent


def png_size(path: Path) -> tuple[int, int]:
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


# The demo's PNG (its size, and its path printed last) is checked on the demo run of
# test_demo.py::test_demo_compare_and_calibrate_mask_run_end_to_end: the same command, run once. What it draws is
# checked here, on the committed study and a made-up run.
BEFORE = {"accuracy": 0.29, "auroc": 0.87, "auroc_question": 0.68, "ece": 0.6}
RUN = [{"method": "grpo", "after": {"accuracy": 0.38, "auroc": 0.74, "auroc_question": 0.66, "ece": 0.5}},
       {"method": "capo", "after": {"accuracy": 0.40, "auroc": 0.84, "auroc_question": float("nan"), "ece": 0.5}}]


def _points(ax) -> list[tuple[float, float]]:
    return [tuple(map(float, xy)) for c in ax.collections for xy in c.get_offsets()]


def test_the_demo_picture_marks_the_direction_and_draws_the_committed_seeds_beside_this_run():
    from capo_trl.evaluation.plots import draw_demo
    from capo_trl.harness.demo import committed_study, demo_budget
    from capo_trl.harness.presets import parse_methods

    study = committed_study(demo_budget(), parse_methods("grpo,capo"))
    drawn = {"label": "committed study", "start": study["start"], "arms": study["arms"]}
    fig = draw_demo(BEFORE, RUN, "guess-half: this run", drawn, run_label="this run (seed 0)")
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["test split: pooled AUROC", "test split: per-question AUROC",
                                               "test split: accuracy"]
    assert all(ax.get_ylabel().endswith("(\u2191 higher is better)") for ax in axes)
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["start", "grpo", "capo"]
    for ax, key in zip(axes, ("auroc", "auroc_question", "accuracy")):
        points = _points(ax)
        for x, arm in ((1, "grpo"), (2, "capo")):  # every committed seed, left of this run's star
            seeds = sorted(y for px, y in points if x - 0.3 < px < x)
            assert len(seeds) == 12 and seeds == sorted(study["arms"][arm][key]["values"]), (key, arm)
        assert (0 - 0.18, study["start"][key]) in points
        stars = [(round(px, 2), y) for px, y in points if px % 1 > 0.1 and px % 1 < 0.3]
        run_values = [BEFORE[key]] + [r["after"][key] for r in RUN]
        assert stars == [(x + 0.18, v) for x, v in enumerate(run_values) if v == v]  # a NaN draws no star
        for container, arm in zip(ax.containers, ("grpo", "capo")):  # each arm's mean and 95% t interval
            c = study["arms"][arm][key]
            (_, low), (_, high) = container.lines[2][0].get_segments()[0]
            assert container.lines[0].get_ydata()[0] == c["mean"] and (low, high) == (c["low"], c["high"])
            assert c["low"] < c["mean"] < c["high"]
        assert len(ax.containers) == 2
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[0] == "this run (seed 0)" and {"study: one dot per seed", "study: mean, 95% t interval",
                                                 "study: start model"} <= set(legend)
    assert "against the committed study" in fig.get_suptitle()

    alone = draw_demo(BEFORE, RUN, "arithmetic: this run")  # no committed study of the task: said, nothing drawn
    assert "no committed study" in alone.get_suptitle()
    assert [t.get_text() for t in alone.legends[0].get_texts()] == ["this run"]
    assert all(ax.get_ylabel().endswith("higher is better)") for ax in alone.axes)


def test_demo_refuses_a_plot_path_that_is_not_a_png(capsys, tmp_path):
    assert main(["demo", "--plot", str(tmp_path / "demo.jpg")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"capo-trl demo: --plot {tmp_path / 'demo.jpg'}: give a file name ending in .png."


def test_train_with_a_calibration_dataset_writes_its_curves(tiny_model_dir, tmp_path, capsys):
    import json

    from test_train_cli import job

    from capo_trl.cli import train as capo_train

    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps({"problem": f"what is {i}?", "answer": str(i)}) + "\n" for i in range(8)))
    out = tmp_path / "out"
    capo_train.main(job(tiny_model_dir, str(data), out, "--max_steps", "2", "--save_strategy", "no",
                        "--calibration_dataset", str(data), "--calibration_every", "1", "--calibration_samples", "2",
                        "--calibration_limit", "4"))
    path = out / "calibration_curves.png"
    assert f"written to {path}" in capsys.readouterr().out
    assert png_size(path) == (round(9.0 * 120), round(3.6 * 120))  # plots.calibration_history's two panels
