"""zrt-ascend: Huawei Ascend hardware for zrt (910B, 910C, the CloudMatrix384 supernode).

Installing the distribution registers the ``zrt_ascend`` entry point in the ``zrt`` group;
``zrt hw list`` then shows its hardware. The specs live in ``zrt_ascend/hardware/``, one
file per id, every figure with its source in a comment. A 910C is modelled per die, the
unit CANN exposes as a device.
"""

__version__ = "0.1.0"
