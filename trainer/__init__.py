"""The library inside every training process."""
