# SPDX-License-Identifier: BSD-3-Clause
"""Checksums: per-variable sums over all blocks, one Allreduce of doubles.

As miniAMR's check_sum.c, the sum of every variable over all cells of all
blocks is reduced with MPI_SUM over the world communicator (one Allreduce
of as many doubles as there are variables in the group) and compared with
the previous checksum: ``abs(sum - prev) / prev > tol`` is an error.

Exactness.  Floating-point addition is not associative, and xhc's
reduction tree adds in another order than Open MPI's, so a plain SUM of
per-rank partial sums would differ in the last bits between ``--coll``
modes (and between rank counts).  Instead each block's sum (a numpy
reduction over that block alone, hence independent of the decomposition)
is rounded to a multiple of ``2**-e`` and the rank's partial sum is the
sum of those integers, still a double.  ``e`` is chosen from a bound on
the total (every value starts in [0, 1) and the stencils, splits and
merges conserve the total of non-negative amounts), so every partial and
global sum is an integer below 2**53: exact in any order of addition.
The checksum is thus bit-identical across collective modes, reduction
algorithms and rank counts, so the run's final checksum, taken over the
collective communicator and over the plain one, must match bit for bit
(a tolerance would let a reduction that is slightly wrong pass: the
stencil conserves the sum, so each check only compares a checksum with
the previous one).  Its rounding error is below
``(number of blocks) * 2**-e``, about 1e-13 of the total for the problems
here, far inside the 1e-8 tolerance.
"""
import math

import numpy as np

EXACT_LIMIT = 2.0 ** 53


def scale_exponent(level0_cells, max_value=1.0):
    """``e`` such that the scaled total stays below 2**51 (4x headroom)."""
    bound = max(level0_cells * max_value, 1.0)
    return 51 - math.ceil(math.log2(bound))


def block_sums(A, s, e):
    """(nvg, nb) sums of the interior of each block, block by block."""
    a = A[s:e, :, 1:-1, 1:-1, 1:-1]
    nvg, nb = a.shape[:2]
    if nb == 0:
        return np.zeros((nvg, 0))
    return np.ascontiguousarray(a).reshape(nvg, nb, -1).sum(axis=2)


def local_scaled(A, s, e, scale):
    """This rank's partial sums, integer-valued doubles (times SCALE)."""
    return np.rint(block_sums(A, s, e) * scale).sum(axis=1)


def global_checksum(world, A, s, e, exponent, op_sum, part=None, total=None):
    """Checksums of variables S..E-1: one Allreduce of E-S doubles
    (PART and TOTAL, if given, are the reused send/receive buffers).

    TOTAL is filled with NaN first: a reused buffer still holds the last
    checksum, which the stencil conserves, so an Allreduce that left it
    as it was would pass :func:`compare`; NaN fails it."""
    scale = 2.0 ** exponent
    if part is None:
        part, total = np.empty(e - s), np.empty(e - s)
    part[...] = local_scaled(A, s, e, scale)
    total.fill(np.nan)
    world.Allreduce(part, total, op=op_sum)
    if np.any(np.abs(total) >= EXACT_LIMIT):
        raise ArithmeticError("checksum exceeds the exact range; "
                              "lower the scale exponent")
    return total * (1.0 / scale)


def compare(new, old, tol):
    """Variables whose checksum moved by more than TOL, relatively.

    Returns a list of (var, new, old, relative difference)."""
    new = np.asarray(new, np.float64)
    old = np.asarray(old, np.float64)
    den = np.where(old != 0.0, np.abs(old), 1.0)
    rel = np.abs(new - old) / den
    bad = np.flatnonzero(~(rel <= tol))          # NaN counts as bad
    return [(int(v), float(new[v]), float(old[v]), float(rel[v]))
            for v in bad]
