#!/usr/bin/env python3
"""Golden data for FLUX.3's text encoder (tests/data/flux3-te/flux3-te.tar.xz).

Made with /work/venv-flux3 (torch 2.15 CPU, transformers 5.24, diffusers 0.42.1), offline:

    /work/venv-flux3/bin/python tests/tools/flux3_te_golden.py /tmp/flux3-te
    (cd /tmp/flux3-te && tar -cf - model/text_encoder/config.json model/text_encoder/model.safetensors \
        model/model_index.json model/tokenizer/chat_template.jinja cases.safetensors cases.json) \
        | xz -9e > tests/data/flux3-te/flux3-te.tar.xz

What it writes (into OUT):
- model/text_encoder/: a tiny random transformers `Qwen3VLForConditionalGeneration`, `save_pretrained` layout
  (config.json with the nested text_config, model.safetensors, BF16): text hidden 16, 34 layers (so hidden
  states 4..32 are intermediate as in the real 36-layer Qwen3-VL-4B), 4 query / 2 KV heads of head_dim 8,
  intermediate 32, rope_theta 5e6, mrope_section [2, 1, 1] interleaved, q/k norm and every RMSNorm weight
  random (not 1; weights 0.12 x randn), and the REAL 151936-token vocabulary so that the real tokenizer's ids run unchanged; only
  the embedding rows of the ids the cases use are random, all other rows are zero (that is what keeps the
  file small: xz squeezes the zero rows away). The vision tower is the smallest transformers accepts
  (depth 1, hidden 16); it is never run.
- model/tokenizer/: the Qwen3 tokenizer files of tests/data/qwen3-tokenizer (not copied into the tarball:
  the test puts them back) + chat_template.jinja (see TEMPLATE below); model_index.json naming the classes.
- cases.safetensors / cases.json: per case K `caseK.input_ids`, `caseK.attention_mask`, `caseK.position_ids`
  [1, L] (i64, exactly what the pipeline passes to the encoder), `caseK.prompt_embeds` [1, L, 8*16] as
  diffusers' own `Flux3TextEncoderStep._get_qwen3_vl_prompt_embeds` returns it (float32), and
  `caseK.hidden_states_{0,34}` (embeddings and after the final norm) from the same encoder call; cases.json has
  the prompts, max_sequence_length, pad multiple, real lengths and the windows.

The reference runs on the float32 model; only a deep copy is cast to BF16 for saving, because casting the model
itself also rounds the rotary `inv_freq` buffer to BF16 (a 3e-4 change of the 160-token case).

The processor: the real Qwen3-VL processor files are not available offline. The tokenizer is Qwen3's
(tests/data/qwen3-tokenizer; Qwen3-VL's tokenizer.json has the same vocabulary, merges and added tokens,
including the <|vision_*|> / <|image_pad|> ids 151652..151656); the chat template is the text-only user path of
Qwen3-VL-Instruct's chat_template.json: "<|im_start|>user\\n" P "<|im_end|>\\n<|im_start|>assistant\\n"
(no <think> block, unlike Qwen3/klein; a Thinking checkpoint would add "<think>\\n"). The processor object is
a real `Qwen3VLProcessor` built from those parts (PIL image processor: torchvision is not installed; text-only
prompts never reach the image and video processors), and the pipeline function calls it as it calls the
downloaded one (`apply_chat_template`, then `.tokenizer(...)` twice).
"""
import copy
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file
from transformers import (Qwen2TokenizerFast, Qwen3VLConfig, Qwen3VLForConditionalGeneration,
                          Qwen3VLProcessor)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
from diffusers.modular_pipelines.flux3.encoders import Flux3TextEncoderStep

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOK_DIR = os.path.join(ROOT, "tests", "data", "qwen3-tokenizer")

