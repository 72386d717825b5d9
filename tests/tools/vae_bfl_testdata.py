#!/usr/bin/env python3
"""The golden tiny VAE (golden/vae-tiny, diffusers AutoencoderKLFlux2 names)
renamed to the original BFL/LDM names of ComfyUI's vae/flux2-vae.safetensors,
for tests/sh/components.sh.

Renames (standard library only, deterministic bytes), then proves the round
trip with diffusers' own single-file converter: convert_ldm_vae_checkpoint
(diffusers 0.42.1, loaders/single_file_utils.py) on the BFL tensors, plus the
FLUX.2 latent BatchNorm `bn.*` (running_mean, running_var,
num_batches_tracked: the same names in both
layouts; that converter predates it and drops it), must give exactly the
golden diffusers tensors: the same names, shapes, dtypes and bytes. The
verified file's sha256 goes to tests/data/vae-bfl/vae-tiny-bfl.sha256 (the
file itself, 2 MB of random bf16, is not committed): the test renames the
golden VAE again with `--no-verify --raw` and checks that sha256.

    /work/venv-flux3/bin/python tests/tools/vae_bfl_testdata.py \
        /work/shared/golden/vae-tiny/model/vae tests/data/vae-bfl       # verify, write the sha256
    python3 tests/tools/vae_bfl_testdata.py SRC_VAE_DIR OUT_DIR --no-verify --raw   # OUT_DIR/flux2-vae.safetensors

(torch 2.15, diffusers 0.42.1, safetensors; the renaming itself needs only
the standard library: `--no-verify` skips the diffusers check.)
The map (the inverse of core/models/vae/vae_bfl_names.c, written independently):
conv_norm_out -> norm_out; down_blocks.I.resnets.J -> down.I.block.J;
down_blocks.I.downsamplers.0 -> down.I.downsample; up_blocks.I.resnets.J ->
up.(N-1-I).block.J; up_blocks.I.upsamplers.0 -> up.(N-1-I).upsample;
mid_block.resnets.K -> mid.block_(K+1); mid_block.attentions.0.{group_norm,
to_q,to_k,to_v,to_out.0} -> mid.attn_1.{norm,q,k,v,proj_out} with the
projections as 1x1 convolutions [C, C, 1, 1]; conv_shortcut -> nin_shortcut.
"""
import json, os, re, struct, sys


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    meta = hdr.pop("__metadata__", None)
    return hdr, data, meta


def bfl_name(name, n_up):
    attn = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}
    name = name.replace("conv_norm_out.", "norm_out.")
    m = re.match(r"encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", name)
    if m:
        return "encoder.down.%s.block.%s.%s" % (m[1], m[2], m[3].replace("conv_shortcut", "nin_shortcut"))
    m = re.match(r"encoder\.down_blocks\.(\d+)\.downsamplers\.0\.(.*)", name)
    if m:
        return "encoder.down.%s.downsample.%s" % (m[1], m[2])
    m = re.match(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", name)
    if m:
        return "decoder.up.%d.block.%s.%s" % (n_up - 1 - int(m[1]), m[2], m[3].replace("conv_shortcut", "nin_shortcut"))
    m = re.match(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.*)", name)
    if m:
        return "decoder.up.%d.upsample.%s" % (n_up - 1 - int(m[1]), m[2])
    m = re.match(r"(encoder|decoder)\.mid_block\.resnets\.(\d+)\.(.*)", name)
    if m:
        return "%s.mid.block_%d.%s" % (m[1], int(m[2]) + 1, m[3].replace("conv_shortcut", "nin_shortcut"))
    m = re.match(r"(encoder|decoder)\.mid_block\.attentions\.0\.(.*)\.(weight|bias)", name)
    if m:
        return "%s.mid.attn_1.%s.%s" % (m[1], attn[m[2]], m[3])
    return name


def rename(src_dir):
    cfg = json.load(open(os.path.join(src_dir, "config.json")))
    hdr, data, _ = read_st(os.path.join(src_dir, "diffusion_pytorch_model.safetensors"))
    n_up = len(cfg["up_block_types"])
    out = {}
    for k, v in hdr.items():
        nk = bfl_name(k, n_up)
        shape = list(v["shape"])
        if ".mid.attn_1." in nk and nk.endswith(".weight") and not ".norm." in nk:
            shape = shape + [1, 1]   # BFL: 1x1 convolutions
        assert nk not in out, nk
        out[nk] = (v["dtype"], shape, data[v["data_offsets"][0]:v["data_offsets"][1]])
    return cfg, hdr, data, out


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


def verify(cfg, bfl_bytes, golden_path):
    import torch
    from safetensors.torch import load_file, load
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint
    import diffusers
    bfl = load(bfl_bytes)
    conv = convert_ldm_vae_checkpoint(bfl, cfg)
    for k in bfl:   # the BatchNorm (running_mean/var, num_batches_tracked): same names
        if k.startswith("bn."):
            conv[k] = bfl[k]
    gold = load_file(golden_path)
    assert sorted(conv) == sorted(gold), (set(conv) ^ set(gold))
    for k in gold:
        assert conv[k].dtype == gold[k].dtype and conv[k].shape == gold[k].shape and torch.equal(conv[k], gold[k]), k
    print("verified with diffusers %s convert_ldm_vae_checkpoint: %d tensors equal" % (diffusers.__version__, len(gold)))


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    src, dst = args[0], args[1]
    cfg, _, _, out = rename(src)
    blob = write_st(out)
    if "--no-verify" not in sys.argv:
        verify(cfg, blob, os.path.join(src, "diffusion_pytorch_model.safetensors"))
    os.makedirs(dst, exist_ok=True)
    if "--raw" in sys.argv:
        open(os.path.join(dst, "flux2-vae.safetensors"), "wb").write(blob)
    else:
        import hashlib
        open(os.path.join(dst, "vae-tiny-bfl.sha256"), "w").write(
            "%s  vae-tiny-bfl.safetensors\n" % hashlib.sha256(blob).hexdigest())

if __name__ == "__main__":
    main()
