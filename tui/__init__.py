"""hetero-top, the terminal UI."""
