#!/usr/bin/env python3
"""The UNet training step of diffusers' examples/text_to_image/train_text_to_image.py at the shapes of `sdtrain
benchmark --task unet --preset sd15`: the SD-1.5 UNet with random weights, float32 (the script's bf16 mode fails on
this PyTorch: its CPU autocast meets float32 weights), AdamW with the script's defaults (lr 1e-4, betas 0.9/0.999,
weight decay 1e-2, eps 1e-8), DDPM noise (SD-1.5's scheduler config), epsilon target, MSE loss, clip_grad_norm_ to
1.0 (--max_grad_norm's default), zero_grad. Prints one JSON line: seconds per step (median of the steps after
--warmup), and the process's peak RSS.

Like `sdtrain benchmark --task unet` it measures the UNet alone: the latents and the text embeddings are random
tensors, so neither the VAE nor CLIP runs. (The script encodes every batch with both, without gradients: at 256² the
VAE encoder alone is ~0.27 TFLOP, half again this step's 0.54.)

Needs Debian's python3-torch (the same PyTorch 1.13.1 source as libtorch-dev), diffusers 0.24.0's and
huggingface_hub 0.19.4's sources (git tags v0.24.0 and v0.19.4, their src/ folders) and bench/reference/stand-ins:

    PYTHONPATH=$DIFFUSERS/src:$HUB/src:bench/reference/stand-ins /usr/bin/python3 \
        bench/reference/diffusers_unet_train_step.py --resolution 256 --steps 4 --warmup 2 --threads 2
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler, UNet2DConditionModel

from process_memory import peak_rss_gib  # beside this script


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resolution", type=int, default=256)
    parser.add_argument("--train_batch_size", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    # runwayml/stable-diffusion-v1-5 unet/config.json and scheduler/scheduler_config.json.
    unet = UNet2DConditionModel(sample_size=64, cross_attention_dim=768, attention_head_dim=8)
    unet.train()
    noise_scheduler = DDPMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                    num_train_timesteps=1000)
    optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-4, betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8)

    side, batch = args.resolution // 8, args.train_batch_size
    step_seconds = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        latents = torch.randn(batch, 4, side, side)
        noise = torch.randn_like(latents)
        timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (batch,)).long()
        noisy_latents = noise_scheduler.add_noise(latents, noise, timesteps)
        encoder_hidden_states = torch.randn(batch, 77, 768)
        model_pred = unet(noisy_latents, timesteps, encoder_hidden_states).sample
        loss = F.mse_loss(model_pred.float(), noise.float(), reduction="mean")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if step >= args.warmup:
            step_seconds.append(time.perf_counter() - start)

    print(json.dumps({
        "trainer": "diffusers train_text_to_image.py's step",
        "dtype": "float32",
        "resolution": args.resolution,
        "train_batch_size": batch,
        "threads": args.threads,
        "s_per_step": statistics.median(step_seconds),
        "step_seconds": step_seconds,
        "peak_rss_gib": peak_rss_gib(),
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
