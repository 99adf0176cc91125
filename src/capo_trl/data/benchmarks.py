"""Datasets: the benchmark registry (hub datasets, the embedded arithmetic task, local files), prompt
templates and column mapping, all normalised to one ``prompt``/``answer``/``id`` schema."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: `capo-trl --help` must not load datasets (seconds)
    from datasets import Dataset

from .addition import addition_prompt
from ..errors import UsageError, did_you_mean
from .tasks import TASKS, get_task

# ------------------------------------------------------------------------------------------------
# Benchmark registry: hub datasets, the arithmetic task and local files, one normalised schema.
# ------------------------------------------------------------------------------------------------

QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."


def qwen_math_prompt(problem: str) -> list[dict]:
    """The Qwen2.5-Math evaluation prompt, conversational: the tokenizer's chat template renders it."""
    return [{"role": "system", "content": QWEN_MATH_SYSTEM}, {"role": "user", "content": problem}]


def plain_math_prompt(problem: str) -> str:
    """The same instruction as plain text, for base models without a chat template."""
    return f"{problem}\n{QWEN_MATH_SYSTEM}"


def raw_prompt(problem: str) -> str:
    """The problem unchanged (the arithmetic demo model is trained on bare problems)."""
    return problem


PROMPT_TEMPLATES = {"qwen_math": qwen_math_prompt, "plain": plain_math_prompt, "raw": raw_prompt,
                    "addition_chat": addition_prompt}
DEFAULT_TEMPLATE = "qwen_math"  # of a math dataset that names none (the arithmetic task's is "raw")
ROLES = ("problem", "answer", "id")
TRAIN_ROLES = (*ROLES, "solution")  # capo-trl train also names the column TRL's accuracy_reward reads


class BenchmarkError(UsageError):
    """A benchmark cannot be loaded as asked; the message says how to fix it."""


def parse_column(text: str, flag: str | None = None) -> tuple[str, str]:
    """One ``ROLE=NAME`` pair of a column mapping as ``(role, name)`` (surrounding spaces dropped)."""
    role, sep, name = (part.strip() for part in str(text).partition("="))
    if not sep or not role or not name:
        where = f"{flag}: " if flag else ""
        raise BenchmarkError(f"{where}expected ROLE=NAME (e.g. problem=question), got {text!r}.")
    return role, name


def parse_columns(pairs, flag: str = "columns", roles: tuple[str, ...] = ROLES) -> dict[str, str] | None:
    """``["problem=question", ...]`` -> ``{"problem": "question", ...}`` (None when empty); roles are checked."""
    mapping = dict(parse_column(pair, flag) for pair in pairs or [])
    _check_roles(mapping, flag, roles)
    return mapping or None


def _check_roles(mapping: dict, flag: str, roles: tuple[str, ...] = ROLES) -> None:
    unknown = sorted(set(mapping) - set(roles))
    if unknown:
        raise BenchmarkError(f"{flag}: unknown role {', '.join(map(repr, unknown))}; map any of {roles} to a column "
                             "name.")


def prompt_template(name: str):
    """The function of :data:`PROMPT_TEMPLATES` called ``name``; a BenchmarkError naming the choices otherwise."""
    if name not in PROMPT_TEMPLATES:
        raise BenchmarkError(f"template={name!r}; expected one of {sorted(PROMPT_TEMPLATES)}.")
    return PROMPT_TEMPLATES[name]


@dataclass(frozen=True)
class BenchmarkSpec:
    """Where a benchmark lives and which of its columns hold the problem, gold answer(s) and id.

    ``id`` may be None (ids become ``"<name>/<row>"``). ``answer`` may name a column of lists:
    every entry is an acceptable answer, as :class:`capo_trl.rewards.MathReward` grades them.
    """

    name: str
    hub_id: str | None = None
    split: str = "test"
    problem: str = "problem"
    answer: str = "answer"
    id: str | None = None
    config: str | None = None
    template: str = DEFAULT_TEMPLATE


