"""Frees everything it makes: the 64 bytes _pyfini_noleak64 allocates go with its module."""
import _pyfini_noleak64  # noqa: F401
