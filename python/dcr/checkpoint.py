"""Whole checkpoints: dcr.diff, dcr.apply and dcr.inspect, as `dcr diff/apply/inspect` do them.

Reports are dicts with the CLI's --json field names.
"""

from __future__ import annotations

import os

from . import _dcr


def diff(old, new, out, encoding="mixed", level=1, payload_records=1 << 21):
    """Writes a delta file `out` holding every element whose stored bits differ between the
    safetensors files `old` and `new` (same names, dtypes, shapes), with digests of both."""
    return _dcr._diff(os.fspath(old), os.fspath(new), os.fspath(out), encoding, level, payload_records)


def apply(delta, base, out=None, in_place=False):
    """Applies `delta` to `base` into `out`, or into `base` itself (crash-safe) with in_place.
    Refuses a base whose digests differ from the delta's and verifies every result digest."""
    if (out is None) == (not in_place):
        raise _dcr.InvalidArgument("dcr.apply: give exactly one of out=... and in_place=True")
    return _dcr._apply(os.fspath(delta), os.fspath(base), None if out is None else os.fspath(out))


def inspect(delta, base=None):
    """Validates a delta file (or an in-place journal) and describes it as `dcr inspect --json`
    does: digests, sizes, and every payload's items (by tensor id). A delta names no tensors
    (they are its base's), so "tensors" is None unless `base`, the safetensors file the delta
    applies to, is given: it is checked against the delta as apply checks it (tensors and
    header; dcr.RegistryMismatch or dcr.VerificationFailed for another file) and "tensors" lists
    every tensor by name with "changed" (whether any item writes it). A journal holds its base's
    header and always lists them."""
    return _dcr._inspect(os.fspath(delta), None if base is None else os.fspath(base))
