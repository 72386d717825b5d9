#!/usr/bin/env python3
"""The golden tiny FLUX.3 transformers (golden/flux3-tiny/{base,flowmap},
diffusers Flux3Transformer2DModel names) renamed to the original Black
Forest Labs single-file names, for tests/sh/flux3_bfl.sh.

Renames (standard library only, deterministic bytes), then proves the
inversion with diffusers' own converter: convert_flux3_transformer_
checkpoint_to_diffusers (diffusers 0.42.1, loaders/single_file_utils.py)
on the BFL tensors must give exactly the golden diffusers tensors (names,
shapes, dtypes, bytes). The verified files' sha256 go to
tests/data/flux3-bfl/flux3-bfl.sha256 (the files, 4.7 MB of random f32
each, are not committed); the test renames the golden tensors again with
`--no-verify --raw` and checks those sha256.

    /work/venv-flux3/bin/python tests/tools/flux3_bfl_testdata.py \\
        build/golden/flux3-tiny tests/data/flux3-bfl          # verify both, write the sha256
    python3 tests/tools/flux3_bfl_testdata.py GOLDEN_FLUX3_TINY OUT_DIR --no-verify --raw [--prefix]
        # OUT_DIR/{base,flowmap}/flux3-tiny-bfl.safetensors; --prefix: names behind model.diffusion_model.

(torch 2.15, diffusers 0.42.1, safetensors; the renaming needs only the
standard library.) The map (the converter's, inverted): time_in /
ref_time_in in_layer/out_layer <- (target_)timestep_embedder.linear_1/2;
final_layer.image.linear <- proj_out; final_layer.image.adaLN_modulation.1
<- norm_out.linear with its two row halves swapped (BFL [shift; scale]);
emb_in. <- x_embedders., txt_in. <- context_embedder., content_mode_blocks.
<- mode_blocks., single_blocks. <- single_transformer_blocks.; .lin.weight
<- .linear.weight; q_proj/k_proj/v_proj/attn_out <- attn.to_q/k/v/out.0;
norm.query_norm/key_norm.scale <- attn.norm_q/k.weight; mlp_in/mlp_out <-
ff.linear_in/out. Nothing is fused, so nothing is split.
"""
import hashlib, json, os, struct, sys

EXACT = {
    "timestep_embedder.linear_1.weight": "time_in.in_layer.weight",
    "timestep_embedder.linear_2.weight": "time_in.out_layer.weight",
    "target_timestep_embedder.linear_1.weight": "ref_time_in.in_layer.weight",
    "target_timestep_embedder.linear_2.weight": "ref_time_in.out_layer.weight",
    "proj_out.weight": "final_layer.image.linear.weight",
    "norm_out.linear.weight": "final_layer.image.adaLN_modulation.1.weight",
}
PREFIX = [("x_embedders.", "emb_in."), ("context_embedder.", "txt_in."), ("mode_blocks.", "content_mode_blocks."),
          ("single_transformer_blocks.", "single_blocks.")]
SUFFIX = [("attn.to_q.weight", "q_proj.weight"), ("attn.to_k.weight", "k_proj.weight"),
          ("attn.to_v.weight", "v_proj.weight"), ("attn.to_out.0.weight", "attn_out.weight"),
          ("attn.norm_q.weight", "norm.query_norm.scale"), ("attn.norm_k.weight", "norm.key_norm.scale"),
          ("ff.linear_in.weight", "mlp_in.weight"), ("ff.linear_out.weight", "mlp_out.weight")]


def bfl_name(k):
    if k in EXACT:
        return EXACT[k]
    for a, b in PREFIX:
        if k.startswith(a):
            k = b + k[len(a):]
            break
    for a, b in SUFFIX:
        if k.endswith(a):
            return k[:-len(a)] + b
    return k.replace(".linear.weight", ".lin.weight")


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    hdr.pop("__metadata__", None)
    return hdr, data


def rename(src, pfx=""):
    hdr, data = read_st(src)
    out = {}
    for k, v in hdr.items():
        b = data[v["data_offsets"][0]:v["data_offsets"][1]]
        if k == "norm_out.linear.weight":   # diffusers [scale; shift] -> BFL [shift; scale]
            h = len(b) // 2
            b = b[h:] + b[:h]
        nk = pfx + bfl_name(k)
        assert nk not in out, nk
        out[nk] = (v["dtype"], list(v["shape"]), b)
    return out


def write_st(tensors):
    hdr, blobs, off = {}, [], 0
    for k in sorted(tensors):
        dt, shape, b = tensors[k]
        hdr[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def verify(blob, golden_path):
    import torch
    import diffusers
    from safetensors.torch import load, load_file
    from diffusers.loaders.single_file_utils import convert_flux3_transformer_checkpoint_to_diffusers
    conv = convert_flux3_transformer_checkpoint_to_diffusers(load(blob))
    gold = load_file(golden_path)
    assert sorted(conv) == sorted(gold), set(conv) ^ set(gold)
    for k in gold:
        assert conv[k].dtype == gold[k].dtype and conv[k].shape == gold[k].shape and torch.equal(conv[k], gold[k]), k
    print("verified with diffusers %s convert_flux3_transformer_checkpoint_to_diffusers: %d tensors equal (%s)"
          % (diffusers.__version__, len(gold), golden_path))


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    src, dst = args[0], args[1]
    pfx = "model.diffusion_model." if "--prefix" in sys.argv else ""
    sums = []
    for v in ("base", "flowmap"):
        g = os.path.join(src, v, "model", "transformer", "diffusion_pytorch_model.safetensors")
        blob = write_st(rename(g, pfx))
        if "--no-verify" not in sys.argv:
            verify(blob, g)
        if "--raw" in sys.argv:
            os.makedirs(os.path.join(dst, v), exist_ok=True)
            open(os.path.join(dst, v, "flux3-tiny-bfl.safetensors"), "wb").write(blob)
        sums.append("%s  %s/flux3-tiny-bfl.safetensors\n" % (hashlib.sha256(blob).hexdigest(), v))
    if "--raw" not in sys.argv:
        os.makedirs(dst, exist_ok=True)
        open(os.path.join(dst, "flux3-bfl.sha256"), "w").write("".join(sums))


if __name__ == "__main__":
    main()
