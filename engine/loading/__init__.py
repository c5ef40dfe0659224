"""Models from disk or the hub: the registry and loader (`models`), which backend runs a model
(`backends`), a GGUF file converted once (`gguf_conversion`) and the memory check before a load
(`preflight`)."""
