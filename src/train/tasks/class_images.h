// DreamBooth's class images as diffusers' examples/dreambooth/train_dreambooth.py makes them before training: when
// --class_data_dir holds fewer than --num_class_images images, the pretrained pipeline, loaded for this in
// --prior_generation_precision, generates the rest from --class_prompt, --sample_batch_size at a time, with its own
// scheduler, 50 steps, guidance 7.5 and its default size, and saves each as "<index>-<SHA-1 of its RGB pixels>.jpg"
// (JPEG quality 75, as PIL saves it).
#pragma once
#include <cstdint>

#include "data/dreambooth_images.h"
#include "dist/communicator.h"
#include "pipeline/model_source.h"

namespace sd::train {

// Generates the missing class images, in `run_dtype` (the frozen models' under --mixed_precision) unless
// --prior_generation_precision says otherwise. The folder's image i is drawn from seed + i, so a run
// is reproducible and no two images share a draw. With several ranks each generates every world-th batch, then all
// wait for all (the batches are the same size, so no rank waits long). Throws sd::Error if the folder cannot be
// created or written.
void generate_missing_class_images(const pipeline::ModelSource& model, const data::DreamBoothDataOptions& options,
                                   at::ScalarType run_dtype, uint64_t seed, dist::Communicator& comm);

}  // namespace sd::train
