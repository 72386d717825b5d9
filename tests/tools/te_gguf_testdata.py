#!/usr/bin/env python3
"""Text-encoder GGUF test data (tests/test_llm_gguf.c, tests/sh/encode_gguf.sh): the golden tiny
Qwen3 and Mistral text encoders written as llama.cpp's converter (convert_hf_to_gguf.py,
conversion/llama.py + qwen3) writes them. Run from the repository root, after
tests/unpack-golden.sh, with the test venv (gguf-py 0.19.0, numpy 2.4.6, torch 2.15.0,
safetensors, transformers 5.24.0):

    /work/venv-flux3/bin/python tests/tools/te_gguf_testdata.py [GOLDEN_DIR]

GOLDEN_DIR defaults to build/golden. Writes tests/data/te-gguf/:

  qwen3-bf16.gguf      golden qwen3-tiny (4 layers, hidden 64, 4/2 heads of 16, vocab 300,
                       tied embeddings: no output.weight): 2-D tensors BF16 (the stored
                       values, so qwen3_cases.safetensors applies exactly), 1-D F32
  qwen3-q8q4.gguf      the same with token_embd and attn_* Q8_0, ffn_* Q4_0 (a mix, as
                       llama.cpp's Q4_K_M-style recipes mix types; hidden 64 is not a
                       multiple of 256, so no K-quant applies), quantised by gguf-py
  mistral-q8_0.gguf    golden mistral-tiny's language model (31 layers, hidden 32, 4/2 heads
                       of 8), arch "llama", every 2-D tensor Q8_0 (output.weight, never read, Q4_0), 1-D F32, attn_q / attn_k
                       rows PERMUTED as LlamaModel.permute does (undo_permute = True); the
                       vision tower and projector left out (llama.cpp's Mistral-Small GGUFs
                       hold the language model only). token_embd and output are padded
                       from 1200 to 1280 rows (80 extra random rows) so that the mini Tekken
                       tokenizer (tests/data/tekken-mini, ids up to 1269) fits for the
                       `tpgen encode` check; the golden ids are < 1200 and never see them.
  qwen3-kquant.gguf    an extra tiny RANDOM Qwen3 where K-quants apply (hidden 256, MLP 256, 1 layer,
                       2 heads of 64, 1 KV head, vocabulary 32): token_embd Q6_K, attn_q Q4_K,
                       attn_k Q5_K, attn_v Q6_K, attn_output Q4_0 (128-value rows), ffn_gate Q2_K,
                       ffn_up Q3_K, ffn_down Q4_K: random valid blocks (gguf-py has no K-quant
                       quantiser), the norms random F32 near 1
  refs.safetensors     references computed here with transformers (Qwen3Model /
                       MistralModel, float32, eager attention) on gguf-py's dequantised
                       weights of each quantised file, in the HF layout (Q8_0/Q4_0 blocks lie
                       inside rows, so quantising permuted rows = permuting quantised rows:
                       no inverse permutation is computed here):
                       qwen3-q8q4.caseK.hidden_states_{0..4}, mistral-q8_0.caseK.
                       hidden_states_{0,10,20,30,31} for the golden cases' input_ids, and
                       mistral-q8_0.encode.{input_ids,prompt_embeds} (hidden states 10/20/30
                       stacked) for ENCODE_IDS below; qwen3-kquant.case0.{input_ids,
                       hidden_states_0,hidden_states_1} (10 random ids; the embeddings and the final
                       norm of the layer's output).
  refs.json            sanity figures: the transformers run on the unquantised BF16 weights
                       against the golden hidden states (must be ~1e-7), quantisation errors.

ENCODE_IDS are the ids `tpgen encode --prompt "a red fox" --max-sequence-length 32` gives with
tests/data/tekken-mini/hf (the FLUX.2-dev template: BOS, [SYSTEM_PROMPT] and the start of the
system message, truncated at 32 tokens, so every row is real and no padding rule is involved;
the dev tokenizer itself is tested in tests/test_textenc.c). The shell test checks the ids
exactly and the embeddings against this reference.
"""
import importlib.metadata, json, os, sys
import numpy as np
import torch
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize, dequantize
from safetensors import safe_open
from safetensors.numpy import save_file

