"""The fast path of `capo-trl train` (cli/train_flags.py) agrees with the real parser it describes."""

import importlib.util
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from capo_trl.cli import train_flags
from capo_trl.cli.train_args import make_parser
from capo_trl.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def parser():
    return make_parser()


@pytest.fixture(scope="module")
def flags(parser):
    return [s for action in parser._actions for s in action.option_strings]


def test_the_committed_file_describes_the_real_parsers():
    spec = importlib.util.spec_from_file_location("train_flags_script", ROOT / "scripts" / "train_flags.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.FILE.read_text(encoding="utf-8") == script.current(), "stale: run python scripts/train_flags.py"


def test_the_fast_help_is_the_real_parsers_help(parser, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    fast = train_flags.help_parser(train_flags.load()).format_help()
    assert fast == parser.format_help()
    assert "use_cpu defaults to True" in fast and "--learning_rate LEARNING_RATE" in fast


def test_unknown_flags_come_with_their_values_and_prefixes_are_unknown():
    known = ["--learning_rate", "--learning-rate", "--max_steps", "-h", "--help"]
    assert train_flags.unknown_flags(["--lerning_rate", "1e-5", "--max_steps", "3"], known) == ["--lerning_rate", "1e-5"]
    # no abbreviations (the real parser has allow_abbrev=False): a prefix is a slip, refused with its value
    assert train_flags.unknown_flags(["--learning_rat", "1e-5", "--max=3"], known) == ["--learning_rat", "1e-5", "--max=3"]
    assert train_flags.unknown_flags(["--bogus=1", "-1", "-.5", "-h", "x"], known) == ["--bogus=1", "-1", "-.5"]
    assert train_flags.unknown_flags(["--max_steps", "--", "--bogus"], known) == []  # after --: positional strings
    assert train_flags.unknown_flags(["--num_processes", "2"], known, exact={"--num_processes"}) == []
    assert train_flags.unknown_flags(["--num_process", "2"], known, exact={"--num_processes"}) == ["--num_process", "2"]


@pytest.mark.parametrize("argv, expected", [
    (["--lerning_rate", "1e-5"], "unknown flag --lerning_rate; did you mean --learning_rate?"),
    (["--learning_rat", "1e-5"], "unknown flag --learning_rat; did you mean --learning_rate?"),
    (["--num_processes", "2"], "unknown flag --num_processes; an `accelerate launch` flag: it needs "
                               "--accelerate_config NAME|PATH."),  # accelerate's, only with --accelerate_config
    (["--bogus", "1"], "unknown flag --bogus; flags are the fields of ScriptArguments, CAPOConfig (every GRPOConfig "
                       "field) and trl.ModelConfig: see `capo-trl train --help`."),
    (["--tua", "0.5", "--bogus"], "unknown flags --tua (did you mean --tau?), --bogus; flags are the fields of "
                                  "ScriptArguments, CAPOConfig (every GRPOConfig field) and trl.ModelConfig: see "
                                  "`capo-trl train --help`."),
])
def test_an_unknown_flag_is_refused_in_one_line(flags, argv, expected):
    with pytest.raises(UsageError) as err:
        train_flags.check_flags(argv, flags, train_flags.load()["launch_flags"])
    assert str(err.value) == expected
    train_flags.check_flags(["--accelerate_config", "zero3", "--num_processes", "2"], flags,
                            train_flags.load()["launch_flags"])


def test_an_unknown_recipe_key_is_refused_before_trl(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("learning_rate: 1.0e-6\ntua: 0.5\n")
    with pytest.raises(UsageError, match=r"Recipe .*r.yaml: unknown field\(s\) 'tua' \(did you mean 'tau'\?\)"):
        train_flags.precheck(["--config", str(recipe)])


_TOKENS = st.sampled_from(["--learning_rate", "--learning_rat", "--lerning_rate", "--max_steps", "--max_step",
                           "--tau", "--ta", "--bogus", "--bogus=1", "--tau=0.5", "--run_name", "--", "-1", "3",
                           "0.5", "x", "--use_cpu", "--no_remove_unused_columns", "--dataset_name", "-x"])


@settings(max_examples=200, deadline=None)
@given(argv=st.lists(_TOKENS, max_size=6))
def test_the_fast_check_refuses_only_what_the_real_parser_leaves_unused(parser, flags, argv):
    """Every command the real parser takes whole passes the fast check; what it refuses is what TRL leaves over."""
    try:
        _, extras = parser.parse_known_args(argv)
    except UsageError:  # ambiguous prefix, missing or bad value: refused by the real parser anyway
        return
    unused = train_flags.unknown_flags(argv, flags)
    if not extras:
        assert unused == []
    assert all(arg in extras for arg in unused)
    if "--" not in argv:  # before it, each unused "--name" is an unknown flag, and the fast check names it
        assert bool(unused) == any(a.startswith("--") and a.split("=")[0] not in flags for a in extras)
