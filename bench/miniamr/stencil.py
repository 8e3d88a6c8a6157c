# SPDX-License-Identifier: BSD-3-Clause
"""The averaging stencils, one vectorised expression over all blocks.

The additions are done in miniAMR's order, so each cell's result depends
only on its neighbours' values, never on how blocks are laid out.
"""
import numpy as np


def stencil7(A, s, e):
    """7-point average of variables S..E-1 of every block, in place."""
    a = A[s:e]
    c = a[:, :, 1:-1, 1:-1, 1:-1]
    w = np.add(a[:, :, :-2, 1:-1, 1:-1], a[:, :, 1:-1, :-2, 1:-1])
    w += a[:, :, 1:-1, 1:-1, :-2]
    w += c
    w += a[:, :, 1:-1, 1:-1, 2:]
    w += a[:, :, 1:-1, 2:, 1:-1]
    w += a[:, :, 2:, 1:-1, 1:-1]
    w /= 7.0
    c[...] = w


def stencil27(A, s, e):
    """27-point average (sums of the i-1, i and i+1 planes, then /27)."""
    a = A[s:e]
    nx, ny, nz = (n - 2 for n in a.shape[2:])
    planes = []
    for i in range(3):
        w = None
        for j in range(3):
            for k in range(3):
                v = a[:, :, i:i + nx, j:j + ny, k:k + nz]
                if w is None:
                    w = v.copy()
                else:
                    w += v
        planes.append(w)
    sb, sm, sf = planes
    sb += sm
    sb += sf
    sb /= 27.0
    a[:, :, 1:-1, 1:-1, 1:-1] = sb


def stencil(kind):
    return stencil7 if kind == 7 else stencil27
