#!/usr/bin/env python3
"""Seed corpora of fuzz_lora and fuzz_fp8 (fuzz/corpus/lora, fuzz/corpus/fp8).

  fuzz/make-seeds.py [GOLDEN]    GOLDEN: the upstream golden sets (default /work/shared/golden)

Two kinds of seeds:
  * made here, with the shapes of the harnesses' tiny models (D = 16, M = 48,
    see fuzz/fuzz_lora.c), so that they are accepted and reach the merge:
    one file per adapter dialect tpgen reads, and one per fp8 layout;
  * real files of the golden sets (flux2-lora, flux2-lora-dialects,
    flux2-fp8), trimmed to a few small tensors (a module's worth where one
    fits in TRIM bytes) with their metadata kept, so the fuzzer starts from
    the writers' own spellings (diffusers/PEFT, kohya, ai-toolkit, LyCORIS,
    ComfyUI, fal).
Only the standard library: the values are a fixed pseudo-random sequence.
"""
import json, os, struct, sys

ROOT = os.path.dirname(os.path.abspath(__file__))
GOLDEN = sys.argv[1] if len(sys.argv) > 1 else '/work/shared/golden'
D, M = 16, 48
TRIM = 6144
SIZE = {'F64': 8, 'F32': 4, 'BF16': 2, 'F16': 2, 'F8_E4M3': 1, 'F8_E5M2': 1, 'U8': 1, 'I8': 1}

_seed = 12345
def rnd():
    global _seed
    _seed = (_seed * 1103515245 + 12345) & 0x7fffffff
    return (_seed / 0x7fffffff - 0.5) * 0.5

def pack(dt, vals):
    if dt == 'F32': return struct.pack('<%df' % len(vals), *vals)
    if dt == 'F64': return struct.pack('<%dd' % len(vals), *vals)
    if dt == 'F16': return struct.pack('<%de' % len(vals), *vals)
    if dt == 'BF16': return b''.join(struct.pack('<f', v)[2:] for v in vals)
    if dt in ('F8_E4M3', 'F8_E5M2'): return bytes((0x38 + i % 8) for i in range(len(vals)))   # around 1.0
    raise ValueError(dt)

def tensor(name, dt, shape, vals=None):
    n = 1
    for s in shape: n *= s
    return (name, dt, shape, pack(dt, vals if vals is not None else [rnd() for _ in range(n)]))

