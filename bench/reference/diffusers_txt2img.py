#!/usr/bin/env python3
"""diffusers' StableDiffusionPipeline at the shapes of `sdtrain benchmark --task generate --preset sd15`: the
SD-1.5 architecture with random weights built in memory, PNDM (runwayml/stable-diffusion-v1-5's scheduler config),
guidance 7.5 (the UNet runs on a batch of 2), one image. Prints one JSON line: seconds per denoising step (median of
the steps after the first, timed between diffusers' step-end callbacks), the VAE decode, and the peak RSS while
denoising (from the pipeline call to the last step, as `sdtrain benchmark` measures it) and to the end of the decode.

The prompt embeddings are random [1, 77, 768] tensors passed as prompt_embeds, so no CLIP tokenizer or text
encoder runs; sdtrain's text encoder runs once per image either way.

Needs Debian's python3-torch (the same PyTorch 1.13.1 source as libtorch-dev), diffusers 0.24.0's and
huggingface_hub 0.19.4's sources (git tags v0.24.0 and v0.19.4, their src/ folders) and bench/reference/stand-ins:
empty `safetensors` and `transformers` packages, which diffusers imports but this script never uses.

    PYTHONPATH=$DIFFUSERS/src:$HUB/src:bench/reference/stand-ins /usr/bin/python3 \
        bench/reference/diffusers_txt2img.py --dtype bf16 --resolution 512 --steps 5 --threads 2
"""
import argparse
import gc
import json
import statistics
import time

import torch
from diffusers import AutoencoderKL, PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel

from process_memory import reset_peak_rss, peak_rss_gib  # beside this script


def sd15_pipeline(dtype):
    # runwayml/stable-diffusion-v1-5 unet/config.json and vae/config.json; the rest are the classes' defaults.
    unet = UNet2DConditionModel(sample_size=64, cross_attention_dim=768, attention_head_dim=8)
    vae = AutoencoderKL(
        block_out_channels=(128, 256, 512, 512),
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=2,
        latent_channels=4,
        sample_size=512,
    )
    scheduler = PNDMScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000,
        set_alpha_to_one=False, skip_prk_steps=True, steps_offset=1)
    pipe = StableDiffusionPipeline(vae=vae, text_encoder=None, tokenizer=None, unet=unet, scheduler=scheduler,
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    return pipe.to(dtype=dtype)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=["float32", "bf16"], default="bf16")
    parser.add_argument("--resolution", type=int, default=512)
    parser.add_argument("--steps", type=int, default=5, help="num_inference_steps")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.manual_seed(0)
    with torch.no_grad():
        pipe = sd15_pipeline(dtype)
    prompt_embeds = torch.randn(1, 77, 768, dtype=dtype)
    negative_embeds = torch.randn(1, 77, 768, dtype=dtype)

    # The model is built in float32 and then cast: that transient peak is not the pipeline's.
    gc.collect()
    reset_peak_rss()
    step_ends, denoising_peak = [], 0.0
    start = time.perf_counter()

    def on_step_end(pipeline, step, timestep, callback_kwargs):
        nonlocal denoising_peak
        step_ends.append(time.perf_counter())
        denoising_peak = max(denoising_peak, peak_rss_gib())
        return callback_kwargs

    pipe(prompt_embeds=prompt_embeds, negative_prompt_embeds=negative_embeds, height=args.resolution,
         width=args.resolution, num_inference_steps=args.steps, guidance_scale=7.5, output_type="np",
         callback_on_step_end=on_step_end)
    end = time.perf_counter()
    steps = [b - a for a, b in zip([start] + step_ends, step_ends)]
    print(json.dumps({
        "pipeline": "diffusers StableDiffusionPipeline",
        "dtype": args.dtype,
        "resolution": args.resolution,
        "threads": args.threads,
        "s_per_step": statistics.median(steps[1:]),
        "step_seconds": steps,
        "vae_decode_and_postprocess_s": end - step_ends[-1],
        "peak_rss_gib": denoising_peak,
        "peak_rss_with_decode_gib": peak_rss_gib(),
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
