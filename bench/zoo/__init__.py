"""Model-zoo workloads: a user's loop through the API and the same loop in plain DDP.

The data paths the loops and the scenarios agree on (``--data``, a scenario's
``data_paths``): ``loader`` (uint8 images or token windows made per sample in
DataLoader workers), ``jpeg`` (JPEG files decoded and augmented per sample in the
workers, ``zoo.jpeg``) and ``device`` (whole batches gathered on the device, no
workers).
"""

from hetero.core.errors import ConfigError

DATA_PATHS = ("loader", "jpeg", "device")
#: The paths whose samples DataLoader workers make (workers, jitter and input cost apply).
LOADER_PATHS = ("loader", "jpeg")


def parse_sides(spec: str) -> tuple[int, int]:
    """``MIN-MAX`` (pixels, e.g. ``320-480``) as a pair; ``ConfigError`` naming the flag."""
    try:
        low, high = (int(x) for x in spec.split("-"))
    except ValueError:
        raise ConfigError(
            f"--jpeg-sides: want MIN-MAX in pixels (e.g. 320-480), got {spec!r}"
        ) from None
    if not 16 <= low <= high <= 4096:
        raise ConfigError(f"--jpeg-sides: want 16 <= MIN <= MAX <= 4096, got {spec!r}")
    return low, high
