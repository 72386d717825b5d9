"""The other FLUX.3 LoRA spellings diffusers 0.42.1 takes, written from the golden adapter (tests/data/flux3-lora),
and (with --verify) diffusers' own verdict on each.

What Flux3LoraLoaderMixin accepts (loaders/lora_pipeline.py lora_state_dict + load_lora_weights, then
loaders/peft.py PeftAdapterMixin.load_lora_adapter with prefix "transformer"): dora_scale keys dropped; a file
with diffusion_model.* keys renamed by _convert_non_diffusers_flux3_lora_to_diffusers (BFL FLUX.3 names) to
transformer.*; every key must contain "lora"; only keys under "transformer." are kept; when the first kept key
has no "lora_A", convert_unet_state_dict_to_peft rewrites every key: ".processor." -> "." and then the first of
UNET_TO_DIFFUSERS's patterns that matches (".to_out_lora.up" -> ".to_out.0.lora_B", ".to_q_lora.down" ->
".to_q.lora_A", ... , ".lora.up" -> ".lora_B", ".lora.down" -> ".lora_A"). There is no FLUX.3 kohya converter:
lora_unet_* keys are all filtered out by the prefix, and diffusers loads nothing (a warning, the base model's
outputs).

Styles written here (python3 standard library only; the tests write them at run time):
  old        transformer.<module>.lora.down.weight / .lora.up.weight, the metadata kept (scale alpha/r = 2)
  processor  attention modules as transformer.<block>.attn.processor.to_q_lora.down.weight (to_k, to_v,
             to_out_lora), the rest .lora.down/.lora.up, metadata kept
  aitk_old   diffusion_model.<BFL FLUX.3 module>.lora.down/.lora.up.weight, no metadata (scale 1)
  kohya      lora_unet_<BFL FLUX.3 module with '_'>.lora_down/.lora_up.weight + .alpha (= rank), what a kohya
             trainer would write for FLUX.3
  dora       the file plus a PEFT DoRA magnitude vector per module (<module>.lora_magnitude_vector [out], 1.5),
             no metadata (diffusers infers use_dora from the keys)
  bias       the file plus a lora_B bias per module (<module>.lora_B.bias [out], 0.01; PEFT lora_bias), no
             metadata

    python3 tests/tools/flux3_lora_formats.py STYLE IN.safetensors OUT.safetensors
    PYTHONPATH=/work/peft-pkgs /work/venv-flux3/bin/python tests/tools/flux3_lora_formats.py --verify

--verify (from the repository root, after tests/unpack-golden.sh; torch 2.15, diffusers 0.42.1, peft 0.21.2)
writes each style of tests/data/flux3-lora/adapter.safetensors to a temporary folder, loads it with the mixin's
load_lora_weights into a fresh tiny base model and runs the 4 golden cases: old and processor must give
lora_cases' outputs (weight 1), aitk_old the same at adapter weight 2; kohya must leave the base model's outputs
unchanged (diffusers loads nothing of it); dora and bias must load and, at weight 2, differ from lora_cases (diffusers
applies the extra tensors; tpgen refuses them). Printed: the max relative difference per style.
"""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flux3_lora_bfl_names as bfl  # noqa: E402

ATTN = {".attn.to_q": ".attn.processor.to_q_lora", ".attn.to_k": ".attn.processor.to_k_lora",
        ".attn.to_v": ".attn.processor.to_v_lora", ".attn.to_out.0": ".attn.processor.to_out_lora"}


def split(key):
    for s, part in ((".lora_A.weight", "down"), (".lora_B.weight", "up")):
        if key.endswith(s):
            return key[:-len(s)], part
    raise ValueError(key)


def rename(style, key):
    m, part = split(key)
    if style == "old":
        return f"{m}.lora.{part}.weight"
    if style == "processor":
        for a, b in ATTN.items():
            if m.endswith(a):
                return f"{m[:-len(a)]}{b}.{part}.weight"
        return f"{m}.lora.{part}.weight"
    if style == "aitk_old":
        return f"{bfl.bfl_name(m + '.x')[:-2]}.lora.{part}.weight"
    if style in ("dora", "bias"):
        return key
    if style == "kohya":
        b = bfl.bfl_name(m + ".x")[len("diffusion_model."):-2]
        return f"lora_unet_{b.replace('.', '_')}.lora_{part}.weight"
    raise ValueError(style)


