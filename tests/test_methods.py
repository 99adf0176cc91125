"""The plug-in boundary: a method written outside the package trains through Python and `capo-trl train`."""

import json

import pytest
from test_train_cli import job, problems_file  # noqa: F401  (fixture)

from capo_trl import CAPOConfig
from capo_trl.cli import main as cli
from capo_trl.methods import METHODS, register_method, resolve_method

BASE = dict(output_dir="/tmp/capo-methods-test", use_cpu=True, bf16=False, report_to="none")


def test_resolve_by_name_and_by_path():
    from plugin_method import ScaledGRPO

    assert resolve_method("capo") is METHODS["capo"]
    assert resolve_method("plugin_method:ScaledGRPO") is ScaledGRPO
    with pytest.raises(ValueError, match=r"advantage_estimator='ppo' is invalid; choose one of \[.*'capo'"):
        resolve_method("ppo")
    with pytest.raises(ValueError, match="cannot load it"):
        resolve_method("plugin_method:Nope")
    with pytest.raises(ValueError, match="not a subclass of capo_trl.methods.Method"):
        resolve_method("json:loads")


def test_method_settings_are_validated_at_config_time():
    cfg = CAPOConfig(advantage_estimator="plugin_method:ScaledGRPO", method_kwargs={"scale": 0.5}, **BASE)
    assert cfg.noise_mask is False and cfg.method_kwargs == {"scale": 0.5}
    with pytest.raises(ValueError, match=r"method_kwargs: \['scal'\] are not settings"):
        CAPOConfig(advantage_estimator="plugin_method:ScaledGRPO", method_kwargs={"scal": 0.5}, **BASE)
    with pytest.raises(ValueError, match=r"method_kwargs.scale=-1 is invalid"):
        CAPOConfig(advantage_estimator="plugin_method:ScaledGRPO", method_kwargs='{"scale": -1}', **BASE)
    with pytest.raises(ValueError, match="method_kwargs is for methods defined outside"):
        CAPOConfig(advantage_estimator="cde", method_kwargs={"cde_omega": 1.0}, **BASE)
    with pytest.raises(ValueError, match="CAPOConfig.cde_kappa=0 is invalid"):  # built-in fields, any method
        CAPOConfig(advantage_estimator="capo", cde_kappa=0, **BASE)


def test_register_by_name():
    from plugin_method import ScaledGRPO

    register_method(ScaledGRPO)
    try:
        assert CAPOConfig(advantage_estimator="scaled_grpo", **BASE).advantage_estimator == "scaled_grpo"
        assert register_method(ScaledGRPO) is ScaledGRPO  # idempotent for the same class
    finally:
        METHODS.pop("scaled_grpo")


def test_a_user_method_trains_through_the_cli(tiny_model_dir, problems_file, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "out"
    argv = job(tiny_model_dir, problems_file, out, "--max_steps", "2", "--noise_mask", "false",
               "--advantage_estimator", "plugin_method:ScaledGRPO", "--method_kwargs", '{"scale": 0.5}')
    assert cli.main(["train", *argv]) == 0
    history = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    assert [row["plugin/scale"] for row in history if "loss" in row] == [0.5, 0.5]
    capsys.readouterr()
    bad = job(tiny_model_dir, problems_file, tmp_path / "bad", "--advantage_estimator", "plugin_method:ScaledGRPO",
              "--method_kwargs", '{"scal": 0.5}')
    assert cli.main(["train", *bad]) == 2
    err = capsys.readouterr().err.strip()
    assert "scal" in err and "\n" not in err


def test_tied_truncated_pairs_need_the_flags():
    """A caller of the capo method outside the trainer that asks for tied pairs must say which rows were cut."""
    import torch

    from capo_trl.methods.base import AdvantageInputs
    from capo_trl.methods.capo import CAPO

    method = CAPO(CAPOConfig(truncated_pairs="tied", tau=0.6, tau_mode="absolute", advantage_scale="paper", **BASE))
    rewards, scores = torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([-0.1, -0.3, -2.0, -0.2])
    with pytest.raises(ValueError, match="truncated_pairs='tied' needs AdvantageInputs.truncated"):
        method.advantages(AdvantageInputs(rewards, scores, 4, torch.zeros(4)))
    adv, _ = method.advantages(AdvantageInputs(rewards, scores, 4, torch.zeros(4),
                                               truncated=torch.tensor([False, False, True, False])))
    assert adv[2] < adv[1] < 0  # the truncated wrong answer, tied, is charged more than the confident wrong one
