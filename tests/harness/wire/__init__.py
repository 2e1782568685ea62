"""Tests of the wire: codec, stubs, quoting."""