BENCHMARKS: dict[str, BenchmarkSpec] = {
    spec.name: spec
    for spec in (
        BenchmarkSpec("math500", "HuggingFaceH4/MATH-500", id="unique_id"),
        BenchmarkSpec("aime24", "HuggingFaceH4/aime_2024", split="train", id="id"),
        BenchmarkSpec("aime25", "math-ai/aime25", id="id"),
        BenchmarkSpec("amc23", "math-ai/amc23", problem="question", id="id"),
        BenchmarkSpec("minerva", "math-ai/minervamath", problem="question"),
        BenchmarkSpec("olympiadbench", "Hothan/OlympiadBench", split="train", problem="question",
                      answer="final_answer", id="id", config="OE_TO_maths_en_COMP"),
        BenchmarkSpec("deepscaler", "agentica-org/DeepScaleR-Preview-Dataset", split="train"),
        # the embedded tasks, registered in capo_trl.data.tasks: no hub id, generated splits train/validation/test
        *(BenchmarkSpec(name, None, template=task.template) for name, task in TASKS.items()),
    )
}
_ALIASES = {"math-500": "math500", "aime2024": "aime24", "aime2025": "aime25", "amc2023": "amc23",
            "minervamath": "minerva", "olympiad": "olympiadbench", "deepscaler-preview": "deepscaler"}
_EMBEDDED_DEFAULT_SIZE = 500  # problems of an embedded task's split when no limit is given
LOCAL_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet")  # the local files load_benchmark reads


def registry_key(name: str) -> str | None:
    """The :data:`BENCHMARKS` name that ``name`` means (case-insensitive, aliases accepted), or None."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    return key if key in BENCHMARKS else None


def embedded_task(name: str) -> str | None:
    """The :mod:`capo_trl.data.tasks` name a dataset name means (a registry name with no hub id), or None."""
    key = registry_key(name)
    return key if key is not None and BENCHMARKS[key].hub_id is None else None


def dataset_kind(name: str) -> str:
    """``"registry"`` (a :data:`BENCHMARKS` name), ``"local"`` (a file name ending in :data:`LOCAL_SUFFIXES`)
    or ``"hub"`` (anything else)."""
    if registry_key(name) is not None:
        return "registry"
    return "local" if Path(name).suffix.lower() in LOCAL_SUFFIXES else "hub"


def load_benchmark(name_or_path: str, split: str | None = None, limit: int | None = None,
                   columns: dict[str, str] | None = None, template: str | None = None,
                   keep_columns: bool = False) -> Dataset:
    """A benchmark as a dataset with columns ``prompt``, ``answer`` and ``id`` (all else dropped).

    ``name_or_path``: a registry name (:data:`BENCHMARKS`, case-insensitive), or a local
    ``.json``/``.jsonl`` (list of objects or one per line), ``.csv`` or ``.parquet`` file in the
    schema ``{"id", "problem", "answer", "answers"}`` (``answers`` wins over ``answer``).
    ``columns`` maps roles ``problem``/``answer``/``id`` to other column names.
    ``template``: ``"qwen_math"`` (conversational, the default for math), ``"plain"`` or ``"raw"``.
    ``answer`` is a string, or a list of acceptable answers when some row has several.

    ``keep_columns`` (what ``capo-trl train`` asks for a local file, TRL's way): every other column
    is kept, for the reward functions; and a file that already has a ``prompt`` column (text, or
    a list of chat messages) and no mapped ``problem`` is used as is (:func:`trl_format`).
    """
    spec = _resolve(name_or_path)
    template_given = template
    _check_roles(columns or {}, "columns", TRAIN_ROLES if keep_columns else ROLES)
    template = template or (spec.template if spec else DEFAULT_TEMPLATE)
    prompt_template(template)  # a bad name fails before anything loads
    if limit is not None and limit < 1:
        raise BenchmarkError(f"limit must be >= 1, got {limit}.")
    if spec is not None and spec.hub_id is None:  # an embedded task
        ds = get_task(spec.name).dataset(split or "test", limit or _EMBEDDED_DEFAULT_SIZE)
        return normalise(ds, {"problem": "prompt", "answer": "answer", "id": None}, template, name=spec.name,
                         keep_columns=keep_columns)
    if spec is not None:
        mapping = {"problem": spec.problem, "answer": spec.answer, "id": spec.id, **(columns or {})}
        ds = _load_hub(spec, split or spec.split)
        source = f"{spec.hub_id!r} (benchmark {spec.name!r}, split {split or spec.split!r})"
        name, hint = spec.name, " " + _local_hint(spec.name)
    else:
        if split is not None:
            raise BenchmarkError(f"split={split!r} does not apply to a local file ({name_or_path}): "
                                 "give each split its own file.")
        ds = _load_local(Path(name_or_path))
        if keep_columns and uses_prompt_column(ds, columns):
            return trl_format(ds, columns, limit=limit, source=repr(str(name_or_path)), template=template_given)
        mapping = {"problem": "problem", "answer": "answers" if "answers" in ds.column_names else "answer",
                   "id": "id" if "id" in ds.column_names else None, **(columns or {})}
        if keep_columns and mapping["answer"] not in ds.column_names and not (columns or {}).get("answer"):
            mapping["answer"] = None  # no gold: fine for reward functions that need none (train checks them)
        source, name, hint = repr(str(name_or_path)), Path(name_or_path).stem, ""
    return normalise(ds, mapping, template, name=name, source=source, limit=limit, hint=hint,
                     keep_columns=keep_columns)


def uses_prompt_column(ds: Dataset, columns: dict[str, str] | None = None) -> bool:
    """True for TRL's own format: a ``prompt`` column, and no ``problem`` role mapped to another column."""
    return "prompt" in ds.column_names and not (columns or {}).get("problem")


def trl_format(ds: Dataset, columns: dict[str, str] | None = None, *, limit: int | None = None,
               source: str = "dataset", template: str | None = None) -> Dataset:
    """A dataset in TRL's format (a ``prompt`` column: text, or a list of ``{"role", "content"}`` messages)
    used as is: every column is kept (GRPOTrainer passes them to the reward functions as keyword
    arguments); a mapped role (``answer=final``, ``solution=...``, ``id=...``) adds that column under
    the role's name. ``template`` must be None: the prompts are already written."""
    if template is not None:
        raise BenchmarkError(f"Dataset {source} has a 'prompt' column, used as is; prompt_template applies to a "
                             "problem column only: drop prompt_template, or map problem=COLUMN to build prompts from "
                             "another column.")
    columns = dict(columns or {})
    for role, col in columns.items():
        if col not in ds.column_names:
            raise BenchmarkError(f"Dataset {source} has no column {col!r} for the {role} (columns: "
                                 f"{', '.join(ds.column_names)}). Name the column that holds it: ROLE=NAME.")
    if limit is not None:
        if limit < 1:
            raise BenchmarkError(f"limit must be >= 1, got {limit}.")
        ds = ds.select(range(min(limit, len(ds))))
    for i, prompt in enumerate(ds["prompt"][:1000]):
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(
                isinstance(m, dict) and "role" in m and "content" in m for m in prompt))):
            raise BenchmarkError(f"Dataset {source}: row {i}'s prompt is a {type(prompt).__name__}, not text nor a "
                                 "list of {'role', 'content'} messages (TRL's standard and conversational formats).")
    for role, col in columns.items():
        if col != role:
            values = ds[col]
            ds = ds.remove_columns([role]) if role in ds.column_names else ds
            ds = ds.add_column(role, values)
    return ds


