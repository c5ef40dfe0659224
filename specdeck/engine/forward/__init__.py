"""The target's forward and what it runs on: the KV cache (`kvcache`), the lean forward, the models
it runs, its cache and masks and its CUDA graphs (`llama_forward`, `llama_families`, `llama_cache`,
`attention_masks`, `graphed_steps`), its weights laid out for this machine
(`lean_weights`, `fused_layers`, `linear`, `gguf_blocks`, `gguf_index`), attention
(`row_attention`), SpecDeck's row kernel (`row_kernel`, `row_kernel.c`, built by `kernel_build`) and llama.cpp
(`llamacpp_backend`)."""
