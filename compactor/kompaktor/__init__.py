"""Kompaktor: external compactions for sorted key/value tables."""

__version__ = "0.3.0"
