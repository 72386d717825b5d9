"""Golden data of the FLUX.3 pipeline (tests/data/flux3-pipe/), made by diffusers' REAL modular pipelines.

Runs diffusers 0.42.1's Flux3ModularPipeline (Flux3AutoBlocks: classifier-free guidance, guider default 3.5) on
the golden tiny base transformer and Flux3DistilledModularPipeline (Flux3DistilledAutoBlocks: flow-map, the
step's target timestep passed to the transformer) on the tiny flow-map transformer, both with the golden tiny
VAE (AutoencoderKLFlux2, 8 latent channels = 32 after the 2x2 patchify = the transformers' in_channels). The
prompt upsampler and text encoder steps are popped: the prompt embeddings are random [1, L, 80] tensors passed
in (prompt_embeds, negative_prompt_embeds) and saved. Everything in float32 on the CPU.

Per case, <case>.safetensors holds: prompt_embeds (and negative_prompt_embeds for CFG), sigmas [steps+1] and
timesteps [steps] of the scheduler, noise (torch.randn([1, 32, h, w]) float32 of the seeded generator, drawn
independently here and checked against the pipeline's packed latents), latents0 [1, N, 32] (what the
transformer received at step 0), img_ids / txt_ids (/ image_cond_ids, image_cond [1, R, 32] for references,
float32 as the pipeline makes them), noise_pred0 (after CFG, what the scheduler got at step 0),
cond0 / uncond0 (the two passes at step 0, CFG only), target0 (flow-map: target_timestep of step 0),
latents_step<i> (after step i), latents_final [1, N, 32], image_f32 [H, W, 3] in [0, 1] and image_u8 (the
pipeline's output, for flowmap_pad cropped back from the 80x64 canvas to the 70x56 reference, 'np' then (x*255).round() as numpy_to_pil does). cases.json lists the cases with their
seed, steps, guidance and size; ref.png (64x64) and ref_pad.png (70x56) are the reference images (made from numpy); base/flowmap
modular_model_index.json are what save_pretrained writes for the two pipelines.

Commands (from the repository root, after tests/unpack-golden.sh):

    /work/venv-flux3/bin/python tests/tools/flux3_pipe_golden.py build/golden tests/data/flux3-pipe

Versions: python 3.11, torch 2.15 (CPU), diffusers 0.42.1, numpy 2.4.6, safetensors, Pillow.
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import PIL.Image
import torch
from safetensors.torch import save_file

from diffusers import AutoencoderKLFlux2, Flux3Transformer2DModel
from diffusers.modular_pipelines import Flux3AutoBlocks, Flux3DistilledAutoBlocks

golden, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
torch.set_grad_enabled(False)

# a smooth 64x64 RGB reference (no file from elsewhere)
yy, xx = np.mgrid[0:64, 0:64].astype(np.float64)
ref = np.stack([127 + 120 * np.sin(xx / 9.0), 127 + 120 * np.cos(yy / 7.0), 127 + 100 * np.sin((xx + yy) / 13.0)], -1)
ref_path = os.path.join(out, "ref.png")
PIL.Image.fromarray(np.clip(np.round(ref), 0, 255).astype(np.uint8)).save(ref_path)
# a 70x56 one: the single-reference "fill" mode reflect-pads it to its 80x64 canvas and crops the output back
yy, xx = np.mgrid[0:56, 0:70].astype(np.float64)
refp = np.stack([127 + 120 * np.sin(xx / 5.0 + yy / 11.0), 127 + 120 * np.cos(yy / 4.0), 127 + 100 * np.sin(xx / 7.0)], -1)
refp_path = os.path.join(out, "ref_pad.png")
PIL.Image.fromarray(np.clip(np.round(refp), 0, 255).astype(np.uint8)).save(refp_path)

vae = AutoencoderKLFlux2.from_pretrained(os.path.join(golden, "vae-tiny/model/vae")).float().eval()
models = {k: Flux3Transformer2DModel.from_pretrained(os.path.join(golden, f"flux3-tiny/{k}/model/transformer")).float().eval()
          for k in ("base", "flowmap")}


def make_pipe(kind):
    blocks = Flux3AutoBlocks() if kind == "base" else Flux3DistilledAutoBlocks()
    for name in ("prompt_upsampler", "text_encoder"):
        if name in blocks.sub_blocks:
            blocks.sub_blocks.pop(name)
    pipe = blocks.init_pipeline()
    pipe.update_components(transformer=models[kind], vae=vae)
    return pipe


for kind in ("base", "flowmap"):
    pipe = make_pipe(kind)
    d = tempfile.mkdtemp()
    pipe.save_pretrained(d, overwrite_modular_index=True)
    idx = json.load(open(os.path.join(d, "modular_model_index.json")))
    for comp in idx.values():
        if isinstance(comp, list) and len(comp) == 3 and isinstance(comp[2], dict):
            comp[2]["pretrained_model_name_or_path"] = "."
    json.dump(idx, open(os.path.join(out, f"{kind}_modular_model_index.json"), "w"), indent=2)
    shutil.rmtree(d)

CASES = [
    # name, model, seed, steps, width, height (None: from the reference), reference, L
    ("base_t2i", "base", 42, 3, 64, 48, False, 8),
    ("base_ref", "base", 7, 2, None, None, True, 6),
    ("flowmap_t2i", "flowmap", 123, 3, 64, 48, False, 8),
    ("flowmap_ref", "flowmap", 5, 2, None, None, True, 6),
    ("flowmap_pad", "flowmap", 9, 2, None, None, "pad", 6),
]
listing = []
for name, kind, seed, steps, width, height, use_ref, L in CASES:
    pipe = make_pipe(kind)
    rec = {}
    calls = []

    def hook(mod, args, kwargs, output):
        calls.append({k: (v.clone() if torch.is_tensor(v) else v) for k, v in kwargs.items()} | {"out": output[0].clone()})

    h = models[kind].register_forward_hook(hook, with_kwargs=True)
    sched = pipe.scheduler
    orig_step = sched.step
    steps_rec = []

    def step(model_output, t, sample, **kw):
        r = orig_step(model_output, t, sample, **kw)
        steps_rec.append((model_output.clone(), r[0].clone()))
        return r

    sched.step = step
    g = torch.Generator().manual_seed(1000 + seed)
    pe = torch.randn(1, L, 80, generator=g)
    kw = dict(prompt_embeds=pe, generator=torch.Generator().manual_seed(seed), num_inference_steps=steps,
              output="images", output_type="np")
    rec["prompt_embeds"] = pe
    if kind == "base":
        ne = torch.randn(1, L, 80, generator=g)
        kw["negative_prompt_embeds"] = ne
        rec["negative_prompt_embeds"] = ne
    if width:
        kw["width"], kw["height"] = width, height
    if use_ref:
        kw["image"] = PIL.Image.open(refp_path if use_ref == "pad" else ref_path).convert("RGB")
    img = pipe(**kw)
    h.remove()
    H, W = img.shape[1:3]
    if use_ref == "pad":   # the generation ran on the canvas; the image was cropped back to the reference
        H, W = 64, 80
    rec["sigmas"] = sched.sigmas.clone().float()
    rec["timesteps"] = sched.timesteps.clone().float()
    hl, wl = H // 16, W // 16
    noise = torch.randn((1, 32, hl, wl), generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    rec["noise"] = noise
    c0 = calls[0]
    packed = noise.flatten(2).transpose(1, 2)
    assert torch.equal(c0["hidden_states"], packed), "pipeline noise differs from torch.randn f32"
    rec["latents0"] = c0["hidden_states"]
    rec["img_ids"] = c0["img_ids"].float()
    rec["txt_ids"] = c0["txt_ids"].float()
    if use_ref:
        rec["image_cond"] = c0["image_cond_hidden_states"]
        rec["image_cond_ids"] = c0["image_cond_ids"].float()
    if kind == "base":
        # the guider runs cond and uncond; tell them apart by the embeddings they got
        for c in calls[:2]:
            key = "cond0" if torch.equal(c["encoder_hidden_states"], pe) else "uncond0"
            rec[key] = c["out"]
        assert "cond0" in rec and "uncond0" in rec
    else:
        rec["target0"] = c0["target_timestep"].float()
    rec["timestep0"] = c0["timestep"].float()
    rec["noise_pred0"] = steps_rec[0][0]
    for i, (_, x) in enumerate(steps_rec):
        rec[f"latents_step{i}"] = x
    rec["latents_final"] = steps_rec[-1][1]
    rec["image_f32"] = torch.from_numpy(np.ascontiguousarray(img[0])).float()
    rec["image_u8"] = torch.from_numpy((img[0] * 255).round().astype(np.uint8))
    save_file({k: v.contiguous() for k, v in rec.items()}, os.path.join(out, f"{name}.safetensors"))
    listing.append({"name": name, "model": kind, "seed": seed, "steps": steps, "width": W, "height": H,
                    "size_given": bool(width), "reference": ("ref_pad.png" if use_ref == "pad" else "ref.png") if use_ref else None,
                    "image_size": list(img.shape[1:3]), "text_tokens": L,
                    "guidance": 3.5 if kind == "base" else None, "forwards": len(calls)})
    print(name, W, H, "forwards", len(calls), "timesteps", rec["timesteps"].tolist())
json.dump({"diffusers": "0.42.1", "cases": listing}, open(os.path.join(out, "cases.json"), "w"), indent=2)