ENCODE_PROMPT = 'a red fox'
ENCODE_IDS = [1, 17, 1089, 1111, 1117, 1032, 1097, 1114, 1101, 1032, 1097, 1110, 1032, 1065, 1073, 1032, 1116, 1104,
              1097, 1116, 1032, 1114, 1101, 1097, 1115, 1111, 1110, 1115, 1032, 1097, 1098, 1111]   # see docstring

golden = sys.argv[1] if len(sys.argv) > 1 else 'build/golden'
out_dir = 'tests/data/te-gguf'
os.makedirs(out_dir, exist_ok=True)
rng = np.random.default_rng(20261202)


def load_st(path):
    with safe_open(path, 'pt') as f:
        return {k: f.get_tensor(k).float().numpy() for k in f.keys()}


LAYER_MAP = [('input_layernorm', 'attn_norm'), ('post_attention_layernorm', 'ffn_norm'),
             ('self_attn.q_proj', 'attn_q'), ('self_attn.k_proj', 'attn_k'), ('self_attn.v_proj', 'attn_v'),
             ('self_attn.o_proj', 'attn_output'), ('self_attn.q_norm', 'attn_q_norm'),
             ('self_attn.k_norm', 'attn_k_norm'), ('mlp.gate_proj', 'ffn_gate'), ('mlp.up_proj', 'ffn_up'),
             ('mlp.down_proj', 'ffn_down')]


def gguf_name(hf):
    """HF name (prefix model.) -> llama.cpp's (gguf-py TensorNameMap)."""
    if hf == 'model.embed_tokens.weight': return 'token_embd.weight'
    if hf == 'model.norm.weight': return 'output_norm.weight'
    if hf == 'lm_head.weight': return 'output.weight'
    parts = hf.split('.')
    assert parts[0] == 'model' and parts[1] == 'layers', hf
    mod = '.'.join(parts[3:-1])
    return 'blk.%s.%s.weight' % (parts[2], dict(LAYER_MAP)[mod])


def permute(w, n_head, n_head_kv):
    """LlamaModel.permute (conversion/llama.py)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write(path, arch, cfg, sd, qtype_of, permute_qk, raw=None):
    """sd: HF names (model.*, lm_head) -> f32 arrays; raw: gguf name -> (type, stored blocks) written as given
    (their values are sd's). Returns the dequantised HF-layout state dict."""
    w = gguf.GGUFWriter(path, arch=arch)
    w.add_name(os.path.basename(path)[:-5])
    w.add_context_length(cfg['max_position_embeddings'])
    w.add_embedding_length(cfg['hidden_size'])
    w.add_block_count(cfg['num_hidden_layers'])
    w.add_feed_forward_length(cfg['intermediate_size'])
    w.add_head_count(cfg['num_attention_heads'])
    w.add_head_count_kv(cfg['num_key_value_heads'])
    w.add_rope_freq_base(cfg['rope_theta'])
    w.add_layer_norm_rms_eps(cfg['rms_norm_eps'])
    w.add_key_length(cfg['head_dim'])
    w.add_value_length(cfg['head_dim'])
    if arch == 'llama':
        w.add_vocab_size(sd['model.embed_tokens.weight'].shape[0])
        w.add_rope_dimension_count(cfg['head_dim'])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M if 'kquant' in path else
                    gguf.LlamaFileType.MOSTLY_Q8_0 if 'q8' in path else gguf.LlamaFileType.MOSTLY_BF16)
    deq = {}
    for hf in sorted(sd, key=lambda n: (n.count('layers'), n)):
        x = sd[hf].astype(np.float32)
        name = gguf_name(hf)
        if x.ndim == 1:
            w.add_tensor(name, x)   # 1-D: F32, as the converter keeps them
            deq[hf] = x
            continue
        qt = qtype_of(name)
        if raw and name in raw:
            qt, q = raw[name]
        else:
            q = quantize(x, qt)
        deq[hf] = dequantize(q, qt).astype(np.float32).reshape(x.shape)   # HF layout
        if permute_qk and name.endswith('attn_q.weight'):
            q = permute(q, cfg['num_attention_heads'], cfg['num_attention_heads'])
        elif permute_qk and name.endswith('attn_k.weight'):
            q = permute(q, cfg['num_attention_heads'], cfg['num_key_value_heads'])
        w.add_tensor(name, np.ascontiguousarray(q), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return deq


def qwen3_model(cfg, sd):
    from transformers import Qwen3Config, Qwen3Model
    c = Qwen3Config(**{k: v for k, v in cfg.items() if k not in ('architectures', 'transformers_version', 'torch_dtype')})
    c._attn_implementation = 'eager'
    m = Qwen3Model(c).float().eval()
    m.load_state_dict({k[len('model.'):]: torch.from_numpy(v) for k, v in sd.items() if k.startswith('model.')})
    return m


def mistral_model(cfg, sd):
    from transformers import MistralConfig, MistralModel
    c = MistralConfig(**{k: v for k, v in cfg.items() if k not in ('dtype', 'model_type')})
    c._attn_implementation = 'eager'
    m = MistralModel(c).float().eval()
    m.load_state_dict({k[len('model.'):]: torch.from_numpy(v) for k, v in sd.items() if k.startswith('model.')})
    return m


def hidden(m, ids, mask):
    with torch.no_grad():
        o = m(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), output_hidden_states=True,
              use_cache=False)
    return [h[0].numpy().astype(np.float32) for h in o.hidden_states]


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


