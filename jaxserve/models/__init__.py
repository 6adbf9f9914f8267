"""Decoder-only language models (Flax NNX) built from Hugging Face `config.json` files."""
