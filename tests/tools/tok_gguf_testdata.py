#!/usr/bin/env python3
"""Tokenizer-only GGUF files for tests/test_tokenizer_gguf.c, written with gguf-py's
GGUFWriter the way llama.cpp's convert_hf_to_gguf.py writes the tokenizer of a
text-encoder GGUF (metadata only: general.architecture and the tokenizer.* keys, no
tensors, as a --vocab-only conversion writes). Run from the repository root:

    /work/venv-flux3/bin/python tests/tools/tok_gguf_testdata.py

Versions used: gguf-py 0.19.0, transformers 5.24.0, tokenizers 0.23.3 (the venv
/work/venv-flux3; `pip install gguf==0.19.0 transformers==5.24.0` in any venv gives the
same files). Writes tests/data/tok-gguf/:

  qwen3.gguf.xz          the real Qwen3 tokenizer (tests/data/qwen3-tokenizer) as the
                         converter writes it for Qwen3-4B / 8B (FLUX.2-klein's encoders):
                         the HF path (TextModel._set_vocab_gpt2 -> get_vocab_base):
                         tokenizer.ggml.model "gpt2", .pre "qwen2" (checked by hand: the
                         converter's pre-tokenizer hash of this tokenizer, sha256 of the ids of
                         its check text, is e636dc30..., which its table names "qwen2"), .tokens for ids
                         0..vocab_size-1 (vocab_size 151936 from Qwen3-4B's config.json;
                         ids without a token are "[PAD<i>]", type UNUSED), vocabulary
                         entries byte-level mapped (NORMAL), added tokens as their text
                         (CONTROL when special or looking special, else USER_DEFINED),
                         .token_type, then gguf.SpecialVocab (gguf-py's own class, what the
                         converter calls): .merges, bos/eos/pad ids, add_bos_token, the
                         chat template. Stored xz-compressed (the test unpacks it).
  tekken-hf.gguf         tests/data/tekken-mini/hf (tokenizer.json + tokenizer_config.json)
                         converted on the same HF path, pre "tekken" (what the converter
                         names a Tekken tokenizer).
  fuzz/corpus/gguf/tok-{qwen2,tekken}.gguf   small seeds for fuzz/fuzz_gguf.c (which also
                         builds a tokenizer from each parsed file): the 256 byte tokens, a
                         few merges and control tokens, pad/bos ids.
  tekken-mistral.gguf    tests/data/tekken-mini/tekken/tekken.json converted on the
                         converter's mistral-format path (_set_vocab_mistral with gguf-py's
                         MistralVocab rules, reimplemented here since mistral-common is not
                         installed): specials 0..S-1 as CONTROL (their token_str, the rest
                         <SPECIAL_i>), then the used ranks byte-level mapped (NORMAL),
                         merges derived from the ranks, bos/eos/unk/pad ids, zero scores,
                         llama.vocab_size, add_bos true, add_eos false. (One deviation: the
                         converter refuses a token that no split into two tokens makes; the
                         mini vocabulary's "://" is such a token on purpose, and gets no merge.)
"""
import json, lzma, os, shutil, sys, tempfile
from pathlib import Path
import gguf
from gguf import TokenType
from gguf.vocab import bytes_to_unicode
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent.parent
OUT = ROOT / "tests/data/tok-gguf"
QWEN = ROOT / "tests/data/qwen3-tokenizer"
TEKKEN = ROOT / "tests/data/tekken-mini"
# Qwen3-4B's config.json (the converter reads vocab_size and the special ids from it)
QWEN3_4B_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151645,
                   "vocab_size": 151936}


def looks_special(text):
    """The converter's rule for added tokens that are control tokens though not marked special."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
            or (text.startswith("<unused") and text.endswith(">")))


def hf_tokens(tok, vocab_size):
    """Token strings and types for ids 0..vocab_size-1, on the converter's HF path."""
    rev = {i: s for s, i in tok.vocab.items()}
    added = tok.get_added_vocab()
    dec = tok.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in rev:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
            continue
        s = rev[i]
        if s in added:
            if not dec[i].normalized:
                s = tok.decode(tok.encode(s, add_special_tokens=False))
            if dec[i].special or looks_special(s):
                types.append(TokenType.CONTROL)
            else:
                s = s.replace("\u2581", " ")
                types.append(TokenType.USER_DEFINED)
        else:
            types.append(TokenType.NORMAL)
        tokens.append(s)
    return tokens, types


