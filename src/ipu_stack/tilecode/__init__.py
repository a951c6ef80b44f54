"""Tile code: IPU21 instruction encodings, exchange rows, supervisor programs and tile images.

The encoder side (``isa_table``, ``encode``, ``exchange_rows``, ``supervisor``, ``images``)
turns a placed, scheduled program into per-tile memory images; the decoder (``decode``) is an
independent reading of the same encodings, written from the facts without sharing code.
"""
