#!/usr/bin/env python3
"""Golden data for FLUX.3 transformers stored as GGUF (tests/sh/flux3_gguf.sh, docs/flux3.md "GGUF").

    tests/unpack-golden.sh build/golden
    /work/venv-flux3/bin/python tests/tools/flux3_gguf_golden.py build/golden/flux3-tiny tests/data/flux3-gguf

Versions: gguf-py 0.19.0 (gguf.quants.quantize / dequantize, GGUFWriter, GGUFReader), diffusers 0.42.1
(Flux3Transformer2DModel, convert_flux3_transformer_checkpoint_to_diffusers), torch 2.15 (CPU, float32),
numpy 2.4.6, safetensors (venv /work/venv-flux3).

For each golden tiny FLUX.3 transformer (base, flowmap: build/golden/flux3-tiny/V/model/transformer) this
writes, with gguf-py, three GGUF files (GGUFWriter, architecture "flux3", tensors in name order, each typed by
ComfyUI-GGUF's rules as `tpgen quantize` types them: 1-D or <= 1024 values F32, rows that are not whole blocks
F16, else the type asked for):
  Q8_0-keep.gguf   diffusers names, Q8_0                      (= tpgen quantize --type Q8_0 --names keep)
  Q8_0-bfl.gguf    BFL names (tests/tools/flux3_bfl_testdata.py's map: norm_out's halves swapped), Q8_0
                                                              (= tpgen quantize --type Q8_0, the default names)
  mixed.gguf       diffusers names; the i-th tensor in name order asks for Q4_0, Q5_1, Q8_0, F16 (i mod 4)
                                                              (= tpgen_tests flux3_gguf_write_mixed)
The files are not committed: only their sha256 (flux3-gguf.sha256); the tests make them with tpgen and
check these sums, so tpgen's bytes are gguf-py's. Then each file is read back with GGUFReader and
dequantised with gguf.quants.dequantize; the BFL file's tensors go through diffusers' own
convert_flux3_transformer_checkpoint_to_diffusers and must equal the keep file's dequantised tensors bit for
bit. Diffusers' Flux3Transformer2DModel (the golden config.json, float32) with the dequantised weights is run
on the golden transformer_cases (4 cases, 2 with reference tokens); V-T_cases.safetensors (T = Q8_0, mixed)
is transformer_cases.safetensors with each caseK.output replaced by that output (must differ from the
unquantised golden output by > 1e-4 relative: the weights were quantised).
K-quants (gguf-py 0.19.0 has no K-quant quantiser, and the tiny models' rows of 96, 80, 32, 288 values are no
whole 256-blocks): with --kquant TPGEN (the tpgen binary) the script draws the random D 256 FLUX.3 of
tests/test_flux3_gguf.c (write_random_flux3: the same LCG and float32 steps, so the same values) with numpy,
has `TPGEN quantize --type T --names keep` write it for T = Q4_K, Q5_K, Q6_K, dequantises those bytes with
gguf-py, runs diffusers on them for the golden base cases' inputs and writes kq-T_cases.safetensors (and the
files' sha256 to flux3-gguf-kq.sha256: the test writes the model again with the test binary, quantises it and
checks them):

    /work/venv-flux3/bin/python tests/tools/flux3_gguf_golden.py build/golden/flux3-tiny tests/data/flux3-gguf \
        --kquant build/tpgen
"""
import hashlib
import os
import sys

import numpy as np
import torch
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize, dequantize
from safetensors.numpy import load_file as np_load
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flux3_bfl_testdata import bfl_name  # noqa: E402  (the one Python copy of the map)

MIX = ["Q4_0", "Q5_1", "Q8_0", "F16"]


def pick(tn, x):
    qt = Q[tn]
    if x.ndim <= 1 or x.size <= 1024:
        return Q.F32
    return Q.F16 if x.shape[-1] % gguf.GGML_QUANT_SIZES[qt][0] else qt


def write(path, tensors, types):
    w = gguf.GGUFWriter(path, "flux3")
    for name in sorted(tensors):
        x = tensors[name]
        qt = pick(types(name), x)
        q = quantize(x, qt)
        if qt in (Q.F32, Q.F16):
            w.add_tensor(name, q)
        else:
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def read_dequantised(path):
    r = gguf.GGUFReader(path)
    out = {}
    for t in r.tensors:
        shape = [int(d) for d in reversed(t.shape.tolist())]   # ne fastest first -> row-major
        out[t.name] = torch.from_numpy(np.ascontiguousarray(dequantize(t.data, t.tensor_type).astype(np.float32)
                                                            .reshape(shape)))
    return out


