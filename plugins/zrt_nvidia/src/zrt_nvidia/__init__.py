"""zrt-nvidia: NVIDIA hardware for zrt (A100 to GB300 NVL72), as YAML specs.

Installing the distribution registers the ``zrt_nvidia`` entry point in the ``zrt`` group;
``zrt hw list`` then shows its hardware. The specs live in ``zrt_nvidia/hardware/``, one
file per id, every figure with its source in a comment.
"""

__version__ = "0.1.0"
