# SPDX-License-Identifier: BSD-3-Clause
"""Ghost-cell exchange between blocks (miniAMR's comm.c, --code 0).

Three phases, x then y then z (rotated per stage with --permute).  In each
phase a rank posts one nonblocking receive and one nonblocking send per
partner rank (all faces to/from that rank bundled into one buffer, tag =
direction), does the copies between its own blocks and the reflective
boundary copies while the messages fly, then waits and unpacks.

Faces between levels follow miniAMR: a coarse ghost cell receives the sum
of the 2x2 fine face cells next to it; each fine ghost cell receives 1/4
of the coarse face cell next to it (values are amounts per cell).  The
sender does the arithmetic (sum, or /4 of one value per coarse cell that
the receiver spreads over 2x2 ghosts), in the same order as the on-rank
copy does, so results do not depend on which rank holds which block.

With the 27-point stencil, same-level faces and boundary faces also carry
the ghost lines of the phases already done, which fills edge and corner
ghosts; faces between levels do not (as miniAMR: the 27-point stencil does
not conserve the sum across levels).

The plan (flat indices into ``A[var-group].reshape(nvg, -1)``) is rebuilt
from the replicated directory after every mesh change.  Links between a
pair of ranks are ordered by (type, receiving block, face, sending block)
on both sides, so no index lists are exchanged.
"""
import functools

import numpy as np
from mpi4py import MPI

from .mesh import BOUNDARY, COARSER, FINER, SAME, TANGENTS

# link types, named from the receiving block's side
T_SAME, T_F2C, T_C2F = 0, 1, 2


def _plane(stride, d, idx, r1, r2):
    """Offsets of plane IDX of dimension D over tangential ranges R1, R2
    (the two other dimensions in increasing order), R1-major."""
    t1, t2 = TANGENTS[d]
    return (idx * stride[d] + r1[:, None] * stride[t1]
            + r2[None, :] * stride[t2]).ravel().astype(np.int64)


