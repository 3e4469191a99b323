"""Loses 64 bytes per import in every interpreter (_pyfini_leak64's exec slot)."""
import _pyfini_leak64  # noqa: F401
