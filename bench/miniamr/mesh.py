# SPDX-License-Identifier: BSD-3-Clause
"""The block directory: ids, levels, positions, owners and neighbours.

Every rank keeps the same directory of all active (leaf) blocks, sorted by
block number.  A block at level L has integer position ``pos`` in a grid of
``nroot * 2**L`` blocks and the number (miniAMR's ``bp->number``)::

    start[L] + (pos_z * ny_L + pos_y) * nx_L + pos_x

It covers ``[pos, pos + 1) / (nroot * 2**L)`` of the unit cube.  The
directory is changed only by steps every rank performs identically (split,
coarsen, new owners from load balancing), so it stays replicated without
extra messages; the data of a block lives only on its owner.

Faces are numbered as in miniAMR: 0/1 = -x/+x, 2/3 = -y/+y, 4/5 = -z/+z.
A face neighbour is of one of four kinds: the domain boundary, a block at
the same level, a coarser block (one level up, the 2:1 rule allows no
more), or four finer blocks, indexed by quarter ``q = 2*q1 + q2`` where q1
and q2 are the finer blocks' position parities in the face's two
tangential dimensions (in increasing dimension order).
"""
import numpy as np

TANGENTS = ((1, 2), (0, 2), (0, 1))
BOUNDARY, SAME, COARSER, FINER = 0, 1, 2, 3

# child o of a parent sits at offset (o & 1, (o >> 1) & 1, o >> 2)
CHILD = np.stack([np.arange(8) & 1, (np.arange(8) >> 1) & 1,
                  np.arange(8) >> 2], axis=1).astype(np.int64)


