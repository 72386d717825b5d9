#!/usr/bin/env python3
"""Writes a tiny Mistral Tekken tokenizer in both file forms, for the tests:

  tekken/tekken.json          mistral-common format (base64 token bytes, ranks)
  hf/tokenizer.json           the Hugging Face form that transformers' MistralConverter
                              produces from a tekken.json (specials in the vocabulary
                              under their own text, byte-level keys, merges derived
                              from the ranks, ignore_merges)
  hf/tokenizer_config.json    pad token <pad>, tokenizer_class LlamaTokenizerFast and no
                              padding_side: the class's default (left) applies

Ids: 0..999 specials, 1000 + rank for vocabulary ranks. Ranks 0..255 are the single
bytes, then the few merged tokens in MERGED (rank 256, 257, ...). The expected ids in
tests/test_tokenizer.c are derived by hand from this table. Run from this folder:
python3 gen.py
"""
import base64, json, os

PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
           r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
           r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# rank 256 + index
MERGED = [b"he", b"ll", b"hell", b"hello", b"Wo", b"rl", b"rld", b"World",
          b"AB", b"ABc", b"\n\n", b"\n/", b"://"]
# beyond default_vocab_size - specials: present in the file, must be ignored
UNUSED = [b"lll"]
NAMED = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
         "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]",
         "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
         "[TOOL_CONTENT]"]
NSPECIAL = 1000
SYSTEM = (b"You are an AI that reasons about image descriptions. You give structured responses "
          b"focusing on object relationships, object\nattribution and actions without speculation.")

tokens = [bytes([b]) for b in range(256)] + MERGED
# the dev-layout test expects the system message to stay single bytes
for t in MERGED:
    assert t not in SYSTEM, t
specials = NAMED + ["<SPECIAL_%d>" % i for i in range(len(NAMED), NSPECIAL)]

def b2u():
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}

def write(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")

# --- tekken.json (lists only the named specials; the rest are implied) ---
allv = tokens + UNUSED
write("tekken/tekken.json", {
    "config": {"pattern": PATTERN, "num_vocab_tokens": len(allv),
               "default_vocab_size": NSPECIAL + len(tokens),
               "default_num_special_tokens": NSPECIAL, "version": "v7"},
    "vocab": [{"rank": r, "token_bytes": base64.b64encode(t).decode(),
               "token_str": t.decode("utf-8", "replace")} for r, t in enumerate(allv)],
    "special_tokens": [{"rank": i, "token_str": s, "is_control": True} for i, s in enumerate(NAMED)],
})

# --- tokenizer.json, as MistralConverter builds it ---
enc = b2u()
key = lambda t: "".join(enc[b] for b in t)
rank = {t: r for r, t in enumerate(tokens)}
vocab = {s: i for i, s in enumerate(specials)}
vocab.update({key(t): NSPECIAL + r for r, t in enumerate(tokens)})
merges = []
for t in tokens:
    local = [(t[:k], t[k:]) for k in range(1, len(t)) if t[:k] in rank and t[k:] in rank]
    local.sort(key=lambda p: (rank[p[0]], rank[p[1]]))
    merges += [(rank[t], [key(a), key(b)]) for a, b in local]
merges.sort(key=lambda m: m[0])
write("hf/tokenizer.json", {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True} for i, s in enumerate(specials)],
    "normalizer": None,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": PATTERN}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
    "post_processor": None,
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
              "ignore_merges": True, "vocab": vocab, "merges": [m for _, m in merges]},
})
write("hf/tokenizer_config.json", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                                   "pad_token": "<pad>",
                                   "model_max_length": 1000000000000000019884624838656,
                                   "tokenizer_class": "LlamaTokenizerFast"})
