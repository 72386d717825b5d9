#!/usr/bin/env python3
"""A small random FLUX.2 transformer with 3 heads (tp 1 and 3 divide it),
for tests/sh/cache.sh's tp 3 check (standard library only):

  cache_model.py OUT_DIR [SEED]

Writes OUT_DIR/config.json and diffusion_pytorch_model.safetensors (F32,
diffusers names): D 96 = 3 x 32, MLP 288, 2 double + 3 single blocks, in
16, joint 32, 64 time channels, guidance embeds. As in the flux2-cache
golden model, the time embedders' high-frequency input columns are zero,
so that the first block's residual moves smoothly from step to step (a
random net's otherwise changes by 60-120 % and nothing would be cached)."""
import json, math, os, random, struct, sys

HEADS, HD, IN, JOINT, TC, ND, NS = 3, 32, 16, 32, 64, 2, 3
D = HEADS * HD
M = 3 * D


def shapes():
    s = {'x_embedder.weight': [D, IN], 'context_embedder.weight': [D, JOINT],
         'double_stream_modulation_img.linear.weight': [6 * D, D],
         'double_stream_modulation_txt.linear.weight': [6 * D, D],
         'single_stream_modulation.linear.weight': [3 * D, D],
         'norm_out.linear.weight': [2 * D, D], 'proj_out.weight': [IN, D]}
    for e in ('timestep_embedder', 'guidance_embedder'):
        s['time_guidance_embed.%s.linear_1.weight' % e] = [D, TC]
        s['time_guidance_embed.%s.linear_2.weight' % e] = [D, D]
    for i in range(ND):
        p = 'transformer_blocks.%d.' % i
        for n in ('to_q', 'to_k', 'to_v', 'add_q_proj', 'add_k_proj', 'add_v_proj', 'to_add_out', 'to_out.0'):
            s[p + 'attn.%s.weight' % n] = [D, D]
        for n in ('norm_q', 'norm_k', 'norm_added_q', 'norm_added_k'):
            s[p + 'attn.%s.weight' % n] = [HD]
        for f in ('ff', 'ff_context'):
            s[p + f + '.linear_in.weight'] = [2 * M, D]
            s[p + f + '.linear_out.weight'] = [D, M]
    for i in range(NS):
        p = 'single_transformer_blocks.%d.attn.' % i
        s[p + 'to_qkv_mlp_proj.weight'] = [3 * D + 2 * M, D]
        s[p + 'to_out.weight'] = [D, D + M]
        s[p + 'norm_q.weight'] = [HD]
        s[p + 'norm_k.weight'] = [HD]
    return s


def values(rng, name, shape):
    if len(shape) == 1:
        return [1.0 + 0.1 * (2 * rng.random() - 1) for _ in range(shape[0])]
    rows, cols = shape
    a = math.sqrt(3.0 / cols)
    v = [a * (2 * rng.random() - 1) for _ in range(rows * cols)]
    if name.endswith('_embedder.linear_1.weight'):
        half = cols // 2   # sinusoid columns: cos of half frequencies, then sin; zero those above 0.002
        for c in range(cols):
            if math.exp(-math.log(10000.0) * (c % half) / half) > 0.002:
                for r in range(rows):
                    v[r * cols + c] = 0.0
    return v


def main(out, seed=7):
    os.makedirs(out, exist_ok=True)
    rng = random.Random(seed)
    h, blobs, off = {}, [], 0
    for name, shape in sorted(shapes().items()):
        data = struct.pack('<%df' % math.prod(shape), *values(rng, name, shape))
        h[name] = {'dtype': 'F32', 'shape': shape, 'data_offsets': [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    hj = json.dumps(h, separators=(',', ':')).encode()
    hj += b' ' * (-len(hj) % 8)
    with open(os.path.join(out, 'diffusion_pytorch_model.safetensors'), 'wb') as f:
        f.write(struct.pack('<Q', len(hj)) + hj + b''.join(blobs))
    cfg = {'_class_name': 'Flux2Transformer2DModel', 'attention_head_dim': HD, 'axes_dims_rope': [8, 8, 8, 8],
           'eps': 1e-6, 'guidance_embeds': True, 'in_channels': IN, 'joint_attention_dim': JOINT, 'mlp_ratio': 3.0,
           'num_attention_heads': HEADS, 'num_layers': ND, 'num_single_layers': NS, 'out_channels': None,
           'patch_size': 1, 'rope_theta': 2000, 'timestep_guidance_channels': TC}
    with open(os.path.join(out, 'config.json'), 'w') as f:
        json.dump(cfg, f, indent=1)


if __name__ == '__main__':
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 7)