class Mesh:
    """Replicated directory of the leaf blocks."""

    def __init__(self, nroot, num_refine):
        self.nroot = np.asarray(nroot, dtype=np.int64)
        self.num_refine = int(num_refine)
        n0 = int(np.prod(self.nroot))
        self.start = np.zeros(self.num_refine + 2, dtype=np.int64)
        for lev in range(self.num_refine + 1):
            self.start[lev + 1] = self.start[lev] + n0 * 8 ** lev
        self.key = np.zeros(0, np.int64)
        self.level = np.zeros(0, np.int64)
        self.pos = np.zeros((0, 3), np.int64)
        self.owner = np.zeros(0, np.int32)
        self._own = {}

    # -- construction -------------------------------------------------------
    @classmethod
    def initial(cls, o):
        """Level-0 blocks, rank (px, py, pz) owning init_x*init_y*init_z."""
        nroot = (o.npx * o.init_x, o.npy * o.init_y, o.npz * o.init_z)
        m = cls(nroot, o.num_refine)
        pos = np.indices(nroot).reshape(3, -1).T.astype(np.int64)
        pr = pos // np.array([o.init_x, o.init_y, o.init_z])
        owner = pr[:, 0] + o.npx * (pr[:, 1] + o.npy * pr[:, 2])
        m.set_blocks(np.zeros(len(pos), np.int64), pos, owner)
        return m

    def set_blocks(self, level, pos, owner):
        key = self.keys_for(level, pos)
        order = np.argsort(key, kind="stable")
        self.key = key[order]
        self.level = np.asarray(level, np.int64)[order]
        self.pos = np.asarray(pos, np.int64)[order]
        self.owner = np.asarray(owner, np.int32)[order]
        self._own = {}
        if np.any(np.diff(self.key) <= 0):
            raise RuntimeError("duplicate block in the directory")

    def set_owner(self, owner):
        self.owner = np.asarray(owner, np.int32).copy()
        self._own = {}

    # -- queries ------------------------------------------------------------
    def __len__(self):
        return len(self.key)

    def keys_for(self, level, pos):
        level = np.asarray(level, np.int64)
        pos = np.asarray(pos, np.int64)
        nx = self.nroot[0] << level
        ny = self.nroot[1] << level
        return self.start[level] + (pos[..., 2] * ny + pos[..., 1]) * nx \
            + pos[..., 0]

    def find(self, keys):
        """Directory index of each key, -1 where there is no such leaf."""
        keys = np.asarray(keys, np.int64)
        if len(self.key) == 0:
            return np.full(keys.shape, -1, np.int64)
        i = np.minimum(np.searchsorted(self.key, keys), len(self.key) - 1)
        return np.where(self.key[i] == keys, i, -1)

    def own(self, rank):
        """Directory indices of RANK's blocks, in block-number order."""
        r = self._own.get(rank)
        if r is None:
            r = self._own[rank] = np.flatnonzero(self.owner == rank)
        return r

    def counts_per_level(self, idx=None):
        lev = self.level if idx is None else self.level[idx]
        return np.bincount(lev, minlength=self.num_refine + 1).astype(np.int64)

    def extent(self, idx):
        """Lower and upper corners (unit cube) of blocks IDX, (m, 3) each."""
        n = (self.nroot[None, :] << self.level[idx][:, None]).astype(np.float64)
        p = self.pos[idx].astype(np.float64)
        return p / n, (p + 1.0) / n

    def centers(self, idx):
        """Integer centres as miniAMR's bp->cen: the finest block is 2 wide."""
        sz = np.int64(1) << (self.num_refine - self.level[idx])
        return (2 * self.pos[idx] + 1) * sz[:, None]

    def mesh_size(self):
        """Extent of the domain in centre units, per dimension."""
        return self.nroot << (self.num_refine + 1)

    def face_neighbors(self, idx, f):
        """Kind (m,) and neighbour directory indices (m, 4) across face F."""
        d, s = f >> 1, f & 1
        t1, t2 = TANGENTS[d]
        m = len(idx)
        kind = np.zeros(m, np.int8)
        nbr = np.full((m, 4), -1, np.int64)
        if m == 0:
            return kind, nbr
        lev = self.level[idx]
        p = self.pos[idx].copy()
        p[:, d] += 1 if s else -1
        inside = (p[:, d] >= 0) & (p[:, d] < (self.nroot[d] << lev))
        r = np.flatnonzero(inside)
        same = self.find(self.keys_for(lev[r], p[r]))
        hit = same >= 0
        kind[r[hit]] = SAME
        nbr[r[hit], 0] = same[hit]
        r = r[~hit]
        rc = r[lev[r] > 0]
        coarse = self.find(self.keys_for(lev[rc] - 1, p[rc] >> 1))
        hit = coarse >= 0
        kind[rc[hit]] = COARSER
        nbr[rc[hit], 0] = coarse[hit]
        r = np.setdiff1d(r, rc[hit], assume_unique=True)
        if len(r):
            base = 2 * p[r]
            base[:, d] += 0 if s else 1      # the children touching our face
            for q in range(4):
                pf = base.copy()
                pf[:, t1] += q >> 1
                pf[:, t2] += q & 1
                nbr[r, q] = self.find(self.keys_for(lev[r] + 1, pf))
            if np.any(nbr[r] < 0):
                raise RuntimeError("mesh violates the 2:1 rule across a face")
            kind[r] = FINER
        return kind, nbr

    def siblings(self, idx):
        """(m, 8) directory indices of each block's siblings (itself too).

        -1 where a sibling is not a leaf (or for level-0 blocks)."""
        lev = self.level[idx]
        out = np.full((len(idx), 8), -1, np.int64)
        r = np.flatnonzero(lev > 0)
        if len(r):
            par = (self.pos[idx[r]] >> 1) * 2
            sib = par[:, None, :] + CHILD[None, :, :]
            out[r] = self.find(self.keys_for(lev[r][:, None], sib))
        return out

    # -- changes --------------------------------------------------------------
    def refine_coarsen(self, split, groups, group_owner):
        """Split blocks SPLIT into 8 children (same owner); merge each row of
        GROUPS (8 sibling indices, child order) into its parent owned by
        GROUP_OWNER.  Returns the (level, pos) arrays of the new children and
        parents, for the caller to attach data to."""
        keep = np.ones(len(self.key), bool)
        keep[split] = False
        keep[groups.ravel()] = False
        c_lev = np.repeat(self.level[split] + 1, 8)
        c_pos = (2 * self.pos[split][:, None, :] + CHILD[None]).reshape(-1, 3)
        c_own = np.repeat(self.owner[split], 8)
        p_lev = self.level[groups[:, 0]] - 1 if len(groups) else \
            np.zeros(0, np.int64)
        p_pos = self.pos[groups[:, 0]] >> 1 if len(groups) else \
            np.zeros((0, 3), np.int64)
        self.set_blocks(
            np.concatenate([self.level[keep], c_lev, p_lev]),
            np.concatenate([self.pos[keep], c_pos, p_pos]),
            np.concatenate([self.owner[keep], c_own,
                            np.asarray(group_owner, np.int32)]))
        return (c_lev, c_pos), (p_lev, p_pos)