class _Patterns:
    """Cell offsets (within one block) of every face operation."""

    def __init__(self, n3, stencil):
        N = np.array(n3)
        X, Y, Z = N + 2
        self.BS = int(X * Y * Z)
        stride = (int(Y * Z), int(Z), 1)
        H = N // 2
        self.same_dst, self.same_src, self.bc_src = {}, {}, {}
        self.f2c_dst, self.f2c_src4 = {}, {}
        self.c2f_dst, self.c2f_src, self.c2f_rep, self.qoff = {}, {}, {}, {}
        ext = stencil == 27
        for rf in range(6):
            d, s = rf >> 1, rf & 1
            t1, t2 = TANGENTS[d]
            g = 0 if s == 0 else N[d] + 1          # receiver's ghost plane
            h = N[d] if s == 0 else 1              # sender's plane next to it
            inner = 1 if s == 0 else N[d]          # boundary: own next plane
            plane = functools.partial(_plane, stride, d)
            r1, r2 = (np.arange(0, N[t] + 2) if ext and t < d
                      else np.arange(1, N[t] + 1) for t in (t1, t2))
            self.same_dst[rf] = plane(g, r1, r2)
            self.same_src[rf] = plane(h, r1, r2)
            self.bc_src[rf] = plane(inner, r1, r2)
            f1, f2 = np.arange(1, N[t1] + 1), np.arange(1, N[t2] + 1)
            q1, q2 = np.arange(1, H[t1] + 1), np.arange(1, H[t2] + 1)
            self.f2c_dst[rf] = plane(g, q1, q2)
            self.f2c_src4[rf] = np.stack([
                plane(h, 2 * q1 - 1 + e1, 2 * q2 - 1 + e2)
                for e1, e2 in ((0, 0), (0, 1), (1, 0), (1, 1))])   # (4, k)
            self.c2f_dst[rf] = plane(g, f1, f2)
            self.c2f_src[rf] = plane(h, q1, q2)
            self.c2f_rep[rf] = (((f1 - 1) // 2)[:, None] * H[t2]
                                + ((f2 - 1) // 2)[None, :]).ravel()
            self.qoff[rf] = np.array(
                [(q >> 1) * H[t1] * stride[t1] + (q & 1) * H[t2] * stride[t2]
                 for q in range(4)], dtype=np.int64)


class _Partner:
    __slots__ = (
        "r_bsel",
        "r_dst",
        "rank",
        "rlen",
        "s_copy",
        "s_quarter",
        "s_sum",
        "slen",
    )


class _Phase:
    __slots__ = (
        "c2f_dst",
        "c2f_src",
        "copy_dst",
        "copy_src",
        "f2c_dst",
        "f2c_src",
        "n_local",
        "n_remote",
        "partners",
    )


def _cat(chunks):
    if not chunks:
        return np.zeros(0, np.int64)
    return np.concatenate(chunks)


class _Planner:
    """One rank's ghost-exchange plan, collected face by face.

    ``loc[d]`` holds the on-rank copies of phase D (flat index chunks);
    ``remote[d][(partner, "s"|"r", type)]`` the links with other ranks, as
    lists of (keys, index matrices) that are sorted by key afterwards.
    """

    def __init__(self, pat, mesh, rank):
        self.P, self.mesh, self.rank = pat, mesh, rank
        self.own = mesh.own(rank)
        self.n = len(mesh)
        self.slot = np.full(self.n, -1, np.int64)
        self.slot[self.own] = np.arange(len(self.own))
        self.loc = [{k: [] for k in ("copy_dst", "copy_src", "f2c_dst",
                                     "f2c_src", "c2f_dst", "c2f_src")}
                    for _ in range(3)]
        self.remote = [{} for _ in range(3)]
        self.stats = dict.fromkeys(("local", "remote", "boundary",
                                    "interlevel", "interlevel_remote"), 0)

    def idx(self, slots, qoff, pat):
        if not len(slots):
            return np.zeros((0, len(pat)), np.int64)
        return (slots[:, None] * self.P.BS + np.asarray(qoff)[..., None]
                + pat[None, :])

    def idx4(self, slots, pat4):          # -> (m, 4, k)
        return slots[:, None, None] * self.P.BS + pat4[None, :, :]

    def face(self, f):
        """Plan face F of every block of this rank."""
        kind, nbr = self.mesh.face_neighbors(self.own, f)
        r = np.flatnonzero(kind == BOUNDARY)       # reflect
        self.local(f, "copy", self.idx(r, 0, self.P.same_dst[f]),
                   self.idx(r, 0, self.P.bc_src[f]))
        self.stats["boundary"] += len(r)
        r = np.flatnonzero(kind == SAME)
        self.same(f, r, nbr[r, 0])
        r = np.flatnonzero(kind == COARSER)
        self.fine_side(f, r, nbr[r, 0])
        r = np.flatnonzero(kind == FINER)
        for q in range(4):
            self.coarse_side(f, q, r, nbr[r, q])

    def local(self, f, what, dst, src):
        L = self.loc[f >> 1]
        L[what + "_dst"].append(dst.ravel())
        L[what + "_src"].append(src if what == "f2c" else src.ravel())

    def split(self, r, nb):
        """Blocks R with neighbours NB: which neighbours are on this rank,
        and the blocks and neighbours that are not."""
        here = self.mesh.owner[nb] == self.rank
        self.stats["local"] += int(here.sum())
        self.stats["remote"] += int(len(r) - here.sum())
        return here, r[~here], nb[~here]

    def links(self, f, rr, nn, recv, send):
        """Links of face F between my blocks RR and remote neighbours NN:
        RECV and SEND are (link type, index matrix)."""
        d, mine = f >> 1, self.own[rr]
        n, owner = self.n, self.mesh.owner[nn]
        for side, (typ, mats), (a, rf, b) in (("r", recv, (mine, f, nn)),
                                              ("s", send, (nn, f ^ 1, mine))):
            keys = ((typ * n + a) * 6 + rf) * n + b
            for p in np.unique(owner).tolist():
                sel = owner == p
                self.remote[d].setdefault((p, side, typ), []).append(
                    (keys[sel], mats[sel]))

    def same(self, f, r, nb):
        P = self.P
        here, rr, nn = self.split(r, nb)
        self.local(f, "copy", self.idx(r[here], 0, P.same_dst[f]),
                   self.idx(self.slot[nb[here]], 0, P.same_src[f]))
        self.links(f, rr, nn, (T_SAME, self.idx(rr, 0, P.same_dst[f])),
                   (T_SAME, self.idx(rr, 0, P.same_src[f ^ 1])))

    def fine_side(self, f, r, nb):
        """Blocks R are the fine side of face F; NB their coarse neighbour."""
        P = self.P
        t1, t2 = TANGENTS[f >> 1]
        pos = self.mesh.pos[self.own[r]]
        myq = (pos[:, t1] & 1) * 2 + (pos[:, t2] & 1)
        here, rr, nn = self.split(r, nb)
        self.local(f, "c2f", self.idx(r[here], 0, P.c2f_dst[f]),
                   self.idx(self.slot[nb[here]], P.qoff[f][myq[here]],
                            P.c2f_src[f][P.c2f_rep[f]]))
        self.links(f, rr, nn, (T_C2F, self.idx(rr, 0, P.c2f_dst[f])),
                   (T_F2C, self.idx4(rr, P.f2c_src4[f ^ 1])))
        self.interlevel(r, rr)

    def coarse_side(self, f, q, r, nb):
        """Blocks R are the coarse side of face F; NB their quarter-Q
        fine neighbour."""
        P = self.P
        here, rr, nn = self.split(r, nb)
        self.local(f, "f2c", self.idx(r[here], P.qoff[f][q], P.f2c_dst[f]),
                   self.idx4(self.slot[nb[here]], P.f2c_src4[f]))
        self.links(f, rr, nn,
                   (T_F2C, self.idx(rr, P.qoff[f][q], P.f2c_dst[f])),
                   (T_C2F, self.idx(rr, P.qoff[f ^ 1][q], P.c2f_src[f ^ 1])))
        self.interlevel(r, rr)

    def interlevel(self, r, rr):
        self.stats["interlevel"] += len(r)
        self.stats["interlevel_remote"] += len(rr)


class GhostExchange:
    """Plan and perform the ghost-cell exchange of one rank."""

    def __init__(self, n3, stencil, p2p):
        self.pat = _Patterns(n3, stencil)
        self.p2p = p2p
        self.phases = []
        self.links = {}

    # -- planning -------------------------------------------------------------
    def build(self, mesh, rank):
        plan = _Planner(self.pat, mesh, rank)
        for f in range(6):
            plan.face(f)
        self.phases = [self._phase(plan, d) for d in range(3)]
        self.links = plan.stats

    def _phase(self, plan, d):
        L = plan.loc[d]
        ph = _Phase()
        ph.copy_dst = _cat(L["copy_dst"])
        ph.copy_src = _cat(L["copy_src"])
        ph.c2f_dst = _cat(L["c2f_dst"])
        ph.c2f_src = _cat(L["c2f_src"])
        ph.f2c_dst = _cat(L["f2c_dst"])
        f2c = [m for m in L["f2c_src"] if len(m)]
        ph.f2c_src = (np.concatenate(f2c).transpose(1, 0, 2).ravel()
                      if f2c else np.zeros(0, np.int64))
        ph.partners = [self._partner(p, plan.remote[d], self.pat, d)
                       for p in sorted({k[0] for k in plan.remote[d]})]
        ph.n_local = len(ph.copy_dst) + len(ph.c2f_dst) + len(ph.f2c_dst)
        ph.n_remote = sum(pr.rlen for pr in ph.partners)
        return ph

    @staticmethod
    def _sorted(chunks):
        keys = np.concatenate([c[0] for c in chunks])
        mats = np.concatenate([c[1] for c in chunks])
        order = np.argsort(keys, kind="stable")
        return mats[order]

    def _partner(self, p, rem, P, d):
        pr = _Partner()
        pr.rank = p
        get = rem.get
        # send side: [same copies][sums of 4 fine][coarse values / 4]
        c = get((p, "s", T_SAME))
        pr.s_copy = self._sorted(c).ravel() if c else np.zeros(0, np.int64)
        c = get((p, "s", T_F2C))
        if c:
            m = self._sorted(c)                        # (L, 4, k)
            pr.s_sum = m.transpose(1, 0, 2).ravel()    # (4, L*k)
        else:
            pr.s_sum = np.zeros(0, np.int64)
        c = get((p, "s", T_C2F))
        pr.s_quarter = self._sorted(c).ravel() if c else np.zeros(0, np.int64)
        pr.slen = len(pr.s_copy) + len(pr.s_sum) // 4 + len(pr.s_quarter)
        # receive side, same order: copies, sums (copied), spread quarters
        dst, bsel, base = [], [], 0
        for typ in (T_SAME, T_F2C):
            c = get((p, "r", typ))
            if c:
                m = self._sorted(c).ravel()
                dst.append(m)
                bsel.append(base + np.arange(len(m)))
                base += len(m)
        c = get((p, "r", T_C2F))
        if c:
            m = self._sorted(c)                        # (L, N1*N2)
            rep = P.c2f_rep[2 * d]
            k = int(rep.max()) + 1
            dst.append(m.ravel())
            bsel.append((base + np.arange(len(m))[:, None] * k
                         + rep[None, :]).ravel())
            base += len(m) * k
        pr.r_dst = _cat(dst)
        pr.r_bsel = _cat(bsel)
        pr.rlen = base
        return pr

    def partner_counts(self):
        """miniAMR's comm partner statistics: x, y, z, total, unique."""
        per = [len(ph.partners) for ph in self.phases]
        uniq = len({pr.rank for ph in self.phases for pr in ph.partners})
        return per + [sum(per), uniq]

    # -- exchange ---------------------------------------------------------------
    def exchange(self, A, s, e, order=(0, 1, 2)):
        """Fill the ghost cells of variables S..E-1 of every local block."""
        nvg = e - s
        V = A[s:e].reshape(nvg, -1)
        p2p = self.p2p
        for d in order:
            ph = self.phases[d]
            rreq, rbuf = [], []
            for pr in ph.partners:
                if pr.rlen:
                    b = np.empty((nvg, pr.rlen))
                    rbuf.append(b)
                    rreq.append(p2p.Irecv(b, source=pr.rank, tag=d))
            sreq, sbuf = [], []
            for pr in ph.partners:
                if not pr.slen:
                    continue
                parts = []
                if len(pr.s_copy):
                    parts.append(V[:, pr.s_copy])
                if len(pr.s_sum):
                    g = V[:, pr.s_sum].reshape(nvg, 4, -1)
                    t = g[:, 0] + g[:, 1]
                    t += g[:, 2]
                    t += g[:, 3]
                    parts.append(t)
                if len(pr.s_quarter):
                    parts.append(V[:, pr.s_quarter] * 0.25)
                # fancy indexing along axis 1 may return Fortran order
                b = np.ascontiguousarray(parts[0] if len(parts) == 1 else
                                         np.concatenate(parts, axis=1))
                sbuf.append(b)
                sreq.append(p2p.Isend(b, dest=pr.rank, tag=d))
            # on-rank copies and boundary conditions while messages fly
            if len(ph.copy_dst):
                V[:, ph.copy_dst] = V[:, ph.copy_src]
            if len(ph.f2c_dst):
                g = V[:, ph.f2c_src].reshape(nvg, 4, -1)
                t = g[:, 0] + g[:, 1]
                t += g[:, 2]
                t += g[:, 3]
                V[:, ph.f2c_dst] = t
            if len(ph.c2f_dst):
                V[:, ph.c2f_dst] = V[:, ph.c2f_src] * 0.25
            if rreq:
                MPI.Request.Waitall(rreq)
                i = 0
                for pr in ph.partners:
                    if pr.rlen:
                        V[:, pr.r_dst] = rbuf[i][:, pr.r_bsel]
                        i += 1
            if sreq:
                MPI.Request.Waitall(sreq)
