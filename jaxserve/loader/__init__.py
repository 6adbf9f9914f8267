"""Load Hugging Face checkpoints (config.json + safetensors) into jaxserve models, tensor by tensor."""
