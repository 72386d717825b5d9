"""Golden data of FLUX.3's reference preprocessing (tests/data/flux3-refs/), made by diffusers' REAL
Flux3ImageProcessor and modular pipelines.

What diffusers 0.42.1 does to references (modular_pipelines/flux3/encoders.py Flux3ProcessImagesInputStep and
image_processor.py Flux3ImageProcessor): ONE reference is preprocessed with resize_mode="fill":
_resize_if_canvas_exceeds_area (scale = min(1, sqrt(4 MP / (w h)), 4096 / max(w, h)); sides round(side * scale);
backed off by 0.995 until the canvas, each side rounded up to 16 and clamped to [64, 4096], is at most 4 MP; the
resize is VaeImageProcessor.resize, PIL LANCZOS), then reflect-padded to the canvas; SEVERAL are each
_resize_if_exceeds_area(1 MP) (int() sizes, PIL LANCZOS) and center-cropped to sides floored to 16.

Outputs (all small; the images themselves are written by tests/tools/flux3_refs_images.py at test time):
- refs.json: the sha256 of each synthetic image's RGB bytes; `sizes`: for 40 image sizes (tricky ones near the
  4 MP cap and the 4096 side included), the size _resize_if_canvas_exceeds_area gives and the canvas;
  `pixels`: per image, the fill (one reference) and crop (several) preprocessing: size, reference_crop box and
  the sha256 of the preprocessed canvas as uint8 (round((x + 1) * 127.5), exact for 2 u / 255 - 1 in float32);
  `cases`: the pipeline runs below.
- long.safetensors: Flux3DistilledModularPipeline (flow-map, the golden tiny model) with the 4500x40 reference
  (max-side path: resized to 4096x36, padded to 4096x64), seed 11, 2 steps, default size (the canvas, the image
  cropped back to 4096x36): prompt_embeds, image_cond [1, 1024, 32], image_cond_ids, latents_final, and in
  refs.json the sha256 and shape of the output image (uint8).
- multi.safetensors: Flux3ModularPipeline (base, CFG 3.5) with two references 40x200 and 70x56 ("crop", none
  of FLUX.2's checks: 40 < 64 px is fine), 64x48, seed 3, 2 steps: prompt_embeds, negative_prompt_embeds,
  image_cond, image_cond_ids, latents_final, image_u8 [48, 64, 3].

Commands (from the repository root, after tests/unpack-golden.sh):

    /work/venv-flux3/bin/python tests/tools/flux3_refs_golden.py build/golden tests/data/flux3-refs

Versions: python 3.11, torch 2.15 (CPU), diffusers 0.42.1, numpy 2.4.6, Pillow (the venv's), safetensors.
"""
import hashlib
import json
import os
import sys
import tempfile

import numpy as np
import PIL
import PIL.Image
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flux3_refs_images as imgs  # noqa: E402

from diffusers import AutoencoderKLFlux2, Flux3Transformer2DModel  # noqa: E402
from diffusers.modular_pipelines import Flux3AutoBlocks, Flux3DistilledAutoBlocks  # noqa: E402
from diffusers.modular_pipelines.flux3.image_processor import Flux3ImageProcessor  # noqa: E402

golden, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
torch.set_grad_enabled(False)
tmp = tempfile.mkdtemp()
files, digests = {}, {}
for name in imgs.IMAGES:
    files[name], digests[name] = imgs.write(tmp, name)
listing = {"diffusers": "0.42.1", "pillow": PIL.__version__, "images": {}, "sizes": [], "pixels": {}, "cases": {}}
for name, (w, h) in imgs.IMAGES.items():
    listing["images"][name] = {"width": w, "height": h, "sha256": digests[name]}

proc = Flux3ImageProcessor()


class Fake:  # only .size is read when the image is not resized
    def __init__(self, w, h):
        self.size = (w, h)
        self.width, self.height = w, h


sizer = Flux3ImageProcessor()
sizer.resize = lambda image, height, width: Fake(width, height)
SIZES = [(70, 56), (2048, 2048), (2064, 2064), (2049, 2047), (2100, 2050), (3000, 2000), (4096, 1024), (4097, 1024),
         (4096, 4096), (5000, 5000), (8192, 64), (4500, 40), (6000, 50), (10000, 10), (5, 5000), (16, 16), (1, 1),
         (2047, 2049), (1999, 2099), (2080, 2016), (2081, 2016), (2024, 2072), (3333, 1259), (1259, 3333),
         (4095, 1025), (2896, 1449), (2897, 1449), (8000, 523), (523, 8000), (4100, 4100), (2500, 1700),
         (7000, 600), (1023, 4099), (3500, 1200), (2300, 1850), (2200, 1910), (2010, 2090), (2100, 2000),
         (6001, 700), (12000, 1400)]