refs, info = {}, {'versions': {p: importlib.metadata.version(p) for p in
                               ('gguf', 'numpy', 'torch', 'transformers', 'safetensors')}}

# ---- Qwen3 (klein) ----
qdir = os.path.join(golden, 'qwen3-tiny')
qcfg = json.load(open(os.path.join(qdir, 'model/text_encoder/config.json')))
qcfg['rope_theta'] = qcfg['rope_parameters']['rope_theta']
qsd = load_st(os.path.join(qdir, 'model/text_encoder/model.safetensors'))
qcases = load_st(os.path.join(qdir, 'qwen3_cases.safetensors'))
write(os.path.join(out_dir, 'qwen3-bf16.gguf'), 'qwen3', qcfg, qsd, lambda n: T.BF16, False)
deq = write(os.path.join(out_dir, 'qwen3-q8q4.gguf'), 'qwen3', qcfg, qsd,
            lambda n: T.Q4_0 if '.ffn_' in n else T.Q8_0, False)
m_ref, m_q = qwen3_model(qcfg, qsd), qwen3_model(qcfg, deq)
for k in range(2):
    ids = qcases['case%d.input_ids' % k].astype(np.int64)
    mask = qcases['case%d.attention_mask' % k].astype(np.int64)
    hs_ref, hs_q = hidden(m_ref, ids, mask), hidden(m_q, ids, mask)
    info['qwen3.case%d.bf16_vs_golden' % k] = max(rel(hs_ref[i], qcases['case%d.hidden_states_%d' % (k, i)][0])
                                                 for i in range(5))
    info['qwen3.case%d.q8q4_vs_golden' % k] = [rel(hs_q[i], qcases['case%d.hidden_states_%d' % (k, i)][0])
                                              for i in range(5)]
    for i in range(5):
        refs['qwen3-q8q4.case%d.hidden_states_%d' % (k, i)] = hs_q[i]
    assert info['qwen3.case%d.bf16_vs_golden' % k] < 1e-5, info

# ---- Mistral (dev): language model only, arch llama, permuted Q/K ----
mdir = os.path.join(golden, 'mistral-tiny')
mcfg = json.load(open(os.path.join(mdir, 'model/text_encoder/config.json')))['text_config']
raw = load_st(os.path.join(mdir, 'model/text_encoder/model.safetensors'))
msd = {}
for k, v in raw.items():   # Mistral3ForConditionalGeneration (legacy names) -> the language model
    if k.startswith('language_model.model.'): msd['model.' + k[len('language_model.model.'):]] = v
    elif k == 'language_model.lm_head.weight': msd['lm_head.weight'] = v