def _resolve(name_or_path: str) -> BenchmarkSpec | None:
    """Registry spec for a name; None for a local file; a helpful error for anything else."""
    kind = dataset_kind(name_or_path)
    if kind == "registry":
        return BENCHMARKS[registry_key(name_or_path)]
    if kind == "local":
        if not Path(name_or_path).is_file():
            raise BenchmarkError(f"Benchmark file not found: {Path(name_or_path)}.")
        return None
    guess = did_you_mean(str(name_or_path).lower(), sorted(BENCHMARKS))
    raise BenchmarkError(
        f"Unknown benchmark {name_or_path!r}{f' ({guess})' if guess else ''}: not a registered name "
        f"({', '.join(sorted(BENCHMARKS))}) nor a local file ending in {', '.join(LOCAL_SUFFIXES)}."
    )


def _local_hint(name: str) -> str:
    return (
        f"To use a local copy instead, pass its path: load_benchmark('{name}.jsonl') (CLI: --dataset_name "
        f"{name}.jsonl), one JSON object per line with keys \"id\", \"problem\", \"answer\" (or \"answers\", a "
        "list of acceptable answers); for other column names add columns={'problem': ..., 'answer': ..., 'id': ...}."
    )


def _load_hub(spec: BenchmarkSpec, split: str) -> Dataset:
    import datasets

    try:
        return datasets.load_dataset(spec.hub_id, spec.config, split=split)
    except Exception as err:  # offline, unreachable, gated, renamed: all end the same way for the user
        offline = " (HF_HUB_OFFLINE is set)" if datasets.config.HF_HUB_OFFLINE else ""
        raise BenchmarkError(
            f"Could not load benchmark {spec.name!r} from the hub dataset {spec.hub_id!r}"
            f"{f' config {spec.config!r}' if spec.config else ''}, split {split!r}{offline}: "
            f"{type(err).__name__}: {err}. {_local_hint(spec.name)}"
        ) from err