def run_cases(m, cases):
    outs, k = {}, 0
    while f"case{k}.hidden_states" in cases:
        args = {n: cases[f"case{k}.{n}"] for n in ("hidden_states", "encoder_hidden_states", "timestep", "img_ids",
                                                    "txt_ids", "image_cond_hidden_states", "image_cond_ids",
                                                    "target_timestep") if f"case{k}.{n}" in cases}
        with torch.no_grad():
            outs[k] = m(**args, return_dict=False)[0].float()
        k += 1
    return outs


def main(src, dst):
    from diffusers import Flux3Transformer2DModel
    from diffusers.loaders.single_file_utils import convert_flux3_transformer_checkpoint_to_diffusers
    os.makedirs(dst, exist_ok=True)
    tmp = os.path.join(dst, "tmp")
    os.makedirs(tmp, exist_ok=True)
    sums = []
    for v in ("base", "flowmap"):
        tdir = os.path.join(src, v, "model", "transformer")
        ts = np_load(os.path.join(tdir, "diffusion_pytorch_model.safetensors"))
        assert all(x.dtype == np.float32 for x in ts.values())
        names = sorted(ts)
        bfl = {}
        for k, x in ts.items():
            if k == "norm_out.linear.weight":   # diffusers [scale; shift] -> BFL [shift; scale]
                h = x.shape[0] // 2
                x = np.concatenate([x[h:], x[:h]])
            bfl[bfl_name(k)] = x
        files = {"Q8_0-keep": (ts, lambda n: "Q8_0"), "Q8_0-bfl": (bfl, lambda n: "Q8_0"),
                 "mixed": (ts, lambda n: MIX[names.index(n) % 4])}
        deq = {}
        for f, (tensors, types) in files.items():
            p = os.path.join(tmp, f"{v}-{f}.gguf")
            sums.append(f"{write(p, tensors, types)}  {v}/{f}.gguf\n")
            deq[f] = read_dequantised(p)
            os.remove(p)
        conv = convert_flux3_transformer_checkpoint_to_diffusers(dict(deq["Q8_0-bfl"]))
        assert sorted(conv) == sorted(deq["Q8_0-keep"])
        for k in conv:
            assert torch.equal(conv[k], deq["Q8_0-keep"][k]), k
        cases = load_file(os.path.join(src, v, "transformer_cases.safetensors"))
        for f in ("Q8_0-keep", "mixed"):
            m = Flux3Transformer2DModel.from_pretrained(tdir, torch_dtype=torch.float32).eval()
            missing, unexpected = m.load_state_dict(deq[f], strict=True)
            outs = run_cases(m, cases)
            res = dict(cases)
            for k, o in outs.items():
                g = cases[f"case{k}.output"].float()
                d = float((o - g).norm() / g.norm())
                assert d > 1e-4, f"{v} {f} case{k}: quantised output equals the golden ({d})"
                print(f"{v} {f} case{k}: |quantised - golden| / |golden| = {d:.3e}")
                res[f"case{k}.output"] = o.contiguous()
            save_file(res, os.path.join(dst, f"{v}-{f.split('-')[0]}_cases.safetensors"))
    os.rmdir(tmp)
    open(os.path.join(dst, "flux3-gguf.sha256"), "w").write("".join(sums))
    print("".join(sums), end="")


