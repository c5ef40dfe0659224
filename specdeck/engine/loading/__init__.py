"""Models from disk or the hub: the registry and loader (`models`), which backend runs a model
(`backends`), on which device and dtype (`devices`), a GGUF file's header read (`gguf_header`) for
the checks before it is read (`gguf_checks`) and the model it holds (`identity`), the file converted
once (`gguf_conversion`), a Hugging Face id found or explained
(`hub`) and the memory check before a load (`preflight`)."""
