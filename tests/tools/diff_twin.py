#!/usr/bin/env python3
"""A ComfyUI full-diff patch and its merged twin, for tests/sh/lora_dialects.sh
(standard library only).

    diff_twin.py MODEL_DIR OUT_DIR

MODEL_DIR holds a FLUX.2 transformer in diffusers names (f32 safetensors, as
the flux2-lora-dialects set's tiny klein). For every weight it draws a delta in
diffusers layout (a fixed LCG, scaled by 1/sqrt(fan_in), rounded to fp16 for
the linears, f32 for the QK-norm scales) and writes

- OUT_DIR/comfy_diff.safetensors: the deltas as ComfyUI's LoraSave(full_diff)
  stores them, `diffusion_model.<BFL parameter>.diff` over the fused BFL
  weights (q|k|v stacked, final_layer.adaLN_modulation.1 with its (shift,
  scale) halves in BFL order), plus two `.diff_b` keys for Linears without a
  bias (tpgen must warn about them by name, docs/spec/lora-dialects.md §4);
- OUT_DIR/comfy_diff_unswapped.safetensors: the same with the adaLN halves in
  diffusers order: a wrong file, which must not match;
- OUT_DIR/merged_<s>/: the model with W + s*delta merged here, in diffusers
  layout, for s = 1.0 and 0.5 (the sum rounded once to f32).

The fusing below is written from the spec's name table (§0), independently of
tpgen's splitter, so `tpgen check --model MODEL_DIR --lora comfy_diff:s
--against merged_<s>` compares the two ways of getting the same weights."""
import array, json, math, os, shutil, struct, sys


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", f"{path}: {k} is {v['dtype']}, want F32"
        a, b = v["data_offsets"]
        out[k] = (v["shape"], array.array("f", data[a:b]))
    return out


def write_st(path, tensors):
    """tensors: list of (name, dtype 'F16'|'F32', shape, values)"""
    hdr, blobs, off = {}, [], 0
    for name, dt, shape, vals in tensors:
        b = struct.pack("<%d%s" % (len(vals), "e" if dt == "F16" else "f"), *vals)
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hj = json.dumps(hdr, sort_keys=True).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))