def random_flux3():
    """write_random_flux3 of tests/test_flux3_gguf.c, value for value"""
    D, M, CT, J, CIN, HD = 256, 768, 32, 80, 32, 64
    t = [("timestep_embedder.linear_1.weight", D, CT), ("timestep_embedder.linear_2.weight", D, D)]
    for m in ("txt", "image", "image_cond"):
        t += [(f"early_stream_modulations.{m}.linear.weight", 3 * D, D),
              (f"single_stream_modulations.{m}.linear.weight", 3 * D, D)]
    t += [("context_embedder.weight", D, J), ("x_embedders.image.weight", D, CIN),
          ("x_embedders.image_cond.weight", D, CIN), ("norm_out.linear.weight", 2 * D, D), ("proj_out.weight", CIN, D)]
    for b in ("txt_mode_blocks.0", "mode_blocks.image.0", "mode_blocks.image_cond.0", "single_transformer_blocks.0"):
        t += [(f"{b}.attn.to_q.weight", D, D), (f"{b}.attn.to_k.weight", D, D), (f"{b}.attn.to_v.weight", D, D),
              (f"{b}.attn.to_out.0.weight", D, D), (f"{b}.attn.norm_q.weight", 0, HD),
              (f"{b}.attn.norm_k.weight", 0, HD), (f"{b}.ff.linear_in.weight", 2 * M, D),
              (f"{b}.ff.linear_out.weight", D, M)]
    s = np.uint64(0x243F6A8885A308D3)
    A, C = np.uint64(6364136223846793005), np.uint64(1442695040888963407)
    out = {}
    with np.errstate(over="ignore"):
        for name, r, c in t:
            nv = (r or 1) * c
            st = np.empty(nv, dtype=np.uint64)
            for j in range(nv):
                s = s * A + C
                st[j] = s
            u = (st >> np.uint64(40)).astype(np.float32)
            f = np.float32(2.0) * u / np.float32(16777216.0) - np.float32(1.0)
            scale = np.sqrt(np.float32(3.0) / np.float32(c)) if r else np.float32(0.1)
            off = np.float32(0.0) if r else np.float32(1.0)
            out[name] = (off + scale * f).astype(np.float32).reshape((r, c) if r else (c,))
    cfg = {"_class_name": "Flux3Transformer2DModel", "in_channels": CIN, "cond_in_channels": CIN, "num_layers": 1,
           "num_single_layers": 1, "attention_head_dim": HD, "num_attention_heads": D // HD, "joint_attention_dim": J,
           "timestep_channels": CT, "mlp_ratio": 3.0, "axes_dims_rope": [16, 16, 16, 16], "flow_map": False}
    return out, cfg


def kquant(src, dst, tpgen):
    import json, subprocess, tempfile
    from diffusers import Flux3Transformer2DModel
    from safetensors.numpy import save_file as np_save
    ts, cfg = random_flux3()
    cases = load_file(os.path.join(src, "base", "transformer_cases.safetensors"))
    sums = []
    with tempfile.TemporaryDirectory() as tmp:
        np_save(ts, os.path.join(tmp, "diffusion_pytorch_model.safetensors"))
        json.dump(cfg, open(os.path.join(tmp, "config.json"), "w"))
        for tn in ("Q4_K", "Q5_K", "Q6_K"):
            g = os.path.join(tmp, f"{tn}.gguf")
            subprocess.run([tpgen, "quantize", "--type", tn, "--names", "keep", tmp, g], check=True)
            sums.append(f"{hashlib.sha256(open(g, 'rb').read()).hexdigest()}  kq/{tn}.gguf\n")
            deq = read_dequantised(g)
            nk = sum(1 for t in gguf.GGUFReader(g).tensors if t.tensor_type == Q[tn])
            m = Flux3Transformer2DModel(**{k: v for k, v in cfg.items() if k != "_class_name"}).eval()
            m.load_state_dict(deq, strict=True)
            outs = run_cases(m, cases)
            full = Flux3Transformer2DModel(**{k: v for k, v in cfg.items() if k != "_class_name"}).eval()
            full.load_state_dict({k: torch.from_numpy(v) for k, v in ts.items()}, strict=True)
            fo = run_cases(full, cases)
            res = dict(cases)
            for k, o in outs.items():
                d = float((o - fo[k]).norm() / fo[k].norm())
                assert d > 1e-4, f"{tn} case{k}: equal to the unquantised model ({d})"
                print(f"{tn} ({nk} tensors) case{k}: |quantised - unquantised| / |unquantised| = {d:.3e}")
                res[f"case{k}.output"] = o.contiguous()
            os.remove(g)
            save_file(res, os.path.join(dst, f"kq-{tn}_cases.safetensors"))
    open(os.path.join(dst, "flux3-gguf-kq.sha256"), "w").write("".join(sums))
    print("".join(sums), end="")


if __name__ == "__main__":
    if "--kquant" in sys.argv:
        i = sys.argv.index("--kquant")
        kquant(sys.argv[1], sys.argv[2], sys.argv[i + 1])
        sys.exit()
    main(sys.argv[1] if len(sys.argv) > 1 else "build/golden/flux3-tiny",
         sys.argv[2] if len(sys.argv) > 2 else "tests/data/flux3-gguf")
