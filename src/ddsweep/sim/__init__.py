"""The stand-in SGLang server (`ddsweep sim-server`): tokenizer, timing/acceptance model, HTTP layer, answers.

May import any stage below it (`storage`, `config`, `bench`, `coding`). Imported by nothing but the CLI entry
point and the tests: no real code path may reach the stand-in.
"""
