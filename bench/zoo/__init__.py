"""Model-zoo workloads: a user's loop through the API and the same loop in plain DDP.

The data paths the loops and the scenarios agree on (``--data``, a scenario's
``data_paths``): ``loader`` (uint8 images or token windows made per sample in
DataLoader workers), ``jpeg`` (JPEG files decoded and augmented per sample in the
workers, ``zoo.jpeg``) and ``device`` (whole batches gathered on the device, no
workers).
"""

DATA_PATHS = ("loader", "jpeg", "device")
#: The paths whose samples DataLoader workers make (workers, jitter and input cost apply).
LOADER_PATHS = ("loader", "jpeg")
