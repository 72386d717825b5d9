"""Write a copy of a diffusers-format FLUX.3 LoRA file with BFL names, as an ai-toolkit file (standard library only).

Keys transformer.<diffusers module>.lora_A/B.weight become diffusion_model.<BFL module>.lora_A/B.weight, the
inverse of diffusers 0.42.1's _convert_non_diffusers_flux3_lora_to_diffusers (tests/tools/flux3_lora_golden.py
checks that diffusers' converter maps every renamed key back and that diffusers' forward with the renamed file is
the same). The metadata is dropped (ai-toolkit files carry none: scale 1).
    python3 tests/tools/flux3_lora_bfl_names.py IN.safetensors OUT.safetensors
"""
import json
import struct
import sys

REPLACE = [(".attn.to_q.", ".q_proj."), (".attn.to_k.", ".k_proj."), (".attn.to_v.", ".v_proj."),
           (".attn.to_out.0.", ".attn_out."), (".ff.linear_in.", ".mlp_in."), (".ff.linear_out.", ".mlp_out.")]


def bfl_name(key):
    assert key.startswith("transformer."), key
    k = key[len("transformer."):]
    if k.startswith("mode_blocks."):
        k = "content_" + k
    if k.startswith("single_transformer_blocks."):
        k = "single_blocks." + k[len("single_transformer_blocks."):]
    for a, b in REPLACE:
        k = k.replace(a, b)
    return "diffusion_model." + k


def main(src_path, dst_path):
    src = open(src_path, "rb").read()
    n = struct.unpack("<Q", src[:8])[0]
    h = json.loads(src[8:8 + n])
    h.pop("__metadata__", None)
    out = {bfl_name(k): v for k, v in h.items()}
    hb = json.dumps(out).encode()
    hb += b" " * (-len(hb) % 8)
    open(dst_path, "wb").write(struct.pack("<Q", len(hb)) + hb + src[8 + n:])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
