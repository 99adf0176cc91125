"""Benchmark registry: local files in the shared schema or with a column mapping, templates, errors."""

import json

import datasets
import pytest
from datasets import Dataset

from capo_trl.data import benchmarks as data
from capo_trl.data.arithmetic import arithmetic_dataset
from capo_trl.data.benchmarks import (
    BENCHMARKS,
    QWEN_MATH_SYSTEM,
    BenchmarkError,
    load_benchmark,
    plain_math_prompt,
    qwen_math_prompt,
)

ROWS = [
    {"id": "a", "problem": "What is $1+1$?", "answer": "2", "answers": ["2"]},
    {"id": "b", "problem": "Give $x$ to two digits.", "answer": "0.01, 0.02", "answers": ["0.01", "0.02"]},
    {"id": "c", "problem": "Solve $x^2=9$, $x>0$.", "answer": "3", "answers": ["3"]},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_local_jsonl_in_shared_schema(tmp_path):
    ds = load_benchmark(str(write_jsonl(tmp_path / "bench.jsonl", ROWS)))
    assert ds.column_names == ["prompt", "answer", "id"]
    assert ds["id"] == ["a", "b", "c"]
    # "answers" wins: a row with several acceptable answers makes the column a list of lists
    assert ds["answer"] == [["2"], ["0.01", "0.02"], ["3"]]
    assert ds[0]["prompt"] == [{"role": "system", "content": QWEN_MATH_SYSTEM},
                               {"role": "user", "content": "What is $1+1$?"}]
    # one answer per row: a plain string column; limit keeps the first rows
    single = load_benchmark(str(write_jsonl(tmp_path / "one.jsonl", [ROWS[0], ROWS[2]])), limit=1)
    assert single["answer"] == ["2"] and len(single) == 1


def test_local_json_array_with_column_mapping_and_templates(tmp_path):
    rows = [{"uid": 7, "question": "Compute $2^5$.", "final_answer": 32.0},
            {"uid": 8, "question": "Compute $3^2$.", "final_answer": ["9", "9.0"]}]
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(rows))
    ds = load_benchmark(str(path), columns={"problem": "question", "answer": "final_answer", "id": "uid"},
                        template="plain")
    assert ds["id"] == ["7", "8"]
    assert ds["answer"] == [["32"], ["9", "9.0"]]  # integral floats lose ".0"; scalars join the list column
    assert ds["prompt"][0] == plain_math_prompt("Compute $2^5$.") == f"Compute $2^5$.\n{QWEN_MATH_SYSTEM}"
    raw = load_benchmark(str(path), columns={"problem": "question", "answer": "final_answer"}, template="raw")
    assert raw["prompt"] == ["Compute $2^5$.", "Compute $3^2$."] and raw["id"] == ["mine/0", "mine/1"]


def test_missing_column_names_dataset_column_and_fix(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "1+1?", "answer": "2"}])
    with pytest.raises(BenchmarkError) as err:
        load_benchmark(str(path))
    msg = str(err.value)
    assert str(path) in msg and "'problem'" in msg and "question" in msg and "columns={'problem'" in msg


def test_hub_name_offline_error_says_how_to_use_a_local_file():
    assert datasets.config.HF_HUB_OFFLINE, "tests must run offline (HF_HUB_OFFLINE=1)"
    with pytest.raises(BenchmarkError) as err:
        load_benchmark("MATH500")
    msg = str(err.value)
    assert "'math500'" in msg and "HuggingFaceH4/MATH-500" in msg and "HF_HUB_OFFLINE" in msg
    assert "load_benchmark('math500.jsonl')" in msg and "--dataset_name math500.jsonl" in msg


def test_hub_missing_column_error_names_the_hub_dataset(monkeypatch):
    fake = Dataset.from_dict({"question": ["1+1?"], "final_answer": [["2"]]})
    monkeypatch.setattr(data, "_load_hub", lambda spec, split: fake)
    with pytest.raises(BenchmarkError, match=r"HuggingFaceH4/MATH-500.*no column 'problem'.*local copy"):
        load_benchmark("math500")
    ds = load_benchmark("math500", columns={"problem": "question", "answer": "final_answer", "id": "question"})
    assert ds[0]["answer"] == "2" and ds[0]["prompt"] == qwen_math_prompt("1+1?")


def test_registry_specs_and_name_errors(tmp_path):
    assert {"math500", "aime24", "aime25", "amc23", "minerva", "olympiadbench", "deepscaler",
            "arithmetic"} <= set(BENCHMARKS)
    assert (BENCHMARKS["olympiadbench"].hub_id, BENCHMARKS["olympiadbench"].answer) == (
        "Hothan/OlympiadBench", "final_answer")
    assert BENCHMARKS["amc23"].problem == BENCHMARKS["minerva"].problem == "question"
    with pytest.raises(BenchmarkError, match="Unknown benchmark 'gsm9k'.*math500"):
        load_benchmark("gsm9k")
    with pytest.raises(BenchmarkError, match="not found"):
        load_benchmark(str(tmp_path / "absent.jsonl"))
    path = write_jsonl(tmp_path / "x.jsonl", ROWS)
    with pytest.raises(BenchmarkError, match="split"):
        load_benchmark(str(path), split="test")
    with pytest.raises(BenchmarkError, match="unknown role"):
        load_benchmark(str(path), columns={"question": "problem"})


def test_arithmetic_is_a_registry_name():
    ds = load_benchmark("arithmetic", limit=4)
    ref = arithmetic_dataset(split="test", n=4)
    assert ds["prompt"] == ref["prompt"] and ds["answer"] == ref["answer"]
    assert ds["id"] == [f"arithmetic/{i}" for i in range(4)]
    assert load_benchmark("arithmetic", limit=2, template="qwen_math")[0]["prompt"][1]["content"] == ref[0]["prompt"]


def test_embedded_model_path(tmp_path, monkeypatch):
    from capo_trl.data import arithmetic

    monkeypatch.setattr(arithmetic, "EMBEDDED_MODEL_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="pretrain_tiny.py"):
        arithmetic.embedded_model_path()
    (tmp_path / "config.json").write_text("{}")
    assert arithmetic.embedded_model_path() == str(tmp_path)


def test_char_tokenizer_round_trips_next_to_a_qwen2_config(tmp_path):
    """transformers 5 reloads it as Qwen2Tokenizer; spaces and backslashes must survive that."""
    from transformers import AutoTokenizer, Qwen2Config

    from capo_trl.data.arithmetic import char_tokenizer

    tokenizer = char_tokenizer()
    text = "Compute 35+8-27. 35+8=43. \\boxed{16}"
    tokenizer.save_pretrained(tmp_path)
    Qwen2Config(vocab_size=len(tokenizer)).save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded(text).input_ids == tokenizer(text).input_ids
    assert len(tokenizer(text).input_ids) == len(text)  # one token per character
    assert reloaded.decode(reloaded(text).input_ids) == text
