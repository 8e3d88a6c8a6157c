# SPDX-License-Identifier: BSD-3-Clause
"""The data of a rank's blocks: one 5-D array, and block split/merge.

``A[var, slot, i, j, k]`` holds every variable of every local block, with
one ghost layer (``i`` in ``0 .. nx+1``; interior ``1 .. nx``).  Slots are
the rank's blocks in block-number order, as ``Mesh.own`` lists them, so
the stencil is one vectorised expression over the whole array.  Values are
amounts per cell (not densities): splitting gives each child cell 1/8 of
its parent cell, merging sums 8 child cells, so the total is conserved.
"""
import numpy as np

from .mesh import CHILD


class BlockStore:
    def __init__(self, num_vars, n3):
        self.nv = int(num_vars)
        self.n3 = tuple(int(n) for n in n3)
        self.shape3 = tuple(n + 2 for n in self.n3)
        self.keys = np.zeros(0, np.int64)
        self.A = np.zeros((self.nv, 0) + self.shape3)

    @property
    def nb(self):
        return len(self.keys)

    def interiors(self, slots):
        """Copy of the interiors of SLOTS, shape (nv, m, nx, ny, nz)."""
        return np.ascontiguousarray(self.A[:, slots, 1:-1, 1:-1, 1:-1])

    def slots_of(self, keys):
        s = np.searchsorted(self.keys, keys)
        if np.any(s >= len(self.keys)) or np.any(self.keys[np.minimum(
                s, max(len(self.keys) - 1, 0))] != keys):
            raise KeyError("block not held by this rank")
        return s

    def rebuild(self, new_keys, add_keys=(), add_data=None):
        """Hold exactly NEW_KEYS (sorted): keep the blocks we have, take
        the interiors of ADD_KEYS from ADD_DATA (nv, m, nx, ny, nz)."""
        new_keys = np.asarray(new_keys, np.int64)
        A = np.zeros((self.nv, len(new_keys)) + self.shape3)
        have = np.zeros(len(new_keys), bool)
        if len(self.keys) and len(new_keys):
            i = np.minimum(np.searchsorted(self.keys, new_keys),
                           len(self.keys) - 1)
            keep = self.keys[i] == new_keys
            A[:, keep] = self.A[:, i[keep]]
            have |= keep
        add_keys = np.asarray(add_keys, np.int64)
        if len(add_keys):
            j = np.searchsorted(new_keys, add_keys)
            if np.any(have[j]) or np.any(new_keys[j] != add_keys):
                raise RuntimeError("added block clashes or is not wanted")
            A[:, j, 1:-1, 1:-1, 1:-1] = add_data
            have[j] = True
        if not np.all(have):
            raise RuntimeError("a block of this rank has no data")
        self.keys = new_keys
        self.A = A


def initial_values(o, keys, num_vars, n3):
    """Uniform [0, 1) values, a function of the block number only, so the
    initial field does not depend on the decomposition."""
    out = np.empty((num_vars, len(keys)) + tuple(n3))
    for b, k in enumerate(np.asarray(keys).tolist()):
        rng = np.random.default_rng([o.seed, k])
        out[:, b] = rng.random((num_vars,) + tuple(n3))
    return out


def split_data(P):
    """Children of parents P (nv, m, nx, ny, nz) -> (nv, m*8, nx, ny, nz),
    children of each parent in child order (x fastest)."""
    nv, m, nx, ny, nz = P.shape
    hx, hy, hz = nx // 2, ny // 2, nz // 2
    eighth = P / 8.0
    out = np.empty((nv, m, 8, nx, ny, nz))
    for o, (a, b, c) in enumerate(CHILD.tolist()):
        sub = eighth[:, :, a * hx:(a + 1) * hx, b * hy:(b + 1) * hy,
                     c * hz:(c + 1) * hz]
        out[:, :, o] = sub.repeat(2, axis=2).repeat(2, axis=3).repeat(2, axis=4)
    return out.reshape(nv, m * 8, nx, ny, nz)


def merge_data(C):
    """Parents of children C (nv, m, 8, nx, ny, nz) -> (nv, m, nx, ny, nz):
    each parent cell is the sum of its 8 child cells, in a fixed order."""
    nv, m, _, nx, ny, nz = C.shape
    hx, hy, hz = nx // 2, ny // 2, nz // 2
    out = np.empty((nv, m, nx, ny, nz))
    for o, (a, b, c) in enumerate(CHILD.tolist()):
        ch = C[:, :, o]
        s = ch[..., 0::2, 0::2, 0::2].copy()
        for (i, j, k) in CHILD[1:].tolist():
            s += ch[..., i::2, j::2, k::2]
        out[:, :, a * hx:(a + 1) * hx, b * hy:(b + 1) * hy,
            c * hz:(c + 1) * hz] = s
    return out
