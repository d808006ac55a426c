"""Codecs: decode and encode, host (CPU) and device (GPU) side by side."""
