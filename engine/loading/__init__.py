"""Models from disk or the hub: the registry and loader (`models`), which backend runs a model
(`backends`), on which device and dtype (`devices`), a GGUF file checked before it is read
(`gguf_checks`) and converted once (`gguf_conversion`), a Hugging Face id found or explained
(`hub`) and the memory check before a load (`preflight`)."""