def model_dir(tok_dir, config):
    """A folder like a model's: the tokenizer files plus a config.json (if given)."""
    d = Path(tempfile.mkdtemp())
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if (tok_dir / f).is_file():
            shutil.copy(tok_dir / f, d / f)
    if config:
        (d / "config.json").write_text(json.dumps(config))
    return d


def write_hf(path, tok_dir, arch, pre, config, vocab_size=None):
    d = model_dir(tok_dir, config)
    tok = AutoTokenizer.from_pretrained(str(d))
    if vocab_size is None:
        vocab_size = (config or {}).get("vocab_size", len(tok.vocab))
    tokens, types = hf_tokens(tok, vocab_size)
    special = gguf.SpecialVocab(d, load_merges=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    special.add_to_gguf(w, quiet=True)
    finish(w)
    shutil.rmtree(d)


def tekken_piece_str(b, enc):
    return "".join(enc[x] for x in b)


def write_tekken_mistral(path, tekken_json):
    """The converter's --mistral-format path for a Tekken tokenizer."""
    j = json.loads(Path(tekken_json).read_text())
    cfg = j["config"]
    n_special = cfg["default_num_special_tokens"]
    vocab_size = cfg["default_vocab_size"]
    n_inner = vocab_size - n_special
    import base64
    ranks = [base64.b64decode(v["token_bytes"]) for v in j["vocab"][:n_inner]]
    rank_of = {t: r for r, t in enumerate(ranks)}
    named = {s["rank"]: s["token_str"] for s in j.get("special_tokens", [])}
    enc = bytes_to_unicode()
    tokens, types = [], []
    for i in range(n_special):
        tokens.append(named.get(i, f"<SPECIAL_{i}>"))
        types.append(TokenType.CONTROL)
    for t in ranks:
        tokens.append(tekken_piece_str(t, enc))
        types.append(TokenType.NORMAL)
    # merges: every split of each token of rank >= 256 into two tokens, by (left rank, right rank),
    # then by the token's rank
    pairs = []
    for r in range(256, n_inner):
        t = ranks[r]
        local = [(t[:k], t[k:], r) for k in range(1, len(t)) if t[:k] in rank_of and t[k:] in rank_of]
        # the converter raises on a token with no split; the mini vocabulary's '://' (rank 268)
        # has none on purpose (only ignore_merges reaches it), so it gets no merge here, as in
        # tekken-mini/hf/tokenizer.json
        local.sort(key=lambda p: (rank_of[p[0]], rank_of[p[1]]))
        pairs += local
    pairs.sort(key=lambda p: p[2])
    merges = [" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in tekken_piece_str(x, enc)) for x in p[:2])
              for p in pairs]
    specials = {s: i for i, s in enumerate(tokens[:n_special])}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("tekken")
    w.add_token_merges(merges)
    w.add_bos_token_id(specials["<s>"])
    w.add_eos_token_id(specials["</s>"])
    w.add_unk_token_id(specials["<unk>"])
    w.add_pad_token_id(specials.get("<pad>", specials["</s>"]))
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_vocab_size(len(tokens))
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    finish(w)


def write_seed(path, pre):
    enc = bytes_to_unicode()
    tokens = [enc[b] for b in range(256)] + ["he", "ll", "hell", "hello", "\u0120w"]
    types = [TokenType.NORMAL] * len(tokens)
    for s in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "[INST]", "<pad>"):
        tokens.append(s)
        types.append(TokenType.CONTROL)
    tokens.append("[PAD267]")
    types.append(TokenType.UNUSED)
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["h e", "l l", "he ll", "hell o", "\u0120 w"])
    w.add_bos_token_id(264)
    w.add_pad_token_id(266)
    w.add_add_bos_token(False)
    finish(w)


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = OUT / "qwen3.gguf"
    write_hf(tmp, QWEN, "qwen3", "qwen2", QWEN3_4B_CONFIG)
    with open(tmp, "rb") as f, lzma.open(OUT / "qwen3.gguf.xz", "wb", preset=9 | lzma.PRESET_EXTREME) as g:
        g.write(f.read())
    tmp.unlink()
    write_hf(OUT / "tekken-hf.gguf", TEKKEN / "hf", "llama", "tekken", None)
    write_tekken_mistral(OUT / "tekken-mistral.gguf", TEKKEN / "tekken/tekken.json")
    for pre in ("qwen2", "tekken"):
        write_seed(ROOT / f"fuzz/corpus/gguf/tok-{pre}.gguf", pre)
    for p in sorted(OUT.iterdir()):
        print(p.relative_to(ROOT), p.stat().st_size)


if __name__ == "__main__":
    sys.exit(main())
