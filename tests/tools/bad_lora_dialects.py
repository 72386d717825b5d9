#!/usr/bin/env python3
"""Write the malformed adapters of tests/sh/lora_dialects.sh into DIR (standard
library only), for the tiny klein of the flux2-lora-dialects set (D 128, 4
heads x 32): each is wrong in one way that tpgen must refuse by name."""
import json, math, struct, sys


def write(path, tensors):
    hdr, off, blobs = {}, 0, []
    for name, shape, vals in tensors:
        b = struct.pack("<%df" % len(vals), *vals)
        hdr[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    hj = json.dumps(hdr).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))


def t(name, shape, v=0.01):
    n = 1
    for s in shape:
        n *= s
    return (name, shape, [v * ((i % 7) - 3) for i in range(n)])


def main(d):
    q = "lycoris_transformer_blocks_0_attn_to_q"
    # kron(w1 [3, 4], w2 [40, 32]) is [120, 128]; to_q is [128, 128]
    write(d + "/kron_shape.safetensors", [t(q + ".lokr_w1", [3, 4]), t(q + ".lokr_w2", [40, 32])])
    nan = t(q + ".lokr_w2", [16, 16])
    nan[2][37] = math.nan
    write(d + "/nan.safetensors", [t(q + ".lokr_w1", [8, 8]), nan])
    write(d + "/inf_alpha.safetensors", [t(q + ".lokr_w1", [8, 8]), t(q + ".lokr_w2_a", [16, 4]),
                                         t(q + ".lokr_w2_b", [4, 16]), (q + ".alpha", [], [math.inf])])
    p = "diffusion_model.double_blocks.0.img_attn.proj"
    write(d + "/two_dialects.safetensors", [t(p + ".lora_A.weight", [4, 128]), t(p + ".lora_B.weight", [128, 4]),
                                            t(p + ".lokr_w1", [8, 8]), t(p + ".lokr_w2", [16, 16])])
    o = "diffusion_model.transformer_blocks.0.attn.to_out.0"
    write(d + "/two_names.safetensors", [t(p + ".diff", [128, 128]), t(o + ".hada_w1_a", [128, 2]),
                                         t(o + ".hada_w1_b", [2, 128]), t(o + ".hada_w2_a", [128, 2]),
                                         t(o + ".hada_w2_b", [2, 128])])
    write(d + "/loha_shape.safetensors", [t(o + ".hada_w1_a", [128, 2]), t(o + ".hada_w1_b", [2, 128]),
                                          t(o + ".hada_w2_a", [128, 2]), t(o + ".hada_w2_b", [2, 96])])
    write(d + "/tucker.safetensors", [t(q + ".lokr_w1", [8, 8]), t(q + ".lokr_w2_a", [16, 4]),
                                      t(q + ".lokr_w2_b", [4, 16]), t(q + ".lokr_t2", [4, 4, 1, 1])])
    write(d + "/diff_b_only.safetensors", [t("diffusion_model.double_blocks.0.img_attn.qkv.diff_b", [384]),
                                           t("diffusion_model.single_blocks.1.linear2.diff_b", [128])])
    write(d + "/unknown.safetensors", [t("model.layers.0.mlp.gate.weight", [4, 4]),
                                       t("model.layers.0.mlp.up.weight", [4, 4])])


if __name__ == "__main__":
    main(sys.argv[1])