mcases = load_st(os.path.join(mdir, 'mistral_cases.safetensors'))
m_ref = mistral_model(mcfg, msd)
V0, V1 = mcfg['vocab_size'], 1280
for n in ('model.embed_tokens.weight', 'lm_head.weight'):
    extra = (rng.standard_normal((V1 - V0, mcfg['hidden_size'])) * msd[n].std()).astype(np.float32)
    msd[n] = np.concatenate([msd[n], extra])
mcfg_pad = dict(mcfg, vocab_size=V1)
deq = write(os.path.join(out_dir, 'mistral-q8_0.gguf'), 'llama', mcfg_pad, msd,
            lambda n: T.Q4_0 if n == 'output.weight' else T.Q8_0, True)
m_q = mistral_model(mcfg_pad, deq)
MIDX = (0, 10, 20, 30, 31)
for k in range(2):
    ids = mcases['case%d.input_ids' % k].astype(np.int64)
    mask = mcases['case%d.attention_mask' % k].astype(np.int64)
    real = mask[0] != 0
    hs_ref, hs_q = hidden(m_ref, ids, mask), hidden(m_q, ids, mask)
    info['mistral.case%d.bf16_vs_golden_real_rows' % k] = max(
        rel(hs_ref[i][real], mcases['case%d.hidden_states_%d' % (k, i)][0][real]) for i in MIDX)
    info['mistral.case%d.q8_0_vs_golden_real_rows' % k] = [
        rel(hs_q[i][real], mcases['case%d.hidden_states_%d' % (k, i)][0][real]) for i in MIDX]
    for i in MIDX:
        refs['mistral-q8_0.case%d.hidden_states_%d' % (k, i)] = hs_q[i]
    assert info['mistral.case%d.bf16_vs_golden_real_rows' % k] < 1e-5, info
if ENCODE_IDS:
    ids = np.array([ENCODE_IDS], dtype=np.int64)
    hs = hidden(m_q, ids, np.ones_like(ids))
    refs['mistral-q8_0.encode.input_ids'] = ids[0].astype(np.int64)
    refs['mistral-q8_0.encode.prompt_embeds'] = np.concatenate([hs[10], hs[20], hs[30]], axis=1)
    info['encode'] = {'prompt': ENCODE_PROMPT, 'ids': ENCODE_IDS}


# ---- K-quants: an extra tiny random Qwen3 at widths where they apply (hidden 256, MLP 256, 1 layer,
# 2 heads of 64, 1 KV head, vocabulary 32). gguf-py has no K-quant quantiser, so the blocks are random valid
# blocks (random bytes, f16 scale fields set, then scaled so the decoded weights have the wanted spread);
# the reference is transformers on what they decode to. attn_output's rows are 128 values, not whole
# 256-blocks: Q4_0 there, as llama.cpp falls back for such rows. At tp 2 ffn_down's 128 columns per rank
# are half a Q4_K block. ----
F16_FIELDS = {T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.Q4_0: [0]}


