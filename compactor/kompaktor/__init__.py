"""Kompaktor: external compactions for sorted key/value tables."""

__version__ = "0.2.0"