def write_st(path, entries, meta=None):
    h, off, blobs = {}, 0, []
    if meta: h['__metadata__'] = meta
    for name, dt, shape, data in entries:
        h[name] = {'dtype': dt, 'shape': shape, 'data_offsets': [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    s = json.dumps(h, separators=(',', ':')).encode()
    s += b' ' * (-len(s) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(s)) + s + b''.join(blobs))

def read_st(path):
    with open(path, 'rb') as f:
        b = f.read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop('__metadata__', None)
    ents = [(k, v['dtype'], v['shape'], b[8 + n + v['data_offsets'][0]:8 + n + v['data_offsets'][1]])
            for k, v in sorted(h.items())]
    return ents, meta

def module_of(key):
    for suf in ('.lora_A.weight', '.lora_B.weight', '.lora_down.weight', '.lora_up.weight', '.weight', '.bias'):
        if key.endswith(suf): return key[:-len(suf)]
    return key.rsplit('.', 1)[0]

def trim(src, dst):
    """the smallest whole modules of src that fit in TRIM bytes (else its smallest tensors)"""
    ents, meta = read_st(src)
    mods = {}
    for e in ents: mods.setdefault(module_of(e[0]), []).append(e)
    keep, size = [], 0
    for m in sorted(mods, key=lambda m: (sum(len(e[3]) for e in mods[m]), m)):
        s = sum(len(e[3]) for e in mods[m])
        if (size + s <= TRIM or (not keep and s <= 2 * TRIM)) and len(keep) < 12: keep += mods[m]; size += s
    if not keep:
        for e in sorted(ents, key=lambda e: (len(e[3]), e[0])):
            if size + len(e[3]) <= TRIM and len(keep) < 4: keep.append(e); size += len(e[3])
    write_st(dst, sorted(keep), meta)

def trim_fp8(src, dst, rows=16):
    """src's first two fp8 layers (weight, scales, hints; cut to `rows` output rows, per-row scales with them,
    and 64 columns),
    a small non-fp8 tensor and the marker, with _quantization_metadata cut to the layers kept"""
    ents, meta = read_st(src)
    by = {e[0]: e for e in ents}
    layers = [e[0][:-7] for e in ents if e[0].endswith('.weight') and e[1].startswith('F8_')][:2]
    keep = [by[k] for k in ('scaled_fp8',) if k in by]
    small = [e for e in ents if not e[1].startswith('F8_') and len(e[3]) <= 256 and not any(e[0].startswith(m + '.') for m in layers)]
    keep += small[:1]
    for m in layers:
        for k, (name, dt, shape, data) in by.items():
            if not k.startswith(m + '.') or '.' in k[len(m) + 1:]: continue
            if shape and shape[0] == by[m + '.weight'][2][0] and shape[0] > rows:   # the weight, or per-row scales
                per = len(data) // shape[0]
                shape, data = [rows] + shape[1:], data[:rows * per]
            if dt.startswith('F8_') and len(shape) == 2 and shape[1] > 64:   # and to 64 columns
                data = b''.join(data[r * shape[1]:r * shape[1] + 64] for r in range(shape[0]))
                shape = [shape[0], 64]
            keep.append((name, dt, shape, data))
    if meta and '_quantization_metadata' in meta:
        q = json.loads(meta['_quantization_metadata'])
        q['layers'] = {k: v for k, v in q.get('layers', {}).items() if k in layers}
        meta = dict(meta, _quantization_metadata=json.dumps(q))
    write_st(dst, sorted(keep), meta)

def lora_pair(prefix, module, inn, out, r=2, dt='F32', down_up=False, alpha=None):
    a, b = ('lora_down', 'lora_up') if down_up else ('lora_A', 'lora_B')
    t = [tensor('%s%s.%s.weight' % (prefix, module, a), dt, [r, inn]),
         tensor('%s%s.%s.weight' % (prefix, module, b), dt, [out, r])]
    if alpha is not None: t.append(tensor('%s%s.alpha' % (prefix, module), 'F32', [], [alpha]))
    return t

def lora_seeds(out):
    pm = json.dumps({'transformer.r': 2, 'transformer.lora_alpha': 4, 'transformer.use_rslora': False,
                     'transformer.rank_pattern': {'proj_out': 2}, 'transformer.alpha_pattern': {'attn.to_q': 8}})
    seeds = {
        # diffusers / PEFT transformer.* with lora_adapter_metadata; proj_out is fp8 in the tiny model
        'peft_meta': (lora_pair('transformer.', 'transformer_blocks.0.attn.to_q', D, D) +
                      lora_pair('transformer.', 'single_transformer_blocks.0.attn.to_out', D + M, D, dt='BF16') +
                      lora_pair('transformer.', 'norm_out.linear', D, 2 * D, dt='F16') +
                      lora_pair('transformer.', 'proj_out', D, 8), {'lora_adapter_metadata': pm}),
        'peft_rslora': (lora_pair('transformer.', 'transformer_blocks.0.ff.linear_in', D, 2 * M, r=4),
                        {'lora_adapter_metadata': json.dumps({'r': 4, 'lora_alpha': 8, 'use_rslora': True})}),
        'peft_prefix': (lora_pair('base_model.model.', 'transformer_blocks.0.attn.add_k_proj', D, D) +
                        lora_pair('base_model.model.', 'single_transformer_blocks.0.attn.to_qkv_mlp_proj', D,
                                  3 * D + 2 * M), None),
        # ai-toolkit: BFL names, fused qkv (three segments on diffusers), the swapped final layer
        'aitk': (lora_pair('diffusion_model.', 'double_blocks.0.img_attn.qkv', D, 3 * D) +
                 lora_pair('diffusion_model.', 'final_layer.adaLN_modulation.1', D, 2 * D) +
                 lora_pair('diffusion_model.', 'single_blocks.0.linear2', D + M, D), None),
        'aitk_down_up': (lora_pair('diffusion_model.', 'double_blocks.0.txt_mlp.0', D, 2 * M, down_up=True) +
                         lora_pair('diffusion_model.', 'img_in', 8, D, down_up=True), None),
        # DoRA: dora_scale keys are dropped with a warning
        'aitk_dora': (lora_pair('diffusion_model.', 'double_blocks.0.img_attn.proj', D, D) +
                      [tensor('diffusion_model.double_blocks.0.img_attn.proj.dora_scale', 'F32', [1, D])], None),
        # kohya: lora_unet_ + '_' names, .alpha scalars (F32, BF16, F64)
        'kohya': (lora_pair('lora_unet_', 'double_blocks_0_img_attn_qkv', D, 3 * D, down_up=True, alpha=1.0) +
                  lora_pair('lora_unet_', 'time_in_in_layer', 8, D, down_up=True, alpha=4.0) +
                  lora_pair('lora_unet_', 'final_layer_linear', D, 8, down_up=True), None),
        'kohya_f64_alpha': (lora_pair('lora_unet_', 'single_blocks_0_linear1', D, 3 * D + 2 * M, down_up=True) +
                            [tensor('lora_unet_single_blocks_0_linear1.alpha', 'F64', [], [2.0])], None),
        # bare module names (no prefix), diffusers and BFL spellings
        'bare': (lora_pair('', 'x_embedder', 8, D) + lora_pair('', 'context_embedder', 12, D) +
                 lora_pair('', 'double_stream_modulation_img.lin', D, 6 * D), None),
        # FLUX.3: ai-toolkit BFL FLUX.3 names, the older diffusers spellings, a PEFT DoRA magnitude (refused)
        'flux3_aitk': (lora_pair('diffusion_model.', 'content_mode_blocks.0.q_proj', D, D) +
                       lora_pair('diffusion_model.', 'content_mode_blocks.0.mlp_in', D, 2 * M), None),
        'flux3_old': ([tensor('transformer.mode_blocks.0.attn.processor.to_q_lora.down.weight', 'F32', [2, D]),
                       tensor('transformer.mode_blocks.0.attn.processor.to_q_lora.up.weight', 'F32', [D, 2]),
                       tensor('transformer.mode_blocks.0.attn.processor.to_out_lora.down.weight', 'F32', [2, D]),
                       tensor('transformer.mode_blocks.0.attn.processor.to_out_lora.up.weight', 'F32', [D, 2]),
                       tensor('transformer.x_embedders.image.lora.down.weight', 'F32', [2, 8]),
                       tensor('transformer.x_embedders.image.lora.up.weight', 'F32', [D, 2])],
                      {'lora_adapter_metadata': json.dumps({'r': 2, 'lora_alpha': 4})}),
        'flux3_dora': (lora_pair('transformer.', 'mode_blocks.0.attn.to_k', D, D) +
                       [tensor('transformer.mode_blocks.0.attn.to_k.lora_magnitude_vector', 'F32', [D])], None),
    }
    # LyCORIS LoKr (w1 full + w2 decomposed; both full on the packed rowwise single to_out), BFL-named LoHa on
    # the fused qkv and the swapped final layer, ComfyUI diffs (a 1-D norm scale, the fp8 proj_out: a dense
    # term) with an ignored .diff_b; drawn from a saved generator state, so the seeds written after them
    # stay the same bytes
    global _seed
    saved = _seed
    ly = 'lycoris_transformer_blocks_0_attn_to_q'
    lo = 'lycoris_single_transformer_blocks_0_attn_to_out'
    seeds['lycoris_lokr'] = ([tensor(ly + '.lokr_w1', 'F32', [4, 4]), tensor(ly + '.lokr_w2_a', 'F32', [4, 2]),
                              tensor(ly + '.lokr_w2_b', 'F32', [2, 4]), tensor(ly + '.alpha', 'F32', [], [1.0]),
                              tensor(lo + '.lokr_w1', 'BF16', [2, 8]), tensor(lo + '.lokr_w2', 'F16', [8, 8]),
                              tensor(lo + '.alpha', 'F32', [], [100000.0])], None)
    hq, hf = 'diffusion_model.double_blocks.0.img_attn.qkv', 'diffusion_model.final_layer.adaLN_modulation.1'
    seeds['bfl_loha'] = ([tensor(hq + '.hada_w1_a', 'F32', [3 * D, 2]), tensor(hq + '.hada_w1_b', 'F32', [2, D]),
                          tensor(hq + '.hada_w2_a', 'F32', [3 * D, 2]), tensor(hq + '.hada_w2_b', 'F32', [2, D]),
                          tensor(hq + '.alpha', 'F32', [], [2.0]),
                          tensor(hf + '.hada_w1_a', 'BF16', [2 * D, 1]), tensor(hf + '.hada_w1_b', 'BF16', [1, D]),
                          tensor(hf + '.hada_w2_a', 'BF16', [2 * D, 1]), tensor(hf + '.hada_w2_b', 'BF16', [1, D])],
                         None)
    seeds['comfy_diff'] = ([tensor('transformer_blocks.0.attn.norm_q.weight.diff', 'F32', [8]),
                            tensor('transformer_blocks.0.attn.to_k.diff', 'F16', [D, D]),
                            tensor('transformer_blocks.0.attn.to_k.diff_b', 'F16', [D]),
                            tensor('proj_out.diff', 'F32', [8, D])], None)
    _seed = saved
    # findings of fuzz_lora, kept as regression seeds
    seeds['regress_alpha_only'] = ([tensor('lora_unet_img_in.alpha', 'F32', [], [4.0]),
                                    tensor('lora_unet_txt_in.alpha', 'F32', [], [4.0])], None)
    # a file of only .diff_b keys (every key ignored: accepted with no module, qsort(NULL, 0)); now refused
    seeds['regress_diff_b_only'] = ([tensor('diffusion_model.double_blocks.0.img_attn.qkv.diff_b', 'F16', [3 * D],
                                            [0.01] * (3 * D))], None)
    for name, (t, meta) in seeds.items():
        write_st(os.path.join(out, name + '.safetensors'), t, meta)
    # the golden sets' real adapters, trimmed
    for sub in ('flux2-lora/adapters', 'flux2-lora-dialects/adapters'):
        d = os.path.join(GOLDEN, sub)
        for f in sorted(os.listdir(d)):
            if f.endswith('.safetensors'):
                trim(os.path.join(d, f), os.path.join(out, 'golden_' + f))

def fp8_seeds(out):
    q = lambda m, fmt='float8_e4m3fn': {m: {'format': fmt}}
    w = lambda name, rows, cols, dt='F8_E4M3': tensor(name, dt, [rows, cols])
    cq = lambda name, obj: (name, 'U8', [len(json.dumps(obj))], json.dumps(obj).encode())
    seeds = {
        # ComfyUI scaled fp8: scale_weight scalars, the scaled_fp8 marker, scale_input, _quantization_metadata
        'scaled_meta': ([w('transformer_blocks.0.attn.to_q.weight', D, D),
                         tensor('transformer_blocks.0.attn.to_q.scale_weight', 'F32', [], [0.5]),
                         tensor('transformer_blocks.0.attn.to_q.scale_input', 'F32', [], [1.0]),
                         w('single_transformer_blocks.0.attn.to_out.weight', D, D + M),
                         tensor('single_transformer_blocks.0.attn.to_out.scale_weight', 'F32', [1], [0.25]),
                         tensor('scaled_fp8', 'F8_E4M3', [2], [0, 0]),
                         tensor('x_embedder.weight', 'BF16', [D, 8])],
                        {'format': 'pt', '_quantization_metadata': json.dumps(
                            {'format_version': '1.0', 'layers': {**q('transformer_blocks.0.attn.to_q'),
                                                                 **q('single_transformer_blocks.0.attn.to_out')}})}),
        # per-output-channel weight_scale ([out] and [out, 1]), input_scale
        'channel': ([w('transformer_blocks.0.ff.linear_in.weight', 2 * M, D),
                     tensor('transformer_blocks.0.ff.linear_in.weight_scale', 'F32', [2 * M], [0.01 * (i + 1) for i in range(2 * M)]),
                     tensor('transformer_blocks.0.ff.linear_in.input_scale', 'F32', [], [2.0]),
                     w('transformer_blocks.0.attn.to_out.0.weight', D, D),
                     tensor('transformer_blocks.0.attn.to_out.0.weight_scale', 'F32', [D, 1], [0.1] * D),
                     w('single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight', 3 * D + 2 * M, D),
                     tensor('single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight_scale', 'BF16',
                            [3 * D + 2 * M], [0.125] * (3 * D + 2 * M))], {'format': 'pt'}),
        # raw fp8 (no scale, s = 1), E5M2 and E4M3 side by side
        'raw_e5m2': ([w('transformer_blocks.0.attn.to_k.weight', D, D, 'F8_E5M2'),
                      w('transformer_blocks.0.attn.to_v.weight', D, D),
                      tensor('norm_out.linear.weight', 'BF16', [2 * D, D])], None),
        # per-layer .comfy_quant U8 JSON (full_precision_matrix_mult), a legacy scaled_fp8 marker of 1 value
        'comfy_quant': ([w('transformer_blocks.0.attn.add_q_proj.weight', D, D),
                         tensor('transformer_blocks.0.attn.add_q_proj.weight_scale', 'F32', [], [0.5]),
                         cq('transformer_blocks.0.attn.add_q_proj.comfy_quant',
                            {'format': 'float8_e4m3fn', 'full_precision_matrix_mult': True}),
                         w('transformer_blocks.0.attn.add_k_proj.weight', D, D, 'F8_E5M2'),
                         tensor('transformer_blocks.0.attn.add_k_proj.weight_scale', 'F16', [1], [2.0]),
                         cq('transformer_blocks.0.attn.add_k_proj.comfy_quant', {'format': 'float8_e5m2'}),
                         tensor('scaled_fp8', 'F8_E4M3', [1], [0])], None),
        # BFL names (a BFL single-file checkpoint) with hints in both places
        'bfl_both_hints': ([w('double_blocks.0.img_attn.qkv.weight', 3 * D, D),
                            tensor('double_blocks.0.img_attn.qkv.weight_scale', 'F32', [3 * D], [0.5] * (3 * D)),
                            cq('double_blocks.0.img_attn.qkv.comfy_quant', {'format': 'float8_e4m3fn'}),
                            w('single_blocks.0.linear2.weight', D, D + M),
                            tensor('single_blocks.0.linear2.weight_scale', 'F32', [], [1.0]),
                            tensor('img_in.weight', 'BF16', [D, 8])],
                           {'_quantization_metadata': json.dumps({'layers': {**q('double_blocks.0.img_attn.qkv'),
                                                                             **q('single_blocks.0.linear2')}})}),
        # a ComfyUI save: every name behind model.diffusion_model., hints with the prefix, a VAE tensor beside
        'comfy_prefixed': ([w('model.diffusion_model.transformer_blocks.0.attn.to_q.weight', D, D),
                            tensor('model.diffusion_model.transformer_blocks.0.attn.to_q.weight_scale', 'F32', [], [0.5]),
                            tensor('model.diffusion_model.x_embedder.weight', 'BF16', [D, 8]),
                            tensor('first_stage_model.decoder.conv_in.weight', 'BF16', [4, 4])],
                           {'_quantization_metadata': json.dumps(
                               {'layers': q('model.diffusion_model.transformer_blocks.0.attn.to_q')})}),
    }
    for name, (t, meta) in seeds.items():
        write_st(os.path.join(out, name + '.safetensors'), t, meta)
    for v in ('scaled', 'channel', 'e5m2'):
        d = os.path.join(GOLDEN, 'flux2-fp8', v, 'transformer')
        for f in sorted(os.listdir(d)):
            if f.endswith('.safetensors'):
                trim_fp8(os.path.join(d, f), os.path.join(out, 'golden_%s_%s' % (v, f.replace('diffusion_pytorch_model', 'dpm'))))

for name, fn in (('lora', lora_seeds), ('fp8', fp8_seeds)):
    out = os.path.join(ROOT, 'corpus', name)
    os.makedirs(out, exist_ok=True)
    fn(out)
