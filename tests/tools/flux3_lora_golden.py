"""Golden data of LoRA adapters on FLUX.3 (tests/data/flux3-lora/), made by diffusers + PEFT.

A random rank-4 PEFT LoRA (lora_alpha 8, so scale alpha/r = 2) on the golden tiny base transformer
(build/golden/flux3-tiny/base/model/transformer, diffusers 0.42.1 Flux3Transformer2DModel, float32 CPU),
targeting every Linear kind: attn.to_q / to_k / to_v / to_out.0 and ff.linear_in / ff.linear_out of
mode block 0 of each mode (mode_blocks.image.0, mode_blocks.image_cond.0, txt_mode_blocks.0) and of
single block 1, plus the embedders x_embedders.image, x_embedders.image_cond, context_embedder,
timestep_embedder.linear_1, a modulation (single_stream_modulations.image.linear), norm_out.linear and
proj_out (block 0 / single block 1 only, to keep the file small). lora_A and lora_B are random normals
(lora_B is zero after PEFT's init), times 0.2 / 0.1.

The adapter is saved with diffusers' own Flux3LoraLoaderMixin.save_lora_weights (keys
transformer.<module>.lora_A/B.weight, the LoraConfig in the lora_adapter_metadata metadata) as
adapter.safetensors, then loaded by the mixin's own load_lora_weights into a FRESH copy of the base
transformer, and the forward run on the 4 golden transformer_cases (cases 1 and 2 with reference tokens).
lora_cases.safetensors holds the same inputs as build/golden/flux3-tiny/base/transformer_cases.safetensors
with case<k>.output replaced by the adapted model's output. Checks made here: the adapted outputs differ from
the base outputs (so the adapter matters); the same adapter file without metadata loaded by diffusers at
adapter weight 2 (set_adapters) gives the same outputs (no metadata: scale 1, as tpgen reads it); so does the
ai-toolkit copy with BFL FLUX.3 names that tests/tools/flux3_lora_bfl_names.py writes (diffusion_model.*,
content_mode_blocks / single_blocks / q_proj / attn_out / mlp_in ...), whose keys diffusers' own converter
(_convert_non_diffusers_flux3_lora_to_diffusers) maps back to the original ones.

Run (from the repository root, after tests/unpack-golden.sh):
    /work/venv-flux3/bin/pip install --target /work/peft-pkgs --no-deps peft==0.21.2
    PYTHONPATH=/work/peft-pkgs /work/venv-flux3/bin/python tests/tools/flux3_lora_golden.py
Versions: torch 2.15 (CPU), diffusers 0.42.1, peft 0.21.2, safetensors, numpy (venv /work/venv-flux3).
"""
import os
import sys
import tempfile

sys.path.insert(0, "/work/peft-pkgs")
import torch  # noqa: E402
from diffusers import Flux3Transformer2DModel  # noqa: E402
from diffusers.loaders.lora_pipeline import Flux3LoraLoaderMixin  # noqa: E402
from peft import LoraConfig, get_peft_model_state_dict  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

BASE = "build/golden/flux3-tiny/base"
OUT = "tests/data/flux3-lora"
KINDS = r"(attn\.(to_q|to_k|to_v|to_out\.0)|ff\.(linear_in|linear_out))"
TARGET = (r"^((mode_blocks\.(image|image_cond)\.0|txt_mode_blocks\.0|single_transformer_blocks\.1)\." + KINDS + r"|"
          r"x_embedders\.image|x_embedders\.image_cond|context_embedder|timestep_embedder\.linear_1|"
          r"single_stream_modulations\.image\.linear|norm_out\.linear|proj_out)$")


class Holder(Flux3LoraLoaderMixin):
    """The mixin on an object with a .transformer, as a pipeline has."""

    def __init__(self, transformer):
        self.transformer = transformer
        self.hf_device_map = None
        self.components = {"transformer": transformer}


def base_model():
    m = Flux3Transformer2DModel.from_pretrained(f"{BASE}/model/transformer", torch_dtype=torch.float32)
    return m.eval()


def run_cases(m, cases):
    outs = {}
    k = 0
    while f"case{k}.hidden_states" in cases:
        args = {n: cases[f"case{k}.{n}"] for n in ("hidden_states", "encoder_hidden_states", "timestep", "img_ids",
                                                    "txt_ids", "image_cond_hidden_states", "image_cond_ids")
                if f"case{k}.{n}" in cases}
        with torch.no_grad():
            outs[k] = m(**args, return_dict=False)[0].float()
        k += 1
    return outs


