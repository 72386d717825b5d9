#!/usr/bin/env python3
"""Pack the upstream flux2-lora-dialects golden set (/work/shared/golden) for
the repository: tests/data/golden/flux2-lora-dialects.tar.xz.

Kept: the adapters that compress small, their reference outputs rewritten as
`tpgen check --cases/--outputs` files (cases_klein / cases_dev: case0.* from
inputs.safetensors with the base output; outputs: <adapter>_s<strength>.case0.output),
manifest.json, README.md, the two transformers' config.json and safetensors
headers. Left out: the transformers' weights (13 MB of f32 randn, regenerated
at test time bit for bit by `tpgen_tests lora_dialects_make_models` and checked
against the manifest's sha256) and the two large ComfyUI diff files (3.8 MB),
which tests/sh/lora_dialects.sh reads from the upstream folder when present.
Standard library only. Usage: pack_lora_dialects.py SRC STAGE_DIR"""
import json, os, shutil, struct, sys

LEFT_OUT = {"comfy_full_diff", "comfy_diff_norms"}


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        data = f.read()
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in h.items()}


def write_st(path, tensors):
    hdr, off, blobs = {}, 0, []
    for k in sorted(tensors):
        dt, shape, b = tensors[k]
        hdr[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    hj = json.dumps(hdr, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))


def main(src, out):
    out = os.path.join(out, "flux2-lora-dialects")
    os.makedirs(os.path.join(out, "adapters"), exist_ok=True)
    man = json.load(open(os.path.join(src, "manifest.json")))
    inp = read_st(os.path.join(src, "inputs.safetensors"))
    for model, base, with_g in (("klein", "base", False), ("dev", "base_dev", True)):
        case = {"case0." + k: v for k, v in inp.items() if k != "guidance" or with_g}
        case["case0.output"] = read_st(os.path.join(src, "ref", base + ".safetensors"))["output"]
        write_st(os.path.join(out, "cases_%s.safetensors" % model), case)
    outs = {}
    for a in man["adapters"]:
        name = a["name"]
        for r in a["references"]:
            outs["%s_s%s.case0.output" % (name, r["strength"])] = read_st(os.path.join(src, r["file"]))["output"]
        if name not in LEFT_OUT:
            shutil.copy(os.path.join(src, a["file"]), os.path.join(out, a["file"]))
    write_st(os.path.join(out, "outputs.safetensors"), outs)
    for d in ("transformer", "transformer_dev"):
        os.makedirs(os.path.join(out, d), exist_ok=True)
        shutil.copy(os.path.join(src, d, "config.json"), os.path.join(out, d))
        with open(os.path.join(src, d, "diffusion_pytorch_model.safetensors"), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            with open(os.path.join(out, d, "diffusion_pytorch_model.header"), "wb") as g:
                g.write(f.read(n))
    shutil.copy(os.path.join(src, "manifest.json"), out)
    shutil.copy(os.path.join(src, "README.md"), out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
