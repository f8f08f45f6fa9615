"""Guards: the input contract, the output contract, and the formatting-only repair step."""

from .input import parse_chunks, validate_request
from .limits import Limits, load_limits, load_schema
from .output import check_output, parse_output
from .repair import repair_output

__all__ = [
    "Limits",
    "check_output",
    "load_limits",
    "load_schema",
    "parse_chunks",
    "parse_output",
    "repair_output",
    "validate_request",
]