TEMPLATE = ("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
            "{%- if message.content is string %}{{- message.content }}{%- else %}"
            "{%- for content in message.content %}{%- if 'text' in content %}{{- content.text }}{%- endif %}"
            "{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

PAD_MULTIPLE = 80
LAYERS = (4, 8, 12, 16, 20, 24, 28, 32)
LONG = ("A weathered lighthouse on a basalt cliff at dusk, waves breaking below in long white lines, a narrow "
        "staircase cut into the rock, gulls circling the lamp room, warm light in the keeper's window, the sky "
        "shading from orange to deep violet, thin clouds lit from beneath, a fishing boat with a red hull rounding "
        "the point, wet stones shining, photographed on medium format film with soft grain and gentle contrast")


def make_processor():
    tok = Qwen2TokenizerFast(tokenizer_file=os.path.join(TOK_DIR, "tokenizer.json"))
    cfg = json.load(open(os.path.join(TOK_DIR, "tokenizer_config.json")))
    tok.pad_token = cfg.get("pad_token", "<|endoftext|>")
    class Processor(Qwen3VLProcessor):
        # without torchvision transformers cannot resolve the video-processor base class to type-check it
        def check_argument_for_proper_class(self, name, arg):
            return None if name == "video_processor" else super().check_argument_for_proper_class(name, arg)

    return Processor(image_processor=Qwen2VLImageProcessorPil(), tokenizer=tok,
                     video_processor=Qwen3VLVideoProcessor(), chat_template=TEMPLATE)


def exact_prompt(proc, n):
    """A prompt whose templated length is exactly n tokens (the unpadded case)."""
    words = LONG.split()
    for k in range(1, len(words) + 1):
        p = " ".join(words[:k])
        text = proc.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        if len(proc.tokenizer(text)["input_ids"]) == n:
            return p
    raise SystemExit("no prefix of LONG has %d tokens" % n)


def main(out):
    torch.manual_seed(20261202)
    proc = make_processor()
    cases = [  # (prompt, max_sequence_length)
        ("a red fox in the snow", 8192),         # short: 80-token window, most of it padding
        (exact_prompt(proc, 80), 8192),          # exactly one multiple: no padding
        (LONG, 8192),                            # > 80 real tokens: a 160-token window
        (LONG, 90),                              # the cap: truncated to 90, no padding
        ("", 8192),                              # the empty prompt (CFG's negative prompt)
    ]
    used = set()
    for p, _ in cases:
        text = proc.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        used.update(proc.tokenizer(text)["input_ids"])
    used.add(proc.tokenizer.pad_token_id)

    text_cfg = dict(vocab_size=151936, hidden_size=16, intermediate_size=32, num_hidden_layers=34,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                    max_position_embeddings=8192, tie_word_embeddings=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [2, 1, 1],
                                     "mrope_interleaved": True})
    vis_cfg = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, patch_size=2, out_hidden_size=16,
                   num_position_embeddings=4, deepstack_visual_indexes=[0])
    cfg = Qwen3VLConfig(text_config=text_cfg, vision_config=vis_cfg, tie_word_embeddings=True)
    model = Qwen3VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(0.12 * torch.randn_like(p))
        emb = model.model.language_model.embed_tokens.weight
        keep = torch.zeros(emb.shape[0], dtype=torch.bool)
        keep[sorted(used)] = True
        emb[~keep] = 0
        # BF16 on disk, the reference runs on the exactly upcast values
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    te_dir = os.path.join(out, "model", "text_encoder")
    os.makedirs(te_dir, exist_ok=True)
    # a copy goes to bf16: casting the model itself would also round its rotary inv_freq buffer
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(te_dir)
    tk_dir = os.path.join(out, "model", "tokenizer")
    os.makedirs(tk_dir, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOK_DIR, f), tk_dir)
    open(os.path.join(tk_dir, "chat_template.jinja"), "w").write(TEMPLATE)
    json.dump({"_class_name": "Flux3ModularPipeline", "_diffusers_version": "0.42.1",
               "text_encoder": ["transformers", "Qwen3VLForConditionalGeneration"],
               "tokenizer": ["transformers", "Qwen3VLProcessor"]},
              open(os.path.join(out, "model", "model_index.json"), "w"), indent=1)

    tensors, meta = {}, []
    # capture what the pipeline function passes to the encoder and what it returns
    seen = {}
    orig_forward = model.forward

    def spy(*a, **kw):
        r = orig_forward(*a, **kw)
        seen.update(kw)
        seen["hidden_states"] = r.hidden_states
        return r

    model.forward = spy
    for k, (p, max_len) in enumerate(cases):
        seen.clear()
        with torch.no_grad():
            emb = Flux3TextEncoderStep._get_qwen3_vl_prompt_embeds(
                text_encoder=model, tokenizer=proc, prompt=p, device=torch.device("cpu"),
                max_sequence_length=max_len, pad_multiple=PAD_MULTIPLE, hidden_states_layers=LAYERS)
        ids, mask, pos = seen["input_ids"], seen["attention_mask"], seen["position_ids"]
        hs = seen["hidden_states"]
        L = ids.shape[1]
        assert emb.shape == (1, L, 8 * 16) and len(hs) == 35
        tensors[f"case{k}.input_ids"] = ids.to(torch.int64).contiguous()
        tensors[f"case{k}.attention_mask"] = mask.to(torch.int64).contiguous()
        tensors[f"case{k}.position_ids"] = pos.to(torch.int64).contiguous()
        tensors[f"case{k}.prompt_embeds"] = emb.float().contiguous()
        tensors[f"case{k}.hidden_states_0"] = hs[0].float().contiguous()
        tensors[f"case{k}.hidden_states_34"] = hs[34].float().contiguous()
        real = int(mask.sum())
        meta.append({"prompt": p, "max_sequence_length": max_len, "real_tokens": real, "window": L,
                     "ids": ids[0].tolist()})
        print(f"case{k}: {real} real tokens, window {L}")
    save_file(tensors, os.path.join(out, "cases.safetensors"))
    json.dump({"pad_multiple": PAD_MULTIPLE, "hidden_states_layers": list(LAYERS), "cases": meta,
               "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                            "diffusers": __import__("diffusers").__version__},
               "how": "diffusers Flux3TextEncoderStep._get_qwen3_vl_prompt_embeds on the tiny encoder, float32, "
                      "default (sdpa) attention; the tokenizer files are tests/data/qwen3-tokenizer"},
              open(os.path.join(out, "cases.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/flux3-te")
