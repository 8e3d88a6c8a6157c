# SPDX-License-Identifier: BSD-3-Clause
"""bench.miniamr's 2:1 loops against the rules applied globally, in-process.

refine_level goes level by level, as miniAMR does, through two loops per
level; the marks it ends with must be the fixed point of the 2:1 rules over
the whole mesh, found here by plain sweeps until nothing changes, and the
mesh they make must satisfy the rule.  Random marks on random meshes, one
rank, no MPI (the Allreduces of one rank copy, whatever the op).  That the
ranks of a real run agree, and with a serial run, is test_miniamr's part.
Loop 2 alone changes no final mark (loop 1 keeps any block next to a finer
one), so a hand-made mesh tests it by itself.
"""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.miniamr import refine  # noqa: E402
from bench.miniamr.mesh import FINER, SAME, Mesh  # noqa: E402


class OneRank:
    """What refine_level needs of a run, for one rank."""

    rank, size = 0, 1

    def __init__(self, mesh):
        self.mesh, self.world, self.allreduces = mesh, self, 0
        self._bufs = {}

    def Allreduce(self, a, b, op):
        self.allreduces += 1
        b[...] = a

    def bufs(self, key, n, dtype=np.float64):
        b = self._bufs.get(key)
        if b is None or b[0].shape != (n,) or b[0].dtype != dtype:
            b = self._bufs[key] = (np.zeros(n, dtype), np.zeros(n, dtype))
        return b


def fixed_point(mesh, x):
    """The 2:1 rules over all blocks at once, swept until nothing moves."""
    x = x.copy()
    idx = np.arange(len(mesh))
    sib = mesh.siblings(idx)
    faces = [mesh.face_neighbors(idx, f) for f in range(6)]
    while True:
        old = x.copy()
        for b in idx:
            sibs_ok = mesh.level[b] > 0 and np.all(sib[b] >= 0) \
                and np.all(old[sib[b]] == -1)
            for kind, nbr in faces:
                if kind[b] == FINER:
                    sibs_ok = False
                    if np.any(old[nbr[b]] == 1):
                        x[b] = 1
                elif kind[b] == SAME and old[nbr[b, 0]] == 1:
                    sibs_ok = False
            if x[b] == -1 and not sibs_ok:
                x[b] = 0
        if np.array_equal(x, old):
            return x


def random_marks(rng, mesh, top):
    """As objects do: refine what meets a random box, coarsen the rest, and
    keep a few blocks at random."""
    lo, hi = mesh.extent(np.arange(len(mesh)))
    a = rng.uniform(0, 1, 3)
    b = np.minimum(a + rng.uniform(0.05, 0.5, 3), 1)
    meets = np.all((lo < b) & (hi > a), axis=1)
    x = np.where(meets, 1, -1).astype(np.int32)
    x[rng.uniform(size=len(x)) < 0.03] = 0
    x[(x == -1) & (mesh.level == 0)] = 0
    x[(x == 1) & (mesh.level >= top)] = 0
    return x


def apply(mesh, marks):
    split = np.flatnonzero(marks == 1)
    groups = refine._merge_groups(mesh, marks)
    mesh.refine_coarsen(split, groups, np.zeros(len(groups), np.int32))


@pytest.mark.parametrize("seed", range(12))
def test_levels_reach_the_global_fixed_point(seed):
    rng = np.random.default_rng(seed)
    top = 3
    mesh = Mesh((2, 2, 1 + seed % 2), top)
    n0 = int(np.prod(mesh.nroot))
    mesh.set_blocks(np.zeros(n0, np.int64),
                    np.indices(mesh.nroot).reshape(3, -1).T,
                    np.zeros(n0, np.int32))
    levels_seen, merged = set(), 0
    for _ in range(8):
        run = OneRank(mesh)
        own = mesh.own(0)
        x0 = random_marks(rng, mesh, top)
        marks, rounds = refine.refine_level(run, own, x0)
        assert np.array_equal(marks, fixed_point(mesh, x0))
        # one change count per round, one sync of the marks up front and
        # after every round but the last of each loop
        loops = 2 * (int(mesh.level.max()) + 1)
        assert run.allreduces == 1 + rounds + (rounds - loops)
        merged += len(refine._merge_groups(mesh, marks))
        apply(mesh, marks)
        for f in range(6):  # raises if the new mesh breaks the 2:1 rule
            mesh.face_neighbors(np.arange(len(mesh)), f)
        levels_seen.update(mesh.level.tolist())
    assert len(levels_seen) >= 3 and merged > 0


def test_a_coarser_neighbour_of_a_block_that_stays_stays():
    """Loop 2 alone: at level 2, the level-1 blocks facing a level-2 block
    marked to stay may not coarsen; the other level-1 blocks may."""
    mesh = Mesh((2, 1, 1), 2)
    mesh.set_blocks(np.zeros(2, np.int64), np.array([[0, 0, 0], [1, 0, 0]]),
                    np.zeros(2, np.int32))
    none = np.zeros((0, 8), np.int64)
    mesh.refine_coarsen(np.array([0]), none, np.zeros(0, np.int32))
    first = mesh.find(mesh.keys_for(np.array([1]), np.array([[0, 0, 0]])))
    mesh.refine_coarsen(first, none, np.zeros(0, np.int32))
    own = mesh.own(0)
    F = np.where(mesh.level == 1, -1, 0).astype(np.int32)
    x = refine._coarser_stays(F, own, refine._tables(mesh, own),
                              mesh.level[own] == 2, mesh.level[own] == 1)
    facing = {(1, 0, 0), (0, 1, 0), (0, 0, 1)}
    for b in np.flatnonzero(mesh.level == 1):
        want = 0 if tuple(mesh.pos[b]) in facing else -1
        assert x[b] == want, (mesh.pos[b], x[b])
