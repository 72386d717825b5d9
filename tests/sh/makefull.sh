#!/usr/bin/env bash
# budget: 5 s; checks: 2
# make-tiny --widths klein-4b-full / dev-full --sparse: complete full-size
# random pipelines, checked by tensor count and shapes against the spec's
# tables (transcribed below: docs/spec/flux2-transformer.md §1-2 for the transformer,
# docs/spec/flux2-text-vae.md §3.5/§3.6 for Qwen3-4B and Mistral Small, §6.1 for the
# VAE), read from the safetensors headers by this script's own reader.
# Not run end to end (16 GB and 110 GB of weights).
. "$TPGEN_ROOT/tests/lib.sh"
for w in klein-4b-full dev-full; do
    out=$("$TPGEN" make-tiny --widths $w --sparse --out "$TMP/$w" 2>&1) || { fail "makefull $w: $out"; continue; }
    res=$(python3 - "$TMP/$w" "$w" <<'PY'
import json, struct, sys, os
d, w = sys.argv[1], sys.argv[2]
def header(p):
    with open(p, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        h = json.loads(f.read(n))
    h.pop('__metadata__', None)
    return {k: v['shape'] for k, v in h.items()}
dev = w == 'dev-full'
# transformer (spec: dev 48 heads, 8 + 48 blocks, joint 15360, guidance embeds; klein-4B 24 heads, 5 + 20, joint 7680)
heads, nd, ns, J = (48, 8, 48, 15360) if dev else (24, 5, 20, 7680)
D, M, C, Ct, hd = heads * 128, 3 * heads * 128, 128, 256, 128
t = {'x_embedder.weight': [D, C], 'context_embedder.weight': [D, J],
     'time_guidance_embed.timestep_embedder.linear_1.weight': [D, Ct],
     'time_guidance_embed.timestep_embedder.linear_2.weight': [D, D],
     'double_stream_modulation_img.linear.weight': [6 * D, D], 'double_stream_modulation_txt.linear.weight': [6 * D, D],
     'single_stream_modulation.linear.weight': [3 * D, D], 'norm_out.linear.weight': [2 * D, D], 'proj_out.weight': [C, D]}
if dev:
    t['time_guidance_embed.guidance_embedder.linear_1.weight'] = [D, Ct]
    t['time_guidance_embed.guidance_embedder.linear_2.weight'] = [D, D]
for i in range(nd):
    for q in ('to_q', 'to_k', 'to_v', 'add_q_proj', 'add_k_proj', 'add_v_proj', 'to_out.0', 'to_add_out'):
        t[f'transformer_blocks.{i}.attn.{q}.weight'] = [D, D]
    for q in ('norm_q', 'norm_k', 'norm_added_q', 'norm_added_k'): t[f'transformer_blocks.{i}.attn.{q}.weight'] = [hd]
    for f in ('ff', 'ff_context'):
        t[f'transformer_blocks.{i}.{f}.linear_in.weight'] = [2 * M, D]
        t[f'transformer_blocks.{i}.{f}.linear_out.weight'] = [D, M]
for i in range(ns):
    t[f'single_transformer_blocks.{i}.attn.to_qkv_mlp_proj.weight'] = [3 * D + 2 * M, D]
    t[f'single_transformer_blocks.{i}.attn.norm_q.weight'] = [hd]
    t[f'single_transformer_blocks.{i}.attn.norm_k.weight'] = [hd]
    t[f'single_transformer_blocks.{i}.attn.to_out.weight'] = [D, D + M]
# text encoder (Qwen3-4B: H 2560, 36 layers, q 4096, kv 1024, F 9728, vocab 151936, q/k norms;
# Mistral Small 3.x: H 5120, 40 layers, q 4096, kv 1024, F 32768, vocab 131072, no q/k norm)
H, L, F, V, pre = (5120, 40, 32768, 131072, 'language_model.model.') if dev else (2560, 36, 9728, 151936, 'model.')
e = {pre + 'embed_tokens.weight': [V, H]}
for i in range(L):
    p = f'{pre}layers.{i}.'
    e.update({p + 'input_layernorm.weight': [H], p + 'post_attention_layernorm.weight': [H],
              p + 'self_attn.q_proj.weight': [4096, H], p + 'self_attn.k_proj.weight': [1024, H],
              p + 'self_attn.v_proj.weight': [1024, H], p + 'self_attn.o_proj.weight': [H, 4096],
              p + 'mlp.gate_proj.weight': [F, H], p + 'mlp.up_proj.weight': [F, H], p + 'mlp.down_proj.weight': [H, F]})
    if not dev: e.update({p + 'self_attn.q_norm.weight': [128], p + 'self_attn.k_norm.weight': [128]})
bad = []
def same(name, got, want):
    missing = sorted(set(want) - set(got)); wrong = [k for k in want if k in got and got[k] != want[k]]
    if missing: bad.append(f'{name}: {len(missing)} missing, e.g. {missing[0]}')
    if wrong: bad.append(f'{name}: {wrong[0]} is {got[wrong[0]]}, want {want[wrong[0]]}')
got_t = header(f'{d}/transformer/diffusion_pytorch_model.safetensors')
same('transformer', got_t, t)
if len(got_t) != len(t): bad.append(f'transformer: {len(got_t)} tensors, want {len(t)}')
params = sum(eval('*'.join(map(str, s))) for s in got_t.values())
want_p = 32.2e9 if dev else 3.88e9
if abs(params - want_p) > 0.01 * want_p: bad.append(f'transformer: {params/1e9:.2f} G parameters, want about {want_p/1e9:.2f} G')
got_e = header(f'{d}/text_encoder/model.safetensors')
same('text encoder', got_e, e)
cfg = json.load(open(f'{d}/text_encoder/config.json')); cfg = cfg.get('text_config', cfg)
if (cfg['hidden_size'], cfg['num_hidden_layers']) != (H, L): bad.append(f'text encoder config {cfg["hidden_size"]}, {cfg["num_hidden_layers"]}')
# VAE (AutoencoderKLFlux2: latent 32, blocks 128/256/512/512, 2 layers per block)
v = header(f'{d}/vae/diffusion_pytorch_model.safetensors')
want_v = {'decoder.conv_in.weight': [512, 32, 3, 3], 'decoder.conv_out.weight': [3, 128, 3, 3],
          'encoder.conv_in.weight': [128, 3, 3, 3], 'encoder.conv_out.weight': [64, 512, 3, 3],
          'quant_conv.weight': [64, 64, 1, 1], 'post_quant_conv.weight': [32, 32, 1, 1], 'bn.running_mean': [128],
          'decoder.up_blocks.0.resnets.2.conv2.weight': [512, 512, 3, 3],
          'decoder.up_blocks.3.resnets.0.conv_shortcut.weight': [128, 256, 1, 1],
          'encoder.down_blocks.1.resnets.0.conv_shortcut.weight': [256, 128, 1, 1],
          'decoder.mid_block.attentions.0.to_q.weight': [512, 512]}
same('vae', v, want_v)
n_res = sum(1 for k in v if k.startswith('decoder.up_blocks.') and k.endswith('.conv1.weight'))
if n_res != 12: bad.append(f'vae: {n_res} decoder up-block resnets, want 4 x 3')
print('; '.join(bad) or f'ok {len(got_t)} {len(got_e)} {params/1e9:.2f}')
PY
)
    case "$res" in
    ok*) set -- $res; ok "makefull $w: $2 transformer tensors ($4 G parameters) and $3 text-encoder tensors of the spec's shapes, the real VAE" ;;
    *) fail "makefull $w: $res" ;;
    esac
    rm -rf "$TMP/$w"
done
