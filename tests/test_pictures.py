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
# test_demo.py::test_demo_compare_and_calibrate_mask_run_end_to_end: the same command, run once.


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