def write(style, src_path, dst_path):
    src = open(src_path, "rb").read()
    n = struct.unpack("<Q", src[:8])[0]
    h = json.loads(src[8:8 + n])
    meta = h.pop("__metadata__", None)
    out, data, off = {}, b"", 0
    for k, v in h.items():
        a, e = v["data_offsets"]
        d = src[8 + n + a:8 + n + e]
        out[rename(style, k)] = dict(v, data_offsets=[off, off + len(d)])
        data += d
        off += len(d)
        if style == "kohya" and k.endswith(".lora_A.weight"):   # alpha = rank: scale 1, a 0-dim F32
            r = v["shape"][0]
            out[rename(style, k)[:-len(".lora_down.weight")] + ".alpha"] = {"dtype": "F32", "shape": [],
                                                                           "data_offsets": [off, off + 4]}
            data += struct.pack("<f", float(r))
            off += 4
        if style in ("dora", "bias") and k.endswith(".lora_B.weight"):   # one [out] F32 vector per module
            o = v["shape"][0]
            name = k[:-len(".lora_B.weight")] + (".lora_magnitude_vector" if style == "dora" else ".lora_B.bias")
            out[name] = {"dtype": "F32", "shape": [o], "data_offsets": [off, off + 4 * o]}
            data += struct.pack("<%df" % o, *([1.5 if style == "dora" else 0.01] * o))
            off += 4 * o
    if meta and style in ("old", "processor"):
        out["__metadata__"] = meta
    hb = json.dumps(out).encode()
    hb += b" " * (-len(hb) % 8)
    open(dst_path, "wb").write(struct.pack("<Q", len(hb)) + hb + data)


def verify():
    import tempfile
    import torch
    from safetensors.torch import load_file
    import flux3_lora_golden as g
    cases = load_file(f"{g.BASE}/transformer_cases.safetensors")
    want = load_file(f"{g.OUT}/lora_cases.safetensors")
    base = g.run_cases(g.base_model(), cases)
    with tempfile.TemporaryDirectory() as tmp:
        for style, weight, ref in (("old", 1.0, "lora"), ("processor", 1.0, "lora"), ("aitk_old", 2.0, "lora"),
                                   ("kohya", 1.0, "base")):
            p = f"{tmp}/{style}.safetensors"
            write(style, f"{g.OUT}/adapter.safetensors", p)
            m = g.base_model()
            g.Holder(m).load_lora_weights(p, adapter_name="x")
            if ref == "lora":
                m.set_adapters(["x"], weights=[weight])
            out = g.run_cases(m, cases)
            worst = 0.0
            for k, o in out.items():
                r = want[f"case{k}.output"] if ref == "lora" else base[k]
                worst = max(worst, ((o - r).norm() / r.norm()).item())
            print(f"{style}: diffusers' outputs vs {'lora_cases' if ref == 'lora' else 'the base model'}: max rel {worst:.3g}")
            assert worst < 1e-6, style
        for style in ("dora", "bias"):   # diffusers takes them (and they change the outputs); tpgen refuses them
            p = f"{tmp}/{style}.safetensors"
            write(style, f"{g.OUT}/adapter.safetensors", p)
            m = g.base_model()
            g.Holder(m).load_lora_weights(p, adapter_name="x")
            m.set_adapters(["x"], weights=[2.0])   # = lora_cases but for the DoRA vector / the bias
            out = g.run_cases(m, cases)
            d = min(((out[k] - want[f"case{k}.output"]).norm() / want[f"case{k}.output"].norm()).item() for k in out)
            print(f"{style}: diffusers loads it; at weight 2 its outputs differ from lora_cases by at least {d:.3g}")
            assert d > 1e-3, style


if __name__ == "__main__":
    if sys.argv[1:] == ["--verify"]:
        verify()
    else:
        write(sys.argv[1], sys.argv[2], sys.argv[3])