for w, h in SIZES:
    r = sizer._resize_if_canvas_exceeds_area(Fake(w, h))
    rw, rh = r.size
    ch, cw = sizer._get_canvas_height_width(rh, rw)
    listing["sizes"].append([w, h, rw, rh, cw, ch])


def u8_sha(t):
    a = torch.round((t[0].permute(1, 2, 0).double() + 1) * 127.5).clamp(0, 255).to(torch.uint8).numpy()
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


for name in imgs.IMAGES:
    im = PIL.Image.open(files[name])
    rec = {}
    for mode in ("fill", "crop"):
        t, kw = proc.preprocess(im, resize_mode=mode)
        u = torch.round((t.double() + 1) * 127.5)
        assert torch.equal(2.0 * (u.float() / 255.0) - 1.0, t), "preprocessed pixels are not 2 (u / 255) - 1"
        rec[mode] = {"width": t.shape[3], "height": t.shape[2], "reference_crop": kw["reference_crop"],
                     "sha256": u8_sha(t)}
    listing["pixels"][name] = rec
    print(name, rec)

vae = AutoencoderKLFlux2.from_pretrained(os.path.join(golden, "vae-tiny/model/vae")).float().eval()
models = {k: Flux3Transformer2DModel.from_pretrained(os.path.join(golden, f"flux3-tiny/{k}/model/transformer")).float().eval()
          for k in ("base", "flowmap")}


def make_pipe(kind):
    blocks = Flux3AutoBlocks() if kind == "base" else Flux3DistilledAutoBlocks()
    for n in ("prompt_upsampler", "text_encoder"):
        if n in blocks.sub_blocks:
            blocks.sub_blocks.pop(n)
    pipe = blocks.init_pipeline()
    pipe.update_components(transformer=models[kind], vae=vae)
    return pipe


CASES = [  # name, model, seed, steps, size (None: from the reference), references, L
    ("long", "flowmap", 11, 2, None, ["long"], 6),
    ("multi", "base", 3, 2, (64, 48), ["tall", "small"], 6),
]
for name, kind, seed, steps, size, refs, L in CASES:
    pipe = make_pipe(kind)
    calls, steps_rec = [], []

    def hook(mod, args, kwargs, output):
        calls.append({k: (v.clone() if torch.is_tensor(v) else v) for k, v in kwargs.items()})

    hd = models[kind].register_forward_hook(hook, with_kwargs=True)
    orig_step = pipe.scheduler.step

    def step(model_output, t, sample, **kw):
        r = orig_step(model_output, t, sample, **kw)
        steps_rec.append(r[0].clone())
        return r

    pipe.scheduler.step = step
    g = torch.Generator().manual_seed(2000 + seed)
    pe = torch.randn(1, L, 80, generator=g)
    rec = {"prompt_embeds": pe}
    kw = dict(prompt_embeds=pe, generator=torch.Generator().manual_seed(seed), num_inference_steps=steps,
              output="images", output_type="np")
    if kind == "base":
        rec["negative_prompt_embeds"] = kw["negative_prompt_embeds"] = torch.randn(1, L, 80, generator=g)
    if size:
        kw["width"], kw["height"] = size
    ims = [PIL.Image.open(files[r]) for r in refs]
    kw["image"] = ims[0] if len(ims) == 1 else ims
    img = pipe(**kw)
    hd.remove()
    c0 = calls[0]
    rec["image_cond"] = c0["image_cond_hidden_states"]
    rec["image_cond_ids"] = c0["image_cond_ids"].float()
    rec["latents_final"] = steps_rec[-1]
    u8 = (img[0] * 255).round().astype(np.uint8)
    if u8.size <= 65536:   # multi's 64x48 image ('np' then (x*255).round() as numpy_to_pil does); long's by sha256 only
        rec["image_u8"] = torch.from_numpy(u8)
    save_file({k: v.contiguous() for k, v in rec.items()}, os.path.join(out, f"{name}.safetensors"))
    listing["cases"][name] = {"model": kind, "seed": seed, "steps": steps, "size": size, "references": refs,
                              "text_tokens": L, "forwards": len(calls), "image_shape": list(u8.shape),
                              "image_sha256": hashlib.sha256(u8.tobytes()).hexdigest(),
                              "latents_shape": list(rec["latents_final"].shape),
                              "image_cond_shape": list(rec["image_cond"].shape)}
    print(name, listing["cases"][name])
json.dump(listing, open(os.path.join(out, "refs.json"), "w"), indent=1)
