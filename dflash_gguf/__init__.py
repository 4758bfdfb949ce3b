"""dflash-gguf: DFlash block-diffusion speculative decoding for GGUF models on llama.cpp."""

__version__ = "0.1.0"
