# SPDX-License-Identifier: BSD-3-Clause
"""Moving objects that drive refinement, and block/object intersection.

Object rows are miniAMR's 14 numbers: type, bounce, centre(3), move(3),
size(3), inc(3).  Types (as miniAMR's move.c):

  0  surface of a rectangle   1  solid rectangle
  2  surface of a spheroid    3  solid spheroid
  4..15  hemispheroids: even = surface, odd = solid; the half kept is
         +x (4,5) -x (6,7) +y (8,9) -y (10,11) +z (12,13) -z (14,15)
  20/22/24  surface of a cylinder along x/y/z, 21/23/25 solid cylinder

A rectangle with one size 0 is a plane (type 0 or 1 then marks the blocks
the plane cuts).  An object with a negative size is ignored.  A block is
refined when it intersects any object (the surface for surface types);
blocks are tested with their own extent (no ghost margin).
"""
import numpy as np


def move(objs, delta=1.0):
    """Advance the objects one time step (in place), as miniAMR's move()."""
    for ob in objs:
        cen, mv, size, inc = ob[2:5], ob[5:8], ob[8:11], ob[11:14]
        cen += delta * mv
        size += delta * inc
        for j in range(3):
            if ob[1] == 1:                       # centre bounces off the walls
                if cen[j] >= 1.0:
                    cen[j] = 2.0 - cen[j]
                    mv[j] = -mv[j]
                elif cen[j] <= 0.0:
                    cen[j] = -cen[j]
                    mv[j] = -mv[j]
            elif ob[1] == 2:                     # edge bounces off the walls
                if cen[j] + size[j] >= 1.0:
                    cen[j] -= cen[j] + size[j] - 1.0
                    mv[j] = -mv[j]
                elif cen[j] - size[j] <= 0.0:
                    cen[j] -= cen[j] - size[j]
                    mv[j] = -mv[j]


def _ell(d):
    return np.sum(d * d, axis=1)


def intersects(objs, lo, hi):
    """Bool (m,): does block [lo, hi] (m, 3 each) intersect any object?"""
    hit = np.zeros(len(lo), bool)
    for ob in objs:
        typ = int(ob[0])
        c, s = ob[2:5], ob[8:11]
        if np.any(s < 0.0):
            continue
        if typ in (0, 1):
            overlap = np.all((hi > c - s) & (lo < c + s), axis=1)
            if typ == 1:
                hit |= overlap
            else:
                inside = np.all((lo > c - s) & (hi < c + s), axis=1)
                hit |= overlap & ~inside
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            near = (np.clip(c, lo, hi) - c) / s       # nearest point of block
            far = (np.where(c < (lo + hi) / 2.0, hi, lo) - c) / s
        near = np.nan_to_num(near, nan=0.0, posinf=np.inf, neginf=np.inf)
        far = np.nan_to_num(far, nan=0.0, posinf=np.inf, neginf=np.inf)
        if 2 <= typ <= 15:
            h = _ell(near) < 1.0
            if typ % 2 == 0:
                h &= _ell(far) > 1.0
            if typ >= 4:
                d = (typ - 4) // 4
                if (typ // 2) % 2 == 0:      # 4,5 8,9 12,13: keep the + half
                    h &= ~(hi[:, d] < c[d])
                else:                        # 6,7 10,11 14,15: keep the - half
                    h &= ~(lo[:, d] > c[d])
            hit |= h
        else:                                    # cylinders 20..25
            ca = (typ - 20) // 2
            c1, c2 = [k for k in range(3) if k != ca]
            axial = (hi[:, ca] > c[ca] - s[ca]) & (lo[:, ca] < c[ca] + s[ca])
            n2 = near[:, c1] ** 2 + near[:, c2] ** 2
            if typ % 2 == 1:
                hit |= axial & (n2 < 1.0)
            else:
                f2 = far[:, c1] ** 2 + far[:, c2] ** 2
                caps = (lo[:, ca] < c[ca] - s[ca]) | (hi[:, ca] > c[ca] + s[ca])
                hit |= axial & (n2 < 1.0) & (caps | (f2 > 1.0))
    return hit
