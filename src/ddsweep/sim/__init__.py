"""The stand-in SGLang server (`ddsweep sim-server`): tokenizer, timing/acceptance model and HTTP layer."""
