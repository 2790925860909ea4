"""ddsweep: reproducible sweeps of DDTree speculative decoding on SGLang servers."""

__version__ = "0.1.0"