def random_kblocks(qt, rows, cols, std):
    bs, nb = gguf.GGML_QUANT_SIZES[qt]
    b = rng.integers(0, 256, size=(rows, cols // bs, nb), dtype=np.uint8)
    scale = 1.0
    for _ in range(2):   # set the f16 fields, measure the spread, rescale once
        for k, off in enumerate(F16_FIELDS[qt]):
            h = rng.uniform(0.5, 1.0, size=(rows, cols // bs)) * scale * (1e-2 if k == 0 else 1e-2)
            if k == 0: h *= rng.choice([-1, 1], size=h.shape)
            b[:, :, off:off + 2] = h.astype(np.float16).view(np.uint8).reshape(rows, cols // bs, 2)
        v = dequantize(b.reshape(rows, -1), qt).reshape(rows, cols)
        scale *= std / float(v.std())
    return b.reshape(rows, cols // bs * nb), v.astype(np.float32)


kcfg = dict(vocab_size=32, hidden_size=256, intermediate_size=256, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, head_dim=64, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=4096,
            tie_word_embeddings=True, hidden_act='silu', attention_bias=False,
            rope_parameters={'rope_theta': 1e6, 'rope_type': 'default'})
ktypes = {'token_embd.weight': (T.Q6_K, (32, 256), 1.0), 'blk.0.attn_q.weight': (T.Q4_K, (128, 256), 0.06),
          'blk.0.attn_k.weight': (T.Q5_K, (64, 256), 0.06), 'blk.0.attn_v.weight': (T.Q6_K, (64, 256), 0.06),
          'blk.0.attn_output.weight': (T.Q4_0, (256, 128), 0.08), 'blk.0.ffn_gate.weight': (T.Q2_K, (256, 256), 0.06),
          'blk.0.ffn_up.weight': (T.Q3_K, (256, 256), 0.06), 'blk.0.ffn_down.weight': (T.Q4_K, (256, 256), 0.06)}
ksd, kraw = {}, {}
hf_of = {gguf_name(n): n for n in ['model.embed_tokens.weight'] +
         ['model.layers.0.%s.weight' % m for m, _ in LAYER_MAP if 'norm' not in m]}
for name, (qt, shape, std) in ktypes.items():
    blocks, vals = random_kblocks(qt, shape[0], shape[1], std)
    kraw[name] = (qt, blocks)
    ksd[hf_of[name]] = vals
for n, d in (('model.norm.weight', 256), ('model.layers.0.input_layernorm.weight', 256),
             ('model.layers.0.post_attention_layernorm.weight', 256), ('model.layers.0.self_attn.q_norm.weight', 64),
             ('model.layers.0.self_attn.k_norm.weight', 64)):
    ksd[n] = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
kdeq = write(os.path.join(out_dir, 'qwen3-kquant.gguf'), 'qwen3', kcfg, ksd, lambda n: None, False, kraw)
for n in ksd: assert np.array_equal(kdeq[n], ksd[n]), n
kids = rng.integers(0, 32, size=(1, 10)).astype(np.int64)
hs = hidden(qwen3_model(kcfg, kdeq), kids, np.ones_like(kids))
refs['qwen3-kquant.case0.input_ids'] = kids[0]
assert len(hs) == 2   # [0] the embeddings, [1] the final norm of the layer's output (tied last hidden state)
refs['qwen3-kquant.case0.hidden_states_0'] = hs[0]
refs['qwen3-kquant.case0.hidden_states_1'] = hs[1]
info['qwen3-kquant.types'] = {n: T(t[0]).name for n, t in ktypes.items()}
info['qwen3-kquant.hidden_state_std'] = [float(h.std()) for h in hs]

# ---- fuzz seeds (fuzz/fuzz_gguf.c): the metadata of each file with tiny tensors of the real names ----
for arch, cfg, nm in (('qwen3', qcfg, 'te_qwen3.gguf'), ('llama', mcfg_pad, 'te_llama.gguf')):
    small = dict(cfg, num_hidden_layers=1, hidden_size=32, intermediate_size=32, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=16)
    sd = {'model.embed_tokens.weight': rng.standard_normal((4, 32)).astype(np.float32),
          'model.norm.weight': np.ones(32, np.float32),
          'model.layers.0.self_attn.q_proj.weight': rng.standard_normal((32, 32)).astype(np.float32),
          'model.layers.0.self_attn.k_proj.weight': rng.standard_normal((16, 32)).astype(np.float32)}
    write(os.path.join('fuzz/corpus/gguf', nm), arch, small, sd, lambda n: T.Q8_0, arch == 'llama')

save_file(refs, os.path.join(out_dir, 'refs.safetensors'))
json.dump(info, open(os.path.join(out_dir, 'refs.json'), 'w'), indent=1)
for f in sorted(os.listdir(out_dir)):
    print(f, os.path.getsize(os.path.join(out_dir, f)))
print(json.dumps(info, indent=1))
