"""The target's forward and what it runs on: the KV cache (`kvcache`), the lean forward and its
CUDA graphs (`llama_forward`, `graphed_steps`), its weights laid out for this machine
(`lean_weights`, `fused_layers`, `linear`, `gguf_blocks`, `gguf_index`), attention
(`row_attention`), SpecDeck's row kernel (`row_kernel`, `row_kernel.c`, built by `kernel_build`) and llama.cpp
(`llamacpp_backend`)."""
