"""Measured kernel-time tables shipped by hardware plugins (CSV package data)."""

from __future__ import annotations

from attrs import frozen


@frozen
class MeasuredTable:
    """One CSV of measured kernel times for one hardware id.

    :param name: unique table name (``nvidia_h100_sxm/gemm``).
    :param hardware_id: the hardware the times were measured on.
    :param path: the CSV file.
    :param description: how and where it was measured.
    """

    name: str
    hardware_id: str
    path: str
    description: str = ""
