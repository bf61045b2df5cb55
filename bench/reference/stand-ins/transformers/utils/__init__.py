WEIGHTS_NAME = "pytorch_model.bin"
SAFE_WEIGHTS_NAME = "model.safetensors"
FLAX_WEIGHTS_NAME = "flax_model.msgpack"