class Lcg:
    def __init__(self, seed):
        self.s = seed

    def unit(self):   # uniform in [-1, 1)
        self.s = (self.s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        return ((self.s >> 11) / float(1 << 53)) * 2.0 - 1.0


def f16(x):
    return struct.unpack("<e", struct.pack("<e", x))[0]


def deltas(model):
    g, out = Lcg(20261206), {}
    for name in sorted(model):
        shape, _ = model[name]
        n = 1
        for s in shape:
            n *= s
        if len(shape) == 2:
            sc = 0.15 / math.sqrt(shape[1])
            out[name] = [f16(sc * g.unit()) for _ in range(n)]
        else:   # QK-norm scales: f32
            out[name] = [struct.unpack("<f", struct.pack("<f", 0.3 * g.unit()))[0] for _ in range(n)]
    return out


def rows(vals, cols, a, b):
    return vals[a * cols:b * cols]


def bfl_patch(model, d, swap=True):
    """The diffusers-layout deltas d as BFL-named .diff tensors (swap=False:
    the adaLN halves left in diffusers order, a wrong file for a negative test)."""
    out = []

    def put(bfl, shape, vals, dt="F16"):
        out.append(("diffusion_model." + bfl + ".diff", dt, shape, vals))

    def w(name):
        return model[name + ".weight"][0], d[name + ".weight"]

    i = 0
    while "transformer_blocks.%d.attn.to_q.weight" % i in model:
        p, b = "transformer_blocks.%d." % i, "double_blocks.%d." % i
        for side, (q, k, v, o), mlp in (("img", ("to_q", "to_k", "to_v", "to_out.0"), "ff"),
                                         ("txt", ("add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"), "ff_context")):
            sq, vq = w(p + "attn." + q)
            _, vk = w(p + "attn." + k)
            _, vv = w(p + "attn." + v)
            put(b + side + "_attn.qkv", [3 * sq[0], sq[1]], vq + vk + vv)
            s, v_ = w(p + "attn." + o)
            put(b + side + "_attn.proj", s, v_)
            s, v_ = w(p + mlp + ".linear_in")
            put(b + side + "_mlp.0", s, v_)
            s, v_ = w(p + mlp + ".linear_out")
            put(b + side + "_mlp.2", s, v_)
        for side, nq, nk in (("img", "norm_q", "norm_k"), ("txt", "norm_added_q", "norm_added_k")):
            s, v_ = w(p + "attn." + nq)
            put(b + side + "_attn.norm.query_norm.scale", s, v_, "F32")
            s, v_ = w(p + "attn." + nk)
            put(b + side + "_attn.norm.key_norm.scale", s, v_, "F32")
        i += 1
    i = 0
    while "single_transformer_blocks.%d.attn.to_out.weight" % i in model:
        p, b = "single_transformer_blocks.%d.attn." % i, "single_blocks.%d." % i
        for dn, bn, dt in (("to_qkv_mlp_proj", "linear1", "F16"), ("to_out", "linear2", "F16"),
                           ("norm_q", "norm.query_norm.scale", "F32"), ("norm_k", "norm.key_norm.scale", "F32")):
            s, v_ = w(p + dn)
            put(b + bn, s, v_, dt)
        i += 1
    for dn, bn in (("x_embedder", "img_in"), ("context_embedder", "txt_in"), ("proj_out", "final_layer.linear"),
                   ("time_guidance_embed.timestep_embedder.linear_1", "time_in.in_layer"),
                   ("time_guidance_embed.timestep_embedder.linear_2", "time_in.out_layer"),
                   ("double_stream_modulation_img.linear", "double_stream_modulation_img.lin"),
                   ("double_stream_modulation_txt.linear", "double_stream_modulation_txt.lin"),
                   ("single_stream_modulation.linear", "single_stream_modulation.lin")):
        s, v_ = w(dn)
        put(bn, s, v_)
    # diffusers norm_out.linear rows are (scale, shift); BFL's adaLN_modulation.1 are (shift, scale)
    s, v_ = w("norm_out.linear")
    half = s[0] // 2
    put("final_layer.adaLN_modulation.1", s, rows(v_, s[1], half, s[0]) + rows(v_, s[1], 0, half) if swap else v_)
    # bias patches for Linears that have no bias: warned about, not merged
    for bn, n in (("double_blocks.0.img_attn.qkv", model["transformer_blocks.0.attn.to_q.weight"][0][0] * 3),
                  ("single_blocks.0.linear2", model["single_transformer_blocks.0.attn.to_out.weight"][0][0])):
        out.append(("diffusion_model." + bn + ".diff_b", "F16", [n], [f16(0.01 * ((j % 5) - 2)) for j in range(n)]))
    return out


def main(model_dir, out_dir):
    st = os.path.join(model_dir, "diffusion_pytorch_model.safetensors")
    model = read_st(st)
    d = deltas(model)
    os.makedirs(out_dir, exist_ok=True)
    write_st(os.path.join(out_dir, "comfy_diff.safetensors"), bfl_patch(model, d))
    write_st(os.path.join(out_dir, "comfy_diff_unswapped.safetensors"), bfl_patch(model, d, swap=False))
    for s in (1.0, 0.5):
        m = os.path.join(out_dir, "merged_%s" % s)
        os.makedirs(m, exist_ok=True)
        shutil.copy(os.path.join(model_dir, "config.json"), m)
        ts = []
        for name in sorted(model):
            shape, w = model[name]
            ts.append((name, "F32", shape, array.array("f", [a + s * b for a, b in zip(w, d[name])])))
        write_st(os.path.join(m, "diffusion_pytorch_model.safetensors"), ts)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: diff_twin.py MODEL_DIR OUT_DIR")
    main(sys.argv[1], sys.argv[2])