def main():
    torch.manual_seed(20261202)
    os.makedirs(OUT, exist_ok=True)
    cases = load_file(f"{BASE}/transformer_cases.safetensors")
    m = base_model()
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=TARGET, init_lora_weights=True)
    m.add_adapter(cfg, adapter_name="default")
    n_mod = 0
    for name, mod in m.named_modules():
        if hasattr(mod, "lora_A") and "default" in mod.lora_A:
            with torch.no_grad():
                mod.lora_A["default"].weight.copy_(torch.randn_like(mod.lora_A["default"].weight) * 0.2)
                mod.lora_B["default"].weight.copy_(torch.randn_like(mod.lora_B["default"].weight) * 0.1)
            n_mod += 1
    assert n_mod == 4 * 6 + 7, n_mod
    layers = get_peft_model_state_dict(m, adapter_name="default")
    Flux3LoraLoaderMixin.save_lora_weights(OUT, transformer_lora_layers=layers, weight_name="adapter.safetensors",
                                           transformer_lora_adapter_metadata=cfg.to_dict())
    path = f"{OUT}/adapter.safetensors"
    with safe_open(path, "pt") as f:
        assert "lora_adapter_metadata" in (f.metadata() or {}), "save_lora_weights wrote no metadata"
        keys = list(f.keys())
    assert all(k.startswith("transformer.") for k in keys) and len(keys) == 2 * n_mod

    # diffusers' own loader into a fresh base model
    fresh = base_model()
    base_out = run_cases(fresh, cases)
    h = Holder(fresh)
    h.load_lora_weights(path, adapter_name="a")
    lora_out = run_cases(fresh, cases)
    for k in base_out:
        d = (lora_out[k] - base_out[k]).norm() / base_out[k].norm()
        assert d > 1e-2, f"case{k}: the adapter changes the output by only {d}"
        print(f"case{k}: |lora - base| / |base| = {d:.3f}")

    # no metadata: diffusers takes alpha = r (scale 1); at adapter weight 2 it equals the file above
    with tempfile.TemporaryDirectory() as tmp:
        bare = f"{tmp}/bare.safetensors"
        save_file(load_file(path), bare)
        m2 = base_model()
        h2 = Holder(m2)
        h2.load_lora_weights(bare, adapter_name="b")
        m2.set_adapters(["b"], weights=[2.0])
        out2 = run_cases(m2, cases)
        for k in out2:
            d = ((out2[k] - lora_out[k]).norm() / lora_out[k].norm()).item()
            assert d < 1e-6, f"case{k}: no-metadata adapter at weight 2 differs by {d}"

    # ai-toolkit: the same tensors under BFL names (tests/tools/flux3_lora_bfl_names.py, no metadata: scale 1);
    # diffusers' converter maps every key back, and its forward at weight 2 is the same
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import flux3_lora_bfl_names as bfl
    from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_flux3_lora_to_diffusers as conv
    orig = load_file(path)
    back = conv({bfl.bfl_name(k): v for k, v in orig.items()})
    assert sorted(back) == sorted(orig), "the BFL renaming is not the inverse of diffusers' converter"
    with tempfile.TemporaryDirectory() as tmp:
        aitk = f"{tmp}/aitk.safetensors"
        bfl.main(path, aitk)
        with safe_open(aitk, "pt") as f:
            assert all(k.startswith("diffusion_model.") for k in f.keys())
        m3 = base_model()
        Holder(m3).load_lora_weights(aitk, adapter_name="c")
        m3.set_adapters(["c"], weights=[2.0])
        out3 = run_cases(m3, cases)
        for k in out3:
            d = ((out3[k] - lora_out[k]).norm() / lora_out[k].norm()).item()
            assert d < 1e-6, f"case{k}: the ai-toolkit copy at weight 2 differs by {d}"

    res = {}
    for name, t in cases.items():
        res[name] = t.contiguous()
    for k, o in lora_out.items():
        assert res[f"case{k}.output"].shape == o.shape
        res[f"case{k}.output"] = o.contiguous()
    save_file(res, f"{OUT}/lora_cases.safetensors")
    print(f"{n_mod} modules; wrote {path} and {OUT}/lora_cases.safetensors")


if __name__ == "__main__":
    main()