def _load_local(path: Path) -> Dataset:
    """JSON is read with the json module, not ``load_dataset('json')``: gold answers mix strings,
    numbers and lists across rows, which Arrow's per-file schema inference rejects."""
    from datasets import Dataset

    suffix = path.suffix.lower()
    if suffix in (".csv", ".parquet"):
        try:
            ds = Dataset.from_csv(str(path)) if suffix == ".csv" else Dataset.from_parquet(str(path))
        except Exception as err:  # pyarrow/pandas raise many types for one cause: the file is not what it says
            raise BenchmarkError(f"{path}: cannot be read as {suffix[1:]} ({type(err).__name__}: "
                                 f"{str(err).splitlines()[0] if str(err) else ''}).") from err
        if len(ds) == 0:
            raise BenchmarkError(f"{path}: the file has no rows.")
        return ds
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise BenchmarkError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8.") from err
    try:
        rows = json.loads(text) if text.lstrip().startswith("[") else [
            json.loads(line) for line in text.splitlines() if line.strip()
        ]
    except json.JSONDecodeError as err:
        raise BenchmarkError(f"{path}: not valid JSON or JSON Lines ({err}).") from err
    if not rows or not all(isinstance(r, dict) for r in rows):
        raise BenchmarkError(f"{path}: expected a non-empty list of JSON objects (one problem each).")
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return Dataset.from_dict({k: _column([r.get(k) for r in rows]) for k in keys})


def _column(values: list) -> list:
    """One Arrow-storable column: text scalars, or lists of text when any row holds a list.

    Chat messages (every value a list of dicts, or a dict) are kept as they are: TRL's conversational prompts."""
    present = [v for v in values if v is not None]
    if present and (all(isinstance(v, dict) for v in present) or all(
            isinstance(v, list) and v and all(isinstance(m, dict) for m in v) for v in present)):
        return values
    if any(isinstance(v, (list, tuple)) for v in values):
        return [_gold_list(v if isinstance(v, (list, tuple)) else [v]) for v in values]
    return [v if v is None or isinstance(v, str) else _answer_text(v) for v in values]


def _answer_text(v) -> str:
    """Gold answers as text; integral floats (AMC23 stores 27.0) lose the ``.0``."""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def normalise(ds: Dataset, mapping: dict, template: str = DEFAULT_TEMPLATE, *, name: str = "dataset",
              source: str | None = None, limit: int | None = None, hint: str = "",
              keep_columns: bool = False) -> Dataset:
    """``ds`` as columns ``prompt``/``answer``/``id`` (all else dropped), the one schema of every loader.

    ``keep_columns``: every other column follows them (for the reward functions, as TRL passes
    them), and a mapped ``solution`` role is added as a ``solution`` column.

    ``mapping`` names the column of each role (``problem`` required; ``answer`` None: no gold column,
    for reward functions that need none; ``id`` None: ids become ``"<name>/<row>"``); a missing column is a BenchmarkError naming ``source``
    (default: ``name``) and ending with ``hint``. The problem becomes a prompt by ``template`` (a
    :data:`PROMPT_TEMPLATES` name); gold answers become text, or lists of text when some row has several.
    """
    make_prompt = prompt_template(template)
    source = repr(name) if source is None else source
    for role in TRAIN_ROLES if keep_columns else ROLES:
        col = mapping.get(role)
        if col is not None and col not in ds.column_names:
            raise BenchmarkError(
                f"Benchmark {source} has no column {col!r} for the {role} (columns: {', '.join(ds.column_names)}). "
                f"Pass columns={{'{role}': '<your column>'}} to name the column that holds it.{hint}"
            )
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    problems = [str(p) for p in ds[mapping["problem"]]]
    golds = [_gold_list(a) for a in ds[mapping["answer"]]] if mapping.get("answer") else None
    ids = [str(i) for i in ds[mapping["id"]]] if mapping.get("id") else [f"{name}/{i}" for i in range(len(ds))]
    out = {"prompt": [make_prompt(p) for p in problems]}
    if golds is not None:
        several = any(len(g) != 1 for g in golds)
        out["answer"] = golds if several else [g[0] for g in golds]
    out["id"] = ids
    if keep_columns:
        if mapping.get("solution"):
            out["solution"] = ds[mapping["solution"]]
        used = {mapping.get(role) for role in TRAIN_ROLES}
        out.update({col: ds[col] for col in ds.column_names if col not in out and col not in used})
    from datasets import Dataset

    return Dataset.from_dict(out)


def _gold_list(value) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [_answer_text(v) for v in value if v is not None]
    return [] if value is None else [_answer_text(value)]
