#!/usr/bin/env python3
"""The torch side of the VAE comparison with `tpgen bench vae` (not part of the test suite).

diffusers' AutoencoderKLFlux2 with its default config (the FLUX.2 shapes: block_out_channels
[128,256,512,512], 32 latent channels, 2 layers per block, 32 groups, mid attention), random
weights, on the CPU with the same thread count as tpgen. Decode: latents [1, 32, S/8, S/8] ->
image [1, 3, S, S] (what `tpgen bench vae` times, less the unpack/BatchNorm/unpatchify tail, a
few ms); encode (--encoder): image [1, 3, S, S] -> the latent mean, as editing encodes a
reference image. Prints one line per (size, precision) with the median and best of --repeat runs
and the median CPU seconds of the process (all threads).

Set up once, outside the repository (several GB: the PyPI wheel brings CUDA libraries):
    /usr/bin/python3 -m venv /work/venv-torch && /work/venv-torch/bin/pip install torch diffusers
Run (scripts/bench-vae.sh runs this and tpgen side by side):
    OMP_NUM_THREADS=2 /work/venv-torch/bin/python scripts/bench-vae-torch.py --sizes 512 --precision f32,bf16
"""
import argparse
import statistics
import time

import torch
from diffusers import AutoencoderKLFlux2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="512")
    ap.add_argument("--precision", default="f32,bf16")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--encoder", action="store_true")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs first (oneDNN builds its kernels on the first call)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    what = "encoder" if a.encoder else "decoder"
    print(f"# torch {torch.__version__} AutoencoderKLFlux2 {what}, random weights, CPU, "
          f"{torch.get_num_threads()} threads, {a.warmup} untimed warm-up run(s), median and best of {a.repeat}")
    print(f"{'size':>6}  {'prec':<5} {'median_s':>9} {'best_s':>9} {'cpu_s':>8}")
    for size in [int(s) for s in a.sizes.split(",")]:
        for prec in a.precision.split(","):
            dt = {"f32": torch.float32, "bf16": torch.bfloat16}[prec]
            vae = AutoencoderKLFlux2().to(dt).eval()
            if a.encoder:
                x = torch.rand(1, 3, size, size, dtype=dt) * 2 - 1
                run = lambda: vae.encode(x).latent_dist.mode()
            else:
                x = torch.randn(1, vae.config.latent_channels, size // 8, size // 8, dtype=dt)
                run = lambda: vae.decode(x).sample
            times, cpus = [], []
            with torch.inference_mode():
                for _ in range(a.warmup):
                    run()
                for _ in range(a.repeat):
                    t0, c0 = time.perf_counter(), time.process_time()  # process_time: CPU seconds, all threads
                    run()
                    times.append(time.perf_counter() - t0)
                    cpus.append(time.process_time() - c0)
            print(f"{size:>6}  {prec:<5} {statistics.median(times):9.2f} {min(times):9.2f} "
                  f"{statistics.median(cpus):8.2f}", flush=True)
            del vae


if __name__ == "__main__":
    main()
